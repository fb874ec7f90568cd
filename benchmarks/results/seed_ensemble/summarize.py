"""Summarises seeds.py's JSON lines: per (dataset, model), seed 0's test AUC, the mean over the seeds, and
the mean logit of all seeds; then the mean differences over the cells.

    python benchmarks/results/seed_ensemble/summarize.py seeds.jsonl
"""

import json
import statistics as st
import sys

rows = [json.loads(line) for path in sys.argv[1:] for line in open(path)]
gain_vs_mean, gain_vs_first, spread = [], [], []
print(f"{'dataset':14s} {'model':10s} {'seed 0':>7s} {'mean':>7s} {'min-max':>13s} {'ensemble':>8s}")
for r in rows:
    aucs = [s["auc"] for s in r["seeds"]]
    k = str(len(aucs))
    ens = r["mean_of_first"][k]["auc"]
    gain_vs_mean.append(ens - st.mean(aucs))
    gain_vs_first.append(ens - aucs[0])
    spread.append(max(aucs) - min(aucs))
    print(f"{r['dataset']:14s} {r['model']:10s} {aucs[0]:7.4f} {st.mean(aucs):7.4f} {min(aucs):.4f}-{max(aucs):.4f} "
          f"{ens:8.4f}")
print(f"{len(rows)} cells: ensemble - mean of the seeds {st.mean(gain_vs_mean):+.4f} (higher in "
      f"{sum(g > 0 for g in gain_vs_mean)}), ensemble - seed 0 {st.mean(gain_vs_first):+.4f} (higher in "
      f"{sum(g > 0 for g in gain_vs_first)}, lower in {sum(g < 0 for g in gain_vs_first)}); "
      f"mean spread (max - min over the seeds) {st.mean(spread):.4f}")
