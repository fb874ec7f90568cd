"""Two files of run.py's cells matched by (dataset, model): test AUC and log loss, A -> B, per cell and on
average; wins and losses by sign, then by more than 0.0005, and B's median time against A's.

    python benchmarks/results/small_batch/cmp.py A.jsonl B.jsonl
"""

import json
import statistics
import sys

a, b = sys.argv[1:3]


def load(f):
    return {(r["dataset"], r["model"]): r for r in map(json.loads, open(f))}


A, B = load(a), load(b)
diffs, dl, ratio = [], [], []
for k in A:
    if k in B:
        d = B[k]["auc"] - A[k]["auc"]
        diffs.append(d)
        dl.append(B[k]["logloss"] - A[k]["logloss"])
        ratio.append(B[k]["seconds"] / max(A[k]["seconds"], 0.1))
        print(f"{k[0]:14s} {k[1]:10s} {A[k]['auc']:.4f} -> {B[k]['auc']:.4f} ({d:+.4f})  ll {A[k]['logloss']:.4f} -> "
              f"{B[k]['logloss']:.4f}  steps {A[k]['steps']}->{B[k]['steps']} batch {B[k]['batch']} "
              f"s {A[k]['seconds']}->{B[k]['seconds']}")
print(len(diffs), "cells; mean auc diff %+.4f median %+.4f; wins %d losses %d; mean ll diff %+.4f"
      % (statistics.mean(diffs), statistics.median(diffs), sum(d > 0 for d in diffs), sum(d < 0 for d in diffs),
         statistics.mean(dl)))
print("up %d / down %d by more than 0.0005; time x%.1f (median)"
      % (sum(d > 0.0005 for d in diffs), sum(d < -0.0005 for d in diffs), statistics.median(ratio)))
