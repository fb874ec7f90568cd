#!/usr/bin/env bash
# Training throughput of DLRM on the Criteo-Kaggle shape (`ctrkit bench train` defaults).
# Four variants, interleaved over ROUNDS rounds so that the machine's drifting load hits them all
# alike; each run reports the median of 5 x 50 timed steps (raw JSON in build/bench/train/), and
# benchmarks/collect.py keeps the medians over rounds in benchmarks/results/train/KIND.json.
# Usage: bash benchmarks/run_train.sh   (after `make install`)
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_WAIT_POLICY=PASSIVE  # spinning OpenMP threads cost up to 5x when another process competes
ROUNDS=${ROUNDS:-5}
raw=build/bench/train
rm -rf "$raw"
mkdir -p "$raw"
declare -A flags=([fp32]="" [bf16]="--amp" [fp32_dense_grad]="--dense-gradients" [bf16_dense_grad]="--amp --dense-gradients")
for round in $(seq "$ROUNDS"); do
  for v in fp32 bf16 fp32_dense_grad bf16_dense_grad; do
    # shellcheck disable=SC2086
    .venv/bin/ctrkit bench train --steps 50 --repeats 5 ${flags[$v]} --output "$raw/${v}_${round}.json" | grep samples/s
  done
done
.venv/bin/python benchmarks/collect.py train "$raw" --command "bash benchmarks/run_train.sh"
