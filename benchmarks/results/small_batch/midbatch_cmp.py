"""The mid-size tables' cells of run.py's "midbatch" configuration (mid-batch.jsonl) against the defaults' on
the same machine and day: the cells of benchmarks/results/calibration (each model with its defaults, trained
with --calibrate off, which leaves AUC as it is).

    python benchmarks/results/small_batch/midbatch_cmp.py
"""

import json
import statistics

where = "benchmarks/results/"
base = {(r["dataset"], r["model"]): r for f in ("calibration/dlrm_dcnv2.jsonl", "calibration/wide_deep.jsonl")
        for r in map(json.loads, open(where + f))}  # fmt: skip
rows = [json.loads(line) for line in open(where + "small_batch/mid-batch.jsonl")]
d = []
for r in rows:
    b = base[(r["dataset"], r["model"])]
    d.append(r["auc"] - b["auc"])
    print(f"{r['dataset']:18s} {r['model']:10s} {b['auc']:.4f} -> {r['auc']:.4f} ({d[-1]:+.4f}) batch {r['batch']} "
          f"s {b['seconds']:.0f} -> {r['seconds']:.0f}")
print(f"{len(d)} cells: mean {statistics.mean(d):+.4f}, median {statistics.median(d):+.4f}, "
      f"up {sum(x > 0.0005 for x in d)}, down {sum(x < -0.0005 for x in d)}, worst {min(d):+.4f}")
