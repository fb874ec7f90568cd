#!/usr/bin/env bash
# What each mechanism of the default recipe earns: DLRM with the recipe and with each mechanism switched alone,
# on the accuracy panel's real samples, tabular data and shop logs, and on planted data (`ctrkit synth planted`,
# generated here) of 300,000 and 2,000,000 training rows, over the training seeds SEEDS. Results are appended run
# by run; an interrupted run resumes where it stopped.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_WAIT_POLICY=PASSIVE
OUT="${OUT:-build/bench/ablation}"
for rows in 300k:333333 2m:2222222; do
    dir="build/accuracy/planted-${rows%%:*}"
    [ -f "$dir/feature_spec.yaml" ] || .venv/bin/ctrkit synth planted --out "$dir" --rows "${rows##*:}" \
        --test-fraction 0.1 --seed 0
done
.venv/bin/ctrkit bench ablation --panel criteo,avazu,movielens,tabular,shop --tabular-rows 120000 --shop-rows 60000 \
    --datasets build/accuracy/planted-300k build/accuracy/planted-2m --train-seeds "${SEEDS:-0,1,2}" \
    --work build/accuracy --out "$OUT"
.venv/bin/python benchmarks/collect.py ablation "$OUT/results.json" --command "bash benchmarks/run_ablation.sh" \
    --kind "${KIND:?name the machine kind, e.g. KIND=cpu-avx512}"
