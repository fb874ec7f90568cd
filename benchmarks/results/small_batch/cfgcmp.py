"""Two configurations' cells of run.py, matched by (dataset, model): test AUC and log loss, base -> new, and
the mean change over the cells both hold.

    python benchmarks/results/small_batch/cfgcmp.py BASE.jsonl NEW.jsonl
"""

import json
import statistics
import sys


def cells(path):
    return {(r["dataset"], r["model"]): r for r in map(json.loads, open(path))}


base, new = cells(sys.argv[1]), cells(sys.argv[2])
auc, loss, ratio = [], [], []
for key in (k for k in new if k in base):
    b, n = base[key], new[key]
    auc.append(n["auc"] - b["auc"])
    loss.append(n["logloss"] - b["logloss"])
    ratio.append(n["seconds"] / max(b["seconds"], 0.1))
    print(f"{key[0]:18s} {key[1]:10s} AUC {b['auc']:.4f} -> {n['auc']:.4f} ({auc[-1]:+.4f})  "
          f"logloss {b['logloss']:.4f} -> {n['logloss']:.4f}  s {b['seconds']:.0f} -> {n['seconds']:.0f}")
print(f"{len(auc)} cells: AUC mean {statistics.mean(auc):+.4f} median {statistics.median(auc):+.4f}, "
      f"up {sum(d > 0.0005 for d in auc)} / down {sum(d < -0.0005 for d in auc)} by more than 0.0005; "
      f"log loss mean {statistics.mean(loss):+.4f}; time x{statistics.median(ratio):.1f} (median)")
