"""Medians over rounds of `ctrkit bench train` JSON files named KEY1_KEY2_..._rROUND.json in a folder: samples/s,
the fp32 matmul peak and the fraction of the peak, each with its rounds, one line per group of keys.

    python benchmarks/summarize_runs.py FOLDER NAME1 NAME2 ...   (the names of the keys, for the header)
"""

import collections
import json
import statistics
import sys
from pathlib import Path

folder, names = Path(sys.argv[1]), sys.argv[2:]
rows = collections.defaultdict(list)
for f in sorted(folder.glob("*_r*.json")):
    keys = f.stem.rsplit("_", len(names))[:-1]  # the model name may hold underscores: split from the right
    j = json.loads(f.read_text())
    rows[tuple(keys)].append((j["samples_per_s"], j["fraction_of_peak"], j["matmul_peak_gflops"]["fp32"],
                              j["machine"]["capability"]))  # fmt: skip
header = "capability samples/s (rounds)  fp32 peak GFLOP/s (rounds)  fraction of the peak of its precision"
print(" ".join(f"{n:10s}" for n in names), header)
for keys, v in sorted(rows.items()):
    print(" ".join(f"{k:10s}" for k in keys), f"{v[0][3]:10s}", f"{statistics.median(x[0] for x in v):9,.0f}",
          [round(x[0]) for x in v], [round(x[2]) for x in v], f"{statistics.median(x[1] for x in v):.0%}",
          [f"{x[1]:.0%}" for x in v])  # fmt: skip
