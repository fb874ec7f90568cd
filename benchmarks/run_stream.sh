#!/usr/bin/env bash
# Day by day on a drifting stream of raw ids (`ctrkit synth stream`, DAYS days of ROWS rows, in build/bench/stream):
# a fixed day-1 vocabulary trained once, a new vocabulary retrained from scratch on all days so far, and dynamic
# tables continued each day on that day alone; test AUC, log loss, training seconds and table rows per test day.
# Usage: bash benchmarks/run_stream.sh   (after `make install`; DAYS=8 ROWS=200000 by default, EXTRA adds flags;
# the result goes to benchmarks/results/stream/KIND.json)
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_WAIT_POLICY=PASSIVE
DAYS=${DAYS:-8}
ROWS=${ROWS:-200000}
raw=${RAW:-build/bench/stream-raw}
rm -rf "$raw"
mkdir -p "$raw"
# shellcheck disable=SC2086
.venv/bin/ctrkit bench stream --days "$DAYS" --rows "$ROWS" ${EXTRA:-} --output "$raw/stream.json"
.venv/bin/python benchmarks/collect.py stream "$raw" --command "DAYS=$DAYS ROWS=$ROWS bash benchmarks/run_stream.sh"
