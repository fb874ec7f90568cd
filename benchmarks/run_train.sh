#!/usr/bin/env bash
# Training throughput of DLRM on the Criteo-Kaggle shape (`ctrkit bench train` defaults).
# Four variants, interleaved over ROUNDS rounds so that the machine's drifting load hits them all
# alike; each run reports the median of 5 x 50 timed steps, and the summary takes the median over
# rounds. Usage: bash benchmarks/run_train.sh   (after `make install`)
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_WAIT_POLICY=PASSIVE  # spinning OpenMP threads cost up to 5x when another process competes
ROUNDS=${ROUNDS:-3}
out=benchmarks/results
raw=$(mktemp -d)
trap 'rm -rf "$raw"' EXIT
mkdir -p "$out"
declare -A flags=([fp32]="" [bf16]="--amp" [fp32_dense_grad]="--dense-gradients" [bf16_dense_grad]="--amp --dense-gradients")
for round in $(seq "$ROUNDS"); do
  for v in fp32 bf16 fp32_dense_grad bf16_dense_grad; do
    # shellcheck disable=SC2086
    .venv/bin/ctrkit bench train --steps 50 --repeats 5 ${flags[$v]} --output "$raw/${v}_${round}.json" | grep samples/s
  done
done
RAW="$raw" OUT="$out" .venv/bin/python - <<'PY'
import json, os, pathlib, statistics
raw, out = pathlib.Path(os.environ["RAW"]), pathlib.Path(os.environ["OUT"])
rows = []
for v in ("fp32", "bf16", "fp32_dense_grad", "bf16_dense_grad"):
    runs = [json.loads(p.read_text()) for p in sorted(raw.glob(f"{v}_*.json"))]
    sps = [r["samples_per_s"] for r in runs]
    best = dict(runs[0])
    best.pop("ms_per_step_all", None)
    summary = {**best, "samples_per_s": statistics.median(sps), "ms_per_step": statistics.median(r["ms_per_step"] for r in runs),
               "samples_per_s_per_round": sps, "rounds": len(runs),
               "command": "bash benchmarks/run_train.sh"}
    (out / f"train_dlrm_{v}.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    rows.append((v, summary))
base = {r[0]: r[1]["samples_per_s"] for r in rows}
print("| variant | precision | embedding gradients | samples/s (median) | per round | vs dense fp32 |")
print("| --- | --- | --- | ---: | --- | ---: |")
for v, s in rows:
    grads = "dense" if s["config"]["dense_gradients"] else "sparse"
    per = ", ".join(f"{x:,.0f}" for x in s["samples_per_s_per_round"])
    print(f"| {v} | {s['amp_dtype'] or 'fp32'} | {grads} | {s['samples_per_s']:,.0f} | {per} | "
          f"{s['samples_per_s'] / base['fp32_dense_grad']:.2f}x |")
PY
