"""Post-hoc calibration of the kept model measured: each model trained with its defaults but --calibrate off
(the cells of this directory's jsonl files were run before --calibrate existed), its validation and test
logits, and the test log loss after a scale ("scale") or a scale and a shift ("platt") of the logit fitted on
validation (scipy's L-BFGS, no prior). One JSON line per (dataset, model); summarize.py applies the rules.

    OMP_WAIT_POLICY=PASSIVE python benchmarks/results/calibration/run.py OUT.jsonl MODELS DATASET...
"""

import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from ctrkit.bench.accuracy import splits
from ctrkit.checkpoint import load_checkpoint
from ctrkit.eval.evaluator import predict_logits
from ctrkit.eval.metrics import log_loss_from_logits, roc_auc
from ctrkit.train.run import train


def fit(z, y, shift=True):
    """(a, b) minimising the mean log loss of sigmoid(a z + b) against y (L-BFGS, float64; b = 0 without
    ``shift``)."""
    from scipy.optimize import minimize

    z, y = z.astype(np.float64), y.astype(np.float64)

    def loss(w):
        s = w[0] * z + (w[1] if shift else 0.0)
        p = 1 / (1 + np.exp(-np.clip(s, -500, 500)))
        g = p - y
        grad = np.array([np.mean(g * z), np.mean(g) if shift else 0.0])
        return np.mean(np.logaddexp(0, s) - y * s), grad

    w = minimize(loss, np.array([1.0, 0.0]), jac=True, method="L-BFGS-B").x
    return float(w[0]), float(w[1]) if shift else 0.0


out, models, *datasets = sys.argv[1:]
torch.set_num_threads(1)
for path in datasets:
    tr, va, te = splits(path, 0.1)
    yv, yt = va.labels(), te.labels()
    for model in models.split(","):
        t = time.perf_counter()
        torch.manual_seed(0)
        with tempfile.TemporaryDirectory() as tmp:
            ck = Path(tmp) / "m.pt"
            r = train(path, model=model, progress=False, save_checkpoint=str(ck), calibrate="off")
            net = load_checkpoint(ck).build_model()
        dev = torch.device("cpu")
        zv, zt = predict_logits(net, va, dev), predict_logits(net, te, dev)
        row = {"dataset": Path(path).name, "model": model, "validation_rows": len(va), "auc": r["auc"],
               "logloss": r["logloss"],
               "check_auc": roc_auc(yt, zt), "val_logloss": log_loss_from_logits(yv, zv)}
        for name, shift in (("scale", False), ("platt", True)):
            a, b = fit(zv, yv, shift)
            row[name] = {"a": a, "b": b, "val_logloss": log_loss_from_logits(yv, (a * zv + b).astype(np.float32)),
                         "logloss": log_loss_from_logits(yt, (a * zt + b).astype(np.float32))}
        row["seconds"] = round(time.perf_counter() - t, 1)
        with open(out, "a") as f:
            f.write(json.dumps(row) + "\n")
        print(row["dataset"], model, round(r["auc"], 4), round(r["logloss"], 4), "scale", round(row["scale"]["logloss"], 4),
              round(row["scale"]["a"], 3), "platt", round(row["platt"]["logloss"], 4), flush=True)
