#!/usr/bin/env bash
# What the digest of a checkpoint's tensors costs: a 1 GiB checkpoint saved and loaded with and without it,
# interleaved over ROUNDS rounds (medians).
# Usage: bash benchmarks/run_checkpoint.sh   (after `make install`; RAW=DIR writes the JSON there instead of
# build/bench/checkpoint-raw, which is replaced; the medians go to benchmarks/results/checkpoint/KIND.json)
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_WAIT_POLICY=PASSIVE
ROUNDS=${ROUNDS:-9}
raw=${RAW:-build/bench/checkpoint-raw}
rm -rf "$raw"
mkdir -p "$raw"
.venv/bin/ctrkit bench checkpoint --size-mb 1024 --rounds "$ROUNDS" --output "$raw/digest.json"
.venv/bin/python benchmarks/collect.py checkpoint "$raw" --command "bash benchmarks/run_checkpoint.sh"
