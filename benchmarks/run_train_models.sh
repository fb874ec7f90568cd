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
.venv/bin/python benchmarks/collect.py train-models "$raw" --command "bash benchmarks/run_train_models.sh"
