"""Test AUC and share of the gap closed (logistic regression -> Bayes AUC) on planted data of several seeds.

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/results/planted_seeds/planted_seeds.py 0,1,2,3 dlrm \
        [--embedding-lr 3e-3 ...]

Builds build/accuracy/planted-360k-sN (the accuracy panel's 360,000-row planted data: 270,000 train, 30,000
validation, 60,000 test; `ROWS=N` in the environment for another size, a sixth of it test) where missing, fits
the panel's logistic regression once per seed (cached in build/accuracy/planted-360k-sN.logistic.json) and
trains MODEL with its defaults and the options given (TrainConfig or model config fields as `--name value`;
comma lists become tuples). With defaults alone, `ctrkit bench accuracy --panel planted --planted-rows 360000
--seeds 0,1,2,3 --models dlrm` measures the same, refitting both baselines on every run; this script keeps the
regression per seed, to compare many settings.
"""

import json
import os
import sys
import time
from pathlib import Path

import torch
import yaml

from ctrkit.bench.accuracy import splits
from ctrkit.bench.panel import build_planted
from ctrkit.eval.baselines import logistic_regression
from ctrkit.train.run import train


def value(text: str):
    if "," in text:
        return tuple(int(x) for x in text.split(","))
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def main() -> None:
    seeds = [int(s) for s in sys.argv[1].split(",")]
    model, args = sys.argv[2], sys.argv[3:]
    rows = int(os.environ.get("ROWS", "360000"))
    options = {args[i].lstrip("-").replace("-", "_"): value(args[i + 1]) for i in range(0, len(args), 2)}
    for seed in seeds:
        data = Path(f"build/accuracy/planted-{rows // 1000}k-s{seed}")
        if not (data / "feature_spec.yaml").exists():
            build_planted(data, rows, seed)
        bayes = yaml.safe_load((data / "feature_spec.yaml").read_text())["metadata"]["bayes_test_auc"]
        cache = data.with_name(data.name + ".logistic.json")
        if not cache.exists():
            cache.write_text(json.dumps(logistic_regression(*splits(data, 0.1))))
        lr = json.loads(cache.read_text())["auc"]
        start = time.perf_counter()
        torch.manual_seed(0)
        result = train(data, model=model, progress=False, **options)
        closed = (result["auc"] - lr) / (bayes - lr)
        print(
            f"seed {seed} {model} {' '.join(args) or 'defaults'}: test AUC {result['auc']:.4f}, kept step "
            f"{result.get('ensemble') or result['best_step']} of {result['step']}, gap closed {closed:.3f} (logistic regression {lr:.4f}, "
            f"Bayes {bayes:.4f}), {time.perf_counter() - start:.0f} s",
            flush=True,
        )


if __name__ == "__main__":
    main()
