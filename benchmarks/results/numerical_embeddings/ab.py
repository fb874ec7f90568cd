"""A/B of one model-config setting across datasets: each (dataset, model) trained with the defaults and
with the setting, interleaved, test AUC and log loss appended as JSON lines.

    OMP_WAIT_POLICY=PASSIVE python benchmarks/results/numerical_embeddings/ab.py OUT.jsonl 'numerical_embeddings=16' \
        build/accuracy/males build/accuracy/star ...

MODELS=dcnv2 (comma-separated) limits the models (default: all three); SKIP_BASE=1 trains only the setting
(the defaults' rows then come from another file: summarize.py takes several).
"""

import json
import os
import sys
import time

import torch

from ctrkit.train.run import train

out, setting, *datasets = sys.argv[1:]
key, value = setting.split("=")
models = tuple(os.environ.get("MODELS", "dlrm,dcnv2,wide_deep").split(","))
torch.set_num_threads(2)
for path in datasets:
    for model in models:
        arms = (("base", {}), (setting, {key: json.loads(value)}))
        for arm, options in arms[1:] if os.environ.get("SKIP_BASE") else arms:
            t = time.perf_counter()
            r = train(path, model, progress=False, **options)
            row = {
                "dataset": path.rstrip("/").split("/")[-1],
                "model": model,
                "arm": arm,
                "seconds": round(time.perf_counter() - t, 1),
                **{k: v for k, v in r.items() if isinstance(v, (int, float, str)) or v is None},
                "validation_auc": r["validation"]["auc"],
                "ensemble": r.get("ensemble"),
            }
            with open(out, "a") as f:
                f.write(json.dumps(row) + "\n")
            print(
                row["dataset"],
                model,
                arm,
                {k: row.get(k) for k in ("auc", "logloss", "validation_auc", "best_step")},
                flush=True,
            )
