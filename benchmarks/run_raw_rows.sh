#!/usr/bin/env bash
# Raw rows in, clicks out (`ctrkit bench raw-rows`): `predict --input` of ROWS new CSV rows (and twice as many)
# end to end with a DLRM of the default shape trained on a 200,000-row click log, and one-row raw-value and id
# requests to a real `ctrkit serve` on loopback. Usage: bash benchmarks/run_raw_rows.sh (after `make install`;
# ROWS=1000000 ROUNDS=3 REQUESTS=2000 by default); the result goes to benchmarks/results/raw-rows/KIND.json
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_WAIT_POLICY=PASSIVE
ROWS=${ROWS:-1000000}
ROUNDS=${ROUNDS:-3}
REQUESTS=${REQUESTS:-2000}
raw=build/bench/raw-rows-raw
rm -rf "$raw"
mkdir -p "$raw"
.venv/bin/ctrkit bench raw-rows --rows "$ROWS" --rounds "$ROUNDS" --requests "$REQUESTS" --output "$raw/raw_rows.json"
.venv/bin/python benchmarks/collect.py raw-rows "$raw" \
  --command "ROWS=$ROWS ROUNDS=$ROUNDS REQUESTS=$REQUESTS bash benchmarks/run_raw_rows.sh"
