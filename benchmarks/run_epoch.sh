#!/usr/bin/env bash
# One DLRM training epoch over a Criteo-1TB-shaped dataset (`ctrkit synth --tables criteo-1tb`, ROWS rows,
# made once in build/bench/epoch and kept): samples/s and resident memory in each 5% of the epoch, the seconds
# of every phase, and the Criteo 1TB epoch that rate implies.
# Usage: ROWS=100000000 bash benchmarks/run_epoch.sh   (after `make install`; EXTRA="--embedding-dim 16" adds
# flags; the result goes to benchmarks/results/epoch/KIND.json)
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_WAIT_POLICY=PASSIVE
ROWS=${ROWS:-100000000}
raw=${RAW:-build/bench/epoch-raw}
rm -rf "$raw"
mkdir -p "$raw"
# shellcheck disable=SC2086
.venv/bin/ctrkit bench epoch --rows "$ROWS" ${EXTRA:-} --output "$raw/epoch.json"
.venv/bin/python benchmarks/collect.py epoch "$raw" --command "ROWS=$ROWS${EXTRA:+ EXTRA=\"$EXTRA\"} bash benchmarks/run_epoch.sh"
