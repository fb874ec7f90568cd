#!/usr/bin/env bash
# fp32 training per model with this CPU held to AVX2 (ATen's dispatch, MKL's and oneDNN's instruction sets, and
# ctrkit's C kernels built with -march=x86-64-v3), interleaved with the unrestricted run: a stand-in for an AVX2-only
# machine, which no session has had. The matmul peak is measured under the same limits.
#   bash benchmarks/results/avx2_emulated/chain/run.sh [ROUNDS] [OUT]
set -euo pipefail
cd "$(dirname "$0")/../../../.."
OUT=${2:-benchmarks/results/avx2_emulated/chain}
mkdir -p "$OUT"
AVX2=(ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2 CTRKIT_CPU_BF16=0)
V3='import sys; from ctrkit import native
native.FLAGS = tuple("-march=x86-64-v3" if f == "-march=native" else f for f in native.FLAGS)
from ctrkit.cli import main; sys.exit(main(sys.argv[1:]))'
for r in $(seq 1 "${1:-2}"); do
  for m in dlrm dcnv2 wide_deep; do
    for kind in avx2 native; do
      if [ $kind = avx2 ]; then
        env OMP_WAIT_POLICY=PASSIVE "${AVX2[@]}" .venv/bin/python -c "$V3" bench train --model "$m" --threads 2 \
          --repeats 3 --steps 20 --output "$OUT/${m}_${kind}_r$r.json" > /dev/null
      else
        env OMP_WAIT_POLICY=PASSIVE .venv/bin/python -m ctrkit bench train --model "$m" --threads 2 \
          --repeats 3 --steps 20 --output "$OUT/${m}_${kind}_r$r.json" > /dev/null
      fi
    done
  done
done
.venv/bin/python benchmarks/summarize_runs.py "$OUT" model kind
