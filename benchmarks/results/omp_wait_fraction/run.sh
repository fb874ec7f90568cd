#!/usr/bin/env bash
# Fraction of the fp32 (bf16) matmul peak per model under OMP_WAIT_POLICY=PASSIVE (the benchmarks' setting) and with
# idle threads spinning (GOMP_SPINCOUNT=infinite), interleaved rounds; JSON per run here, then a summary.
#   bash benchmarks/results/omp_wait_fraction/run.sh [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/../../.."
OUT=benchmarks/results/omp_wait_fraction
for r in $(seq 1 "${1:-2}"); do
  for cfg in "dlrm fp32" "dlrm bf16" "dcnv2 fp32" "dcnv2 bf16" "wide_deep fp32"; do
    set -- $cfg
    amp=(); [ "$2" = bf16 ] && amp=(--amp)
    for policy in passive spin; do
      if [ $policy = passive ]; then env=(OMP_WAIT_POLICY=PASSIVE); else env=(GOMP_SPINCOUNT=infinite); fi
      env "${env[@]}" .venv/bin/python -m ctrkit bench train --model "$1" "${amp[@]}" --threads 2 --repeats 3 \
        --steps 20 --output "$OUT/${1}_${2}_${policy}_r$r.json" > /dev/null
    done
  done
done
.venv/bin/python benchmarks/summarize_runs.py "$OUT" model precision policy
