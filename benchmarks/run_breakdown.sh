#!/usr/bin/env bash
# Step time by part for the three models, fp32 and bf16 autocast (docs/benchmarks.md, "Step time by part").
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-build/bench/breakdown}
mkdir -p "$OUT"
export OMP_WAIT_POLICY=PASSIVE
for model in dlrm dcnv2 wide_deep; do
  for amp in "" "--amp"; do
    name=$model-$([ -n "$amp" ] && echo bf16 || echo fp32)
    .venv/bin/ctrkit bench train --model "$model" --threads 2 --repeats 3 --steps 20 --breakdown $amp --output "$OUT/$name.json"
  done
done
.venv/bin/python benchmarks/collect.py breakdown "$OUT" --command "bash benchmarks/run_breakdown.sh"
