#!/usr/bin/env bash
# `ctrkit refresh` day by day (`ctrkit bench refresh`): two clean drifting streams and one with broken days (shuffled
# labels, a renamed column, a column all missing); each day's verdict, progressive AUC, gate and seconds. Usage: bash
# benchmarks/run_refresh.sh   (after `make install`; EXTRA adds flags; the result goes to
# benchmarks/results/refresh/KIND.json)
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_WAIT_POLICY=PASSIVE
raw=${RAW:-build/bench/refresh-raw}
rm -rf "$raw" build/bench/refresh
mkdir -p "$raw"
# shellcheck disable=SC2086
.venv/bin/ctrkit bench refresh ${EXTRA:-} --output "$raw/refresh.json"
.venv/bin/python benchmarks/collect.py refresh "$raw" --command "bash benchmarks/run_refresh.sh"
