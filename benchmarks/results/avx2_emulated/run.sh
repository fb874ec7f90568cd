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
.venv/bin/python - "$OUT" <<'PY'
import collections, glob, json, statistics, sys
rows = collections.defaultdict(list)
for f in sorted(glob.glob(f"{sys.argv[1]}/*_r*.json")):
    model, kind, _ = f.rsplit("/", 1)[1].rsplit("_", 2)
    j = json.load(open(f))
    rows[(model, kind)].append((j["samples_per_s"], j["fraction_of_peak"], j["matmul_peak_gflops"]["fp32"],
                                j["machine"]["capability"]))
print(f"{'model':10s} {'kind':7s} capability  samples/s (rounds)     fp32 peak GFLOP/s (rounds)   fraction of peak")
for (model, kind), v in sorted(rows.items()):
    print(f"{model:10s} {kind:7s} {v[0][3]:10s} {statistics.median(x[0] for x in v):9,.0f} {[round(x[0]) for x in v]}  "
          f"{[round(x[2]) for x in v]}  {statistics.median(x[1] for x in v):.0%} {[f'{x[1]:.0%}' for x in v]}")
PY
