#!/usr/bin/env bash
# Day by day on a drifting table of text columns (`ctrkit bench table-stream`, DAYS days of ROWS rows in
# build/bench/table-stream): each day preprocessed `--like` the previous day's model and continued, every text column
# as raw ids in dynamic tables continued, and retraining from scratch on all days so far; next-day AUC from the raw
# rows, seconds and table rows per test day. Usage: bash benchmarks/run_table_stream.sh   (after `make install`;
# DAYS=6 ROWS=100000 by default, EXTRA adds flags; the result goes to benchmarks/results/table-stream/KIND.json)
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_WAIT_POLICY=PASSIVE
DAYS=${DAYS:-6}
ROWS=${ROWS:-100000}
raw=${RAW:-build/bench/table-stream-raw}
rm -rf "$raw"
mkdir -p "$raw"
# shellcheck disable=SC2086
.venv/bin/ctrkit bench table-stream --days "$DAYS" --rows "$ROWS" ${EXTRA:-} --output "$raw/table_stream.json"
.venv/bin/python benchmarks/collect.py table-stream "$raw" \
  --command "DAYS=$DAYS ROWS=$ROWS${EXTRA:+ EXTRA=\"$EXTRA\"} bash benchmarks/run_table_stream.sh"
