#!/usr/bin/env bash
# `ctrkit refresh` day by day (`ctrkit bench refresh`) on both families of logs: the drifting text-column stream and
# the e-commerce shop log (a day: 4,320 rows), each as two clean logs and one with broken days (shuffled labels, a
# renamed column, a column all missing); each day's verdict, progressive AUC, gate and seconds, retraining and a
# logistic regression beside them; the stream's versions served across swaps. Usage: bash benchmarks/run_refresh.sh
# (after `make install`, and `make triton` for the Triton part; EXTRA adds flags to both; the result goes to
# benchmarks/results/refresh/KIND.json)
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_WAIT_POLICY=PASSIVE
raw=${RAW:-build/bench/refresh-raw}
rm -rf "$raw" build/bench/refresh build/bench/refresh-shop
mkdir -p "$raw"
# shellcheck disable=SC2086
.venv/bin/ctrkit bench refresh ${EXTRA:-} --output "$raw/stream.json"
# shellcheck disable=SC2086
.venv/bin/ctrkit bench refresh --family shop --rows 4320 --no-swaps --work build/bench/refresh-shop ${EXTRA:-} \
  --output "$raw/shop.json"
.venv/bin/python benchmarks/collect.py refresh "$raw" --command "bash benchmarks/run_refresh.sh"
