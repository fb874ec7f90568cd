"""Snapshot ensembles from one training run: each epoch's best model (by validation AUC), averaged in logits.

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/results/planted_seeds/snapshots.py SEED|DATASET [MODEL]

A probe, not a feature: it wraps the trainer's validation scoring so that every evaluation also scores the
test mapping, trains MODEL (default dlrm) with its defaults on build/accuracy/planted-360k-sSEED (made by
planted_seeds.py) or the dataset directory given, and prints each epoch's best evaluation and the ensembles of the k epochs with the best
validation AUC. With the table redraws (`--reinit-embeddings auto`) the epochs' models have different tables.
"""

import sys
from pathlib import Path

import numpy as np
import torch

from ctrkit.bench.accuracy import splits
from ctrkit.eval.metrics import roc_auc
from ctrkit.train import trainer
from ctrkit.train.run import train

records = []
score_validation = trainer.Trainer._score_validation


def scored(self):
    metrics, logits = score_validation(self)
    test = self._logits(self.test_set)
    records.append((self.step, self.steps_per_epoch, metrics["auc"], np.asarray(logits, np.float64),
                    np.asarray(test, np.float64)))  # fmt: skip
    return metrics, logits


def main() -> None:
    seed, model = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "dlrm"
    trainer.Trainer._score_validation = scored
    data = Path(f"build/accuracy/planted-360k-s{seed}") if seed.isdigit() else Path(seed)
    torch.manual_seed(0)
    result = train(data, model=model, progress=False)
    _, validation, test = splits(data, 0.1)
    yv, yt = validation.labels(), test.labels()
    print(f"seed {seed} {model}: the selected model's test AUC {result['auc']:.4f} (step {result['best_step']})")
    best = {}
    for step, per_epoch, auc, lv, lt in records:
        epoch = (step - 1) // per_epoch
        if step and (epoch not in best or auc > best[epoch][0]):
            best[epoch] = (auc, step, lv, lt)
    for epoch, (auc, step, _, lt) in sorted(best.items()):
        print(f"  epoch {epoch}: step {step}, validation {auc:.4f}, test {roc_auc(yt, lt):.4f}")
    ranked = sorted(best, key=lambda e: -best[e][0])
    for k in range(2, len(ranked) + 1):
        top = sorted(ranked[:k])
        lv, lt = (np.mean([best[e][i] for e in top], 0) for i in (2, 3))
        print(f"  the best {k} epochs {top}: validation {roc_auc(yv, lv):.4f}, test {roc_auc(yt, lt):.4f}")


if __name__ == "__main__":
    main()
