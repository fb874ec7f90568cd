"""What averaging the logits of models trained with different --seed gives, per (dataset, model): each
seed's test AUC and log loss, and those of the mean logit of seeds 0..k-1 for k = 2..K (JSON lines).

    OMP_WAIT_POLICY=PASSIVE python benchmarks/results/seed_ensemble/seeds.py OUT.jsonl K DATASET...

MODELS=dlrm,wide_deep (comma-separated) limits the models (default: all three).
"""

import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from ctrkit.checkpoint import load_checkpoint
from ctrkit.data.dataset import SplitBinaryDataset
from ctrkit.eval.evaluator import predict_logits
from ctrkit.eval.metrics import log_loss_from_logits, roc_auc
from ctrkit.train.run import train

out, k, *datasets = sys.argv[1:]
k = int(k)
models = tuple(os.environ.get("MODELS", "dlrm,dcnv2,wide_deep").split(","))
torch.set_num_threads(2)
cpu = torch.device("cpu")
with tempfile.TemporaryDirectory() as tmp:
    for path in datasets:
        test = SplitBinaryDataset(path, "test")
        labels = test.labels()
        for model in models:
            logits, single = [], []
            t = time.perf_counter()
            for seed in range(k):
                ckpt = Path(tmp) / f"{model}-{seed}.pt"
                train(path, model, seed=seed, save_checkpoint=str(ckpt), progress=False)
                scores = predict_logits(load_checkpoint(ckpt).build_model(), test, cpu)
                logits.append(scores.astype(np.float64))
                single.append({"auc": roc_auc(labels, scores), "logloss": log_loss_from_logits(labels, scores)})
            mean = {}
            for n in range(2, k + 1):
                m = np.mean(logits[:n], axis=0)
                mean[n] = {"auc": roc_auc(labels, m), "logloss": log_loss_from_logits(labels, m)}
            row = {"dataset": Path(path).name, "model": model, "seeds": single, "mean_of_first": mean,
                   "seconds": round(time.perf_counter() - t, 1)}
            with open(out, "a") as f:
                f.write(json.dumps(row) + "\n")
            print(row["dataset"], model, "singles", [round(s["auc"], 4) for s in single],
                  "ensembles", {n: round(v["auc"], 4) for n, v in mean.items()}, flush=True)
