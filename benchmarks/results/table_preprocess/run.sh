#!/usr/bin/env bash
# Time and peak memory of `ctrkit preprocess table` on a generated CSV: ROWS rows (default 2,000,000) of a
# user id, an item id, two text categories, a multi-hot tag list, three amounts and a click.
# Usage: bash benchmarks/results/table_preprocess/run.sh [ROWS]
set -euo pipefail
ROWS=${1:-2000000}
WORK=build/table-bench
mkdir -p "$WORK"
.venv/bin/python - "$ROWS" "$WORK/clicks.csv" <<'PY'
import sys
import numpy as np
import polars as pl
n, out = int(sys.argv[1]), sys.argv[2]
rng = np.random.default_rng(0)
tags = np.array(["news", "sport", "tech", "music", "food", "travel", "games", "cars"])
pl.DataFrame({
    "ts": np.arange(n),
    "user": rng.zipf(1.3, n) % 1_000_000,
    "item": rng.zipf(1.5, n) % 200_000,
    "device": rng.choice(["ios", "android", "web"], n),
    "country": rng.choice([f"c{i}" for i in range(150)], n),
    "tags": ["|".join(t) for t in tags[rng.integers(0, 8, (n, 2))]],
    "price": np.round(rng.lognormal(3, 1, n), 2),
    "position": rng.integers(1, 20, n).astype(float),
    "age_days": rng.exponential(30, n).round(1),
    "click": (rng.random(n) < 0.1).astype(int),
}).write_csv(out)
PY
ls -l "$WORK/clicks.csv"
export OMP_WAIT_POLICY=PASSIVE
/usr/bin/time -f "peak RSS %M KB, %e s" .venv/bin/ctrkit preprocess table "$WORK/clicks.csv" --out "$WORK/ds" \
  --label click --categorical user,item --multi-hot tags --order-by ts --validation-fraction 0.05 --overwrite \
  --no-progress
