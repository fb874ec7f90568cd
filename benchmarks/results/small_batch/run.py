"""Small data: the model's batch (1,024) against a batch that gives an epoch at least N steps, with the
small-data rules of the default batch kept (patience 20 / 10 evaluations, seed ensemble of 3). One JSON
line per (dataset, model, config): test and validation AUC and log loss, steps, seconds.

    OMP_WAIT_POLICY=PASSIVE python benchmarks/results/small_batch/run.py OUT.jsonl CONFIG DATASET...

CONFIG: "default" (the model's batch), "steps<N>" (the largest power of two <= train rows / N, at least 32),
or "batch<B>".
"""

import json
import sys
import time
from pathlib import Path

import torch

from ctrkit.bench.accuracy import splits
from ctrkit.train.run import train

out, config, *datasets = sys.argv[1:]
torch.set_num_threads(1)
for path in datasets:
    tr, va, te = splits(path, 0.1)
    options = {}
    if config.startswith("steps"):
        target = len(tr) // int(config[5:])
        options["batch_size"] = max(32, 1 << (max(target, 1).bit_length() - 1))
    elif config.startswith("batch"):
        options["batch_size"] = int(config[5:])
    if options:
        options.update(early_stopping_patience=20, plateau_patience=10, seed_ensemble=3)
    for model in ("dlrm", "dcnv2", "wide_deep"):
        t = time.perf_counter()
        torch.manual_seed(0)
        r = train(path, model=model, progress=False, **options)
        row = {"dataset": Path(path).name, "model": model, "config": config, "batch": options.get("batch_size"),
               "auc": r["auc"], "logloss": r["logloss"], "validation": r.get("validation"),
               "best_step": r["best_step"], "steps": r["step"], "seconds": round(time.perf_counter() - t, 1)}
        with open(out, "a") as f:
            f.write(json.dumps(row) + "\n")
        print(row["dataset"], model, config, options.get("batch_size"), round(r["auc"], 4), round(r["logloss"], 4),
              flush=True)
