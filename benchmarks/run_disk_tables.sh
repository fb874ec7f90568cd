#!/usr/bin/env bash
# Training speed with the tables on disk (`--embedding-storage disk`) against the same tables in memory, on a
# shape that fits in memory: DLRM, 26 tables of 1M rows at width 32 (3.3 GB), row-wise Adagrad, batch 4,096.
# 64 distinct batches of power-law ids. Three variants interleaved over ROUNDS rounds: in memory; on disk with
# every row cached; on disk with a cache of 1% of the rows (260,000: evicting every few steps). Raw JSON in build/bench/disk-tables/; the medians go to
# benchmarks/results/disk-tables/KIND.json.
# Usage: bash benchmarks/run_disk_tables.sh   (after `make install`)
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_WAIT_POLICY=PASSIVE
ROUNDS=${ROUNDS:-3}
raw=build/bench/disk-tables
rm -rf "$raw"
mkdir -p "$raw"
shape=(--table-rows 1000000 --embedding-dim 32 --embedding-optimizer rowwise_adagrad --batch-size 4096
       --warmup 30 --steps 50 --repeats 3 --distinct-batches 64)
declare -A flags=([memory]="" [disk_every_row]="--embedding-storage disk"
                  [disk_1pct]="--embedding-storage disk --embedding-cache-rows 260000")
for round in $(seq "$ROUNDS"); do
  for v in memory disk_every_row disk_1pct; do
    # shellcheck disable=SC2086
    .venv/bin/ctrkit bench train "${shape[@]}" ${flags[$v]} --output "$raw/${v}_${round}.json" | grep samples/s
  done
done
.venv/bin/python benchmarks/collect.py disk-tables "$raw" --command "bash benchmarks/run_disk_tables.sh"
