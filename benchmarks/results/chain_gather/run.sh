#!/usr/bin/env bash
# Usage: bash benchmarks/results/chain_gather/run.sh ROUNDS > benchmarks/results/chain_gather/results.txt
set -euo pipefail
ROUNDS=${1:-6}
export OMP_WAIT_POLICY=PASSIVE
for model in dlrm dcnv2 wide_deep; do
  steps=15; [ "$model" = wide_deep ] && steps=5
  for amp in "" amp; do
    .venv/bin/python benchmarks/results/chain_gather/ab.py "$model" "$ROUNDS" "$steps" $amp 2>/dev/null | grep -v '^{'
  done
done
.venv/bin/python benchmarks/results/chain_gather/ab.py dlrm 2 15 split=off 2>/dev/null
