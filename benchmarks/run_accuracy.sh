#!/usr/bin/env bash
# The accuracy panel: every model with its defaults against logistic regression and LightGBM.
# Real samples come from ../shared/data (never copied into the repository); the planted (id interactions)
# tabular (nonlinear numerical effects) and amounts (tabular data as raw amounts) data sets are generated,
# shop (e-commerce logs through `preprocess table`: tags whose effects add or average, an evening effect),
# each with its Bayes-optimal AUC; outbrain: `synth outbrain-raw` files through `preprocess outbrain`.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_WAIT_POLICY=PASSIVE
.venv/bin/ctrkit bench accuracy --planted-rows "${PLANTED_ROWS:-120000,360000}" \
    --tabular-rows "${TABULAR_ROWS:-120000,360000}" --amounts-rows "${AMOUNTS_ROWS:-120000}" \
    --outbrain-rows "${OUTBRAIN_ROWS:-200000}" --shop-rows "${SHOP_ROWS:-60000,300000}" --seeds "${SEEDS:-0,1}" \
    --work build/accuracy --out "${OUT:-build/bench/accuracy}"
.venv/bin/python benchmarks/collect.py accuracy "${OUT:-build/bench/accuracy}/results.json" --command "bash benchmarks/run_accuracy.sh"
