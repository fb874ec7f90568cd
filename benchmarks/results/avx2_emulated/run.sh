#!/usr/bin/env bash
# fp32 training per model with this CPU's kernels held to AVX2 (ATen's dispatch, MKL's and oneDNN's instruction
# sets), as a stand-in for an AVX2-only machine, which no session has had; CTRKIT_CPU_BF16=0 makes ctrkit act as one.
# The matmul peak is measured under the same limits. Interleaved with the unrestricted run, ROUNDS rounds.
#   bash benchmarks/results/avx2_emulated/run.sh [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/../../.."
OUT=benchmarks/results/avx2_emulated
AVX2=(ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2 CTRKIT_CPU_BF16=0)
for r in $(seq 1 "${1:-2}"); do
  for m in dlrm dcnv2 wide_deep; do
    for kind in avx2 native; do
      if [ $kind = avx2 ]; then env=("${AVX2[@]}"); else env=(CTRKIT_CPU_BF16=1); fi
      env OMP_WAIT_POLICY=PASSIVE "${env[@]}" .venv/bin/python -m ctrkit bench train --model "$m" --threads 2 \
        --repeats 3 --steps 20 --output "$OUT/${m}_${kind}_r$r.json" > /dev/null
    done
  done
done
.venv/bin/python benchmarks/summarize_runs.py "$OUT" model kind
