"""Small data: the model's batch (1,024) against a batch that gives an epoch at least N steps, with the
small-data rules of the default batch kept (patience 20 / 10 evaluations, seed ensemble of 3); and, on
mid-size data, every small-data rule against the defaults. One JSON line per (dataset, model, config): test
and validation AUC and log loss, the kept batch, steps, seconds.

    OMP_WAIT_POLICY=PASSIVE python benchmarks/results/small_batch/run.py OUT.jsonl CONFIG DATASET...

CONFIG: "default" (the model's batch only: every default but --small-batch, which it measures), "steps<N>"
(the largest power of two <= train rows / N, at least 32), "batch<B>", or "small" (every small-data rule:
the seed ensemble of 3, patience 20 / 10 and --small-batch's unset batch chosen on validation; the cells of
mid-small.jsonl, compared by midcmp.py with the one-thread rows of benchmarks/accuracy-small-batch), or
"midbatch" (only --small-batch's unset batch chosen on validation, the other settings the defaults': the
cells of mid-batch.jsonl, compared by midbatch_cmp.py with the cells of benchmarks/results/calibration),
"midseed" (only the seed ensemble of 3: mid-seed.jsonl) or "midpat" (only patience 20 / 10: mid-pat.jsonl),
each compared by cmp.py with mid-default.jsonl, the "default" cells of the same run.
"""

import json
import sys
import time
from pathlib import Path

import torch

from ctrkit.bench.accuracy import splits
from ctrkit.config import default_small_batch
from ctrkit.train.run import train

out, config, *datasets = sys.argv[1:]
torch.set_num_threads(1)
rules = dict(early_stopping_patience=20, plateau_patience=10, seed_ensemble=3)  # small data's, at batch 1,024
for path in datasets:
    tr, va, te = splits(path, 0.1)
    options = {"small_batch": 0}
    if config.startswith("steps"):
        target = len(tr) // int(config[5:])
        options.update(rules, batch_size=max(32, 1 << (max(target, 1).bit_length() - 1)))
    elif config.startswith("batch"):
        options.update(rules, batch_size=int(config[5:]))
    elif config == "small":
        options.update(rules, small_batch=default_small_batch(len(tr)))
    elif config == "midbatch":  # --small-batch's batch alone, at the model's patience and one seed
        options.update(small_batch=default_small_batch(len(tr)))
    elif config == "midseed":  # the seed ensemble alone, at the model's batch and patience
        options.update(seed_ensemble=3)
    elif config == "midpat":  # the small-data patience alone, at the model's batch and one seed
        options.update(early_stopping_patience=20, plateau_patience=10)
    for model in ("dlrm", "dcnv2", "wide_deep"):
        t = time.perf_counter()
        torch.manual_seed(0)
        r = train(path, model=model, progress=False, **options)
        batch = r.get("batch_size") if config in ("small", "midbatch") else options.get("batch_size")  # kept; given
        row = {"dataset": Path(path).name, "model": model, "config": config, "batch": batch,
               "auc": r["auc"], "logloss": r["logloss"], "validation": r.get("validation"),
               "best_step": r["best_step"], "steps": r["step"], "seconds": round(time.perf_counter() - t, 1)}
        with open(out, "a") as f:
            f.write(json.dumps(row) + "\n")
        print(row["dataset"], model, config, batch, round(r["auc"], 4), round(r["logloss"], 4), flush=True)
