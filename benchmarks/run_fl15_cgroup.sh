#!/usr/bin/env bash
# The seeds' DLRM configuration (width 128, SGD) on the seeds' FL15 tables (16.7 GB) inside a 12 GiB memory
# cgroup: train and save, resume and save, evaluate (benchmarks/fl15_cgroup.py; root, for the cgroup). The data
# (1M rows of `ctrkit synth --tables criteo-1tb`) is made once in build/bench/fl15; the run needs about 55 GB of
# free disk (the tables' file, the checkpoint and the next checkpoint while it is written).
# Usage: bash benchmarks/run_fl15_cgroup.sh   (after `make install`; the result goes to
# benchmarks/results/fl15-cgroup/KIND.json)
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_WAIT_POLICY=PASSIVE
data=build/bench/fl15/data
raw=build/bench/fl15-raw
[ -f "$data/feature_spec.yaml" ] || .venv/bin/ctrkit synth --out "$data" --rows 1000000 --tables criteo-1tb
rm -rf "$raw" build/bench/fl15/work
mkdir -p "$raw"
.venv/bin/python benchmarks/fl15_cgroup.py --data "$data" --work build/bench/fl15/work --limit-gib "${LIMIT_GIB:-12}" \
  --output "$raw/fl15.json"
rm -rf build/bench/fl15/work
.venv/bin/python benchmarks/collect.py fl15-cgroup "$raw" --command "bash benchmarks/run_fl15_cgroup.sh"
