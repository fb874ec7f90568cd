#!/usr/bin/env bash
# The accuracy panel's synthetic families at 50,000 and 2,000,000 rows (the headline panel holds 120,000 and 360,000,
# the shop logs 60,000 and 300,000): planted id interactions, nonlinear numerical effects (tabular) and the shop logs
# (tags' effects added, averaged), every model with its defaults against logistic regression and LightGBM. Hours on
# two cores: ROWS and SEEDS make it smaller.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_WAIT_POLICY=PASSIVE
ROWS="${ROWS:-50000,2000000}"
.venv/bin/ctrkit bench accuracy --panel "${PANEL:-planted,tabular,shop}" --planted-rows "$ROWS" --tabular-rows "$ROWS" \
    --shop-rows "$ROWS" --seeds "${SEEDS:-0}" --work build/accuracy --out "${OUT:-build/bench/accuracy-sizes}"
.venv/bin/python benchmarks/collect.py accuracy-sizes "${OUT:-build/bench/accuracy-sizes}/results.json" \
    --command "bash benchmarks/run_accuracy_sizes.sh"
