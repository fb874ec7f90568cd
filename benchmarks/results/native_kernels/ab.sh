#!/bin/bash
# The C kernels (ctrkit/native) against ATen's operations (CTRKIT_NATIVE=0) in whole training steps:
# interleaved rounds, each model's defaults, fp32 and bf16 autocast, OMP_WAIT_POLICY=PASSIVE.
# Usage (repository root): ROUNDS=3 MODELS="dlrm dcnv2 wide_deep" bash benchmarks/results/native_kernels/ab.sh
export OMP_WAIT_POLICY=PASSIVE
OUT=${OUT:-benchmarks/results/native_kernels}
mkdir -p "$OUT"
for r in $(seq 1 "${ROUNDS:-3}"); do
  for m in ${MODELS:-dlrm dcnv2 wide_deep}; do
    for amp in "" "--amp"; do
      tag=$([ -z "$amp" ] && echo fp32 || echo bf16)
      CTRKIT_NATIVE=0 .venv/bin/ctrkit bench train --model "$m" $amp --threads 2 --repeats 3 --steps "${STEPS:-30}" \
        --output "$OUT/${m}_${tag}_aten_$r.json" >/dev/null
      .venv/bin/ctrkit bench train --model "$m" $amp --threads 2 --repeats 3 --steps "${STEPS:-30}" \
        --output "$OUT/${m}_${tag}_native_$r.json" >/dev/null
    done
  done
done
