#!/usr/bin/env bash
# Each model's matrix-multiply FLOPs per sample and the fraction of the machine's matmul peak its
# training reaches (peak measured in the same run), fp32 and bf16 autocast (fp32 on a CPU without
# native bf16), default optimizers, Criteo-Kaggle shape, interleaved over ROUNDS rounds (medians).
# Usage: bash benchmarks/run_flops.sh   (after `make install`; RAW=DIR writes the JSON there instead of
# build/bench/flops, which is replaced; the medians go to benchmarks/results/flops/KIND.json)
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_WAIT_POLICY=PASSIVE
ROUNDS=${ROUNDS:-3}
raw=${RAW:-build/bench/flops}
rm -rf "$raw"
mkdir -p "$raw"
for round in $(seq "$ROUNDS"); do
  for model in dlrm dcnv2 wide_deep; do
    for prec in fp32 bf16; do
      args=(--model "$model" --steps 10 --repeats 3 --warmup 5)
      [ "$prec" = bf16 ] && args+=(--amp)
      .venv/bin/ctrkit bench train "${args[@]}" --output "$raw/${model}_${prec}_${round}.json" | grep samples/s
    done
  done
done
RAW="$raw" .venv/bin/python - <<'PY'
import json, os, pathlib, statistics
raw = pathlib.Path(os.environ["RAW"])
groups = {}
for p in sorted(raw.glob("*.json")):
    groups.setdefault(p.stem.rsplit("_", 1)[0], []).append(json.loads(p.read_text()))
m = next(iter(groups.values()))[0]["machine"]
print(f"machine: {m['cpu']}, capability {m['capability']}, native bf16 {m['native_bf16']}, {m['threads']} threads, torch {m['torch']}")
print("| model | precision | samples/s | MFLOP per sample per step | GFLOP/s | matmul peak GFLOP/s | fraction of peak "
      "| paired with each repeat's peak |")
print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
for key, runs in groups.items():
    r = runs[0]
    kind = "bf16" if r["amp_dtype"] else "fp32"
    med = lambda f: statistics.median(f(x) for x in runs)
    print(f"| {r['config']['model']} | {r['amp_dtype'] or 'fp32'} | {med(lambda x: x['samples_per_s']):,.0f} | "
          f"{r['flops_per_sample']['train_step'] / 1e6:.2f} | {med(lambda x: x['achieved_gflops']):,.1f} | "
          f"{med(lambda x: x['matmul_peak_gflops'][kind]):,.0f} | {med(lambda x: x['fraction_of_peak']):.0%} | "
          + (f"{med(lambda x: x['fraction_of_peak_paired']):.0%} |" if "fraction_of_peak_paired" in r else "|"))
PY
.venv/bin/python benchmarks/collect.py flops "$raw" --command "bash benchmarks/run_flops.sh"
