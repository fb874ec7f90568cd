#!/usr/bin/env bash
# The step split over threads (--split-batch auto) against the unsplit step (off): `ctrkit bench train` per model
# and precision, interleaved rounds. Usage: bash benchmarks/results/split_batch/run.sh ROUNDS [OUT]
set -euo pipefail
ROUNDS=${1:-2}
OUT=${2:-benchmarks/results/split_batch}
export OMP_WAIT_POLICY=PASSIVE
for r in $(seq 1 "$ROUNDS"); do
  for model in dlrm dcnv2 wide_deep; do
    for prec in fp32 bf16; do
      amp=(); [ "$prec" = bf16 ] && amp=(--amp)
      order=(off auto); [ $((r % 2)) = 0 ] && order=(auto off)
      for split in "${order[@]}"; do
        .venv/bin/ctrkit bench train --model "$model" "${amp[@]}" --threads 2 --repeats 3 --steps 20 \
          --split-batch "$split" --out "$OUT/${model}_${prec}_${split}_$r.json" > /dev/null 2>&1
        echo "$model $prec $split round $r done"
      done
    done
  done
done
