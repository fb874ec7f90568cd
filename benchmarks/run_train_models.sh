#!/usr/bin/env bash
# Training throughput of every model at the Criteo-Kaggle shape, each with its own default optimizers
# and with plain sparse SGD, fp32 and bf16, interleaved over ROUNDS rounds (median reported).
# Usage: bash benchmarks/run_train_models.sh   (after `make install`)
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_WAIT_POLICY=PASSIVE
ROUNDS=${ROUNDS:-3}
raw=build/bench/train-models
rm -rf "$raw"
mkdir -p "$raw"
for round in $(seq "$ROUNDS"); do
  for model in dlrm dcnv2; do
    for opt in default sgd; do
      for prec in fp32 bf16; do
        args=(--model "$model" --steps 30 --repeats 3)
        [ "$prec" = bf16 ] && args+=(--amp)
        [ "$opt" = sgd ] && args+=(--optimizer sgd --embedding-optimizer sgd)
        .venv/bin/ctrkit bench train "${args[@]}" --output "$raw/${model}_${opt}_${prec}_${round}.json" | grep samples/s
      done
    done
  done
done
.venv/bin/python - <<'PY'
import json, pathlib, statistics
raw = pathlib.Path("benchmarks/results/raw_models")
groups = {}
for p in sorted(raw.glob("*.json")):
    key = p.stem.rsplit("_", 1)[0]
    groups.setdefault(key, []).append(json.loads(p.read_text()))
print("| model | optimizers (dense/embedding) | precision | samples/s (median) | per round |")
print("| --- | --- | --- | ---: | --- |")
for key, runs in groups.items():
    r = runs[0]
    sps = [x["samples_per_s"] for x in runs]
    print(f"| {r['config']['model']} | {r['optimizers']['dense']}/{r['optimizers']['embedding']} | "
          f"{r['amp_dtype'] or 'fp32'} | {statistics.median(sps):,.0f} | {', '.join(f'{x:,.0f}' for x in sps)} |")
PY
.venv/bin/python benchmarks/collect.py train-models "$raw" --command "bash benchmarks/run_train_models.sh"
