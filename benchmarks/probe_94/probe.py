"""One-off probe for #94: train variants on a dataset, print test AUC / validation AUC / best step / steps / seconds."""

import json
import sys
import time
from pathlib import Path

import torch

from ctrkit.train.run import train

data = sys.argv[1]
model = sys.argv[2]
variants = json.loads(sys.argv[3])  # {"name": {options}}
out = sys.argv[4]
rows = []
for name, opts in variants.items():
    torch.manual_seed(0)
    t = time.perf_counter()
    log = f"{out}.{model}.{name}.jsonl"
    Path(log).unlink(missing_ok=True)
    r = train(data, model=model, progress=False, log_path=log, **opts)
    row = {
        "name": name,
        "model": model,
        "data": data,
        "opts": opts,
        "auc": r["auc"],
        "logloss": r["logloss"],
        "val": r.get("validation", {}).get("auc"),
        "best_step": r["best_step"],
        "steps": r["step"],
        "s": time.perf_counter() - t,
        "history": r.get("history"),
    }
    print(json.dumps({k: v for k, v in row.items() if k != "history"}), flush=True)
    with open(out, "a") as f:
        f.write(json.dumps(row) + "\n")
