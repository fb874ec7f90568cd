#!/usr/bin/env bash
# Hybrid-parallel scaling on the Merlin Distributed-Embeddings synthetic models (scaled down 1024x),
# kept in benchmarks/results/scale/KIND.json: median step time and each rank's peak memory at world sizes 1, 2 and 4 on this machine.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_WAIT_POLICY=PASSIVE
CTRKIT=${CTRKIT:-.venv/bin/ctrkit}
mkdir -p build/bench/scale
"$CTRKIT" bench scale --models tiny,small --scale 1024 --world-sizes 1,2,4 --output build/bench/scale/scale.json
.venv/bin/python benchmarks/collect.py scale build/bench/scale --command "bash benchmarks/run_scale.sh"
