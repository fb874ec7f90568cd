#!/usr/bin/env bash
# Preprocessing throughput and peak memory per engine, kept in benchmarks/results/preprocess/KIND.json.
# Generates raw Criteo-format files (2M and 8M rows, ~0.5 and ~1.8 GB) once under $WORK, then times
# `ctrkit preprocess criteo` as a child process: Polars on both sizes (peak memory must not grow with
# the input), Spark local[2] on 2M rows. Polars times are medians of 7 (2M) and 3 (8M) runs.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_WAIT_POLICY=PASSIVE
CTRKIT=${CTRKIT:-.venv/bin/ctrkit}
WORK=${WORK:-/tmp/ctrkit-bench-preprocess}
OUT=build/bench/preprocess
mkdir -p "$WORK" "$OUT"
[ -f "$WORK/raw2m.tsv" ] || "$CTRKIT" synth criteo --out "$WORK/raw2m.tsv" --rows 2000000 --seed 0
[ -f "$WORK/raw8m.tsv" ] || "$CTRKIT" synth criteo --out "$WORK/raw8m.tsv" --rows 8000000 --seed 1
"$CTRKIT" bench preprocess --input "$WORK/raw2m.tsv" --repeats 7 --output "$OUT/polars_2000000.json"
"$CTRKIT" bench preprocess --input "$WORK/raw8m.tsv" --repeats 3 --output "$OUT/polars_8000000.json"
"$CTRKIT" bench preprocess --input "$WORK/raw2m.tsv" --engine spark --spark-master 'local[2]' \
    --output "$OUT/spark_2000000.json"
.venv/bin/python benchmarks/collect.py preprocess "$OUT" --command "bash benchmarks/run_preprocess.sh"
