#!/usr/bin/env bash
# DLRM fp32 with this CPU's kernels held to AVX2 (ATen's dispatch, MKL's and oneDNN's instruction sets, and the C
# kernels built with -march=x86-64-v3 instead of -march=native), C kernels against ATen (CTRKIT_NATIVE=0),
# interleaved rounds: a stand-in for an AVX2-only machine, which no session has had.
#   bash benchmarks/results/native_kernels/avx2_emulated/run.sh [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/../../../.."
OUT=benchmarks/results/native_kernels/avx2_emulated
AVX2=(ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2 CTRKIT_CPU_BF16=0)
BENCH='import sys; from ctrkit import native
native.FLAGS = tuple("-march=x86-64-v3" if f == "-march=native" else f for f in native.FLAGS)
from ctrkit.cli import main; sys.exit(main(sys.argv[1:]))'
for r in $(seq 1 "${1:-2}"); do
  for kind in aten native; do
    switch=$([ $kind = aten ] && echo 0 || echo 1)
    env OMP_WAIT_POLICY=PASSIVE CTRKIT_NATIVE=$switch "${AVX2[@]}" .venv/bin/python -c "$BENCH" bench train \
      --model dlrm --threads 2 --repeats 3 --steps 30 --output "$OUT/dlrm_fp32_${kind}_$r.json" > /dev/null
  done
done
.venv/bin/python benchmarks/results/native_kernels/summarize.py "$OUT"
