"""Mid-size data (10-23 batches an epoch at 1,024): the small-data rules (seed ensemble of 3, patience 20 / 10,
the small batch chosen by validation) against the defaults. JSON lines as run.py's.

    OMP_WAIT_POLICY=PASSIVE python benchmarks/results/small_batch/mid.py OUT.jsonl small DATASET...

("default" runs every default; the defaults' cells compared here are the one-thread rows of
benchmarks/accuracy-small-batch, which midcmp.py reads.)
"""
import json, sys, time
from pathlib import Path
import torch
from ctrkit.bench.accuracy import splits
from ctrkit.config import default_small_batch
from ctrkit.train.run import train

out, config, *datasets = sys.argv[1:]
torch.set_num_threads(1)
for path in datasets:
    tr, va, te = splits(path, 0.1)
    options = {}
    if config == "small":
        options = dict(seed_ensemble=3, early_stopping_patience=20, plateau_patience=10,
                       small_batch=default_small_batch(len(tr)))
    for model in ("dlrm", "dcnv2", "wide_deep"):
        t = time.perf_counter()
        torch.manual_seed(0)
        r = train(path, model=model, progress=False, **options)
        row = {"dataset": Path(path).name, "model": model, "config": config, "batch": r.get("batch_size"),
               "auc": r["auc"], "logloss": r["logloss"], "validation": r.get("validation"),
               "best_step": r["best_step"], "steps": r["step"], "seconds": round(time.perf_counter() - t, 1)}
        with open(out, "a") as f:
            f.write(json.dumps(row) + "\n")
        print(row["dataset"], model, config, row["batch"], round(r["auc"], 4), round(r["logloss"], 4), row["seconds"], flush=True)
