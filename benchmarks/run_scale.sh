#!/usr/bin/env bash
# Hybrid-parallel scaling on the Merlin Distributed-Embeddings synthetic models (scaled down 1024x),
# as recorded in benchmarks/README.md: median step time and each rank's peak memory at world sizes 1, 2 and 4 on this machine.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_WAIT_POLICY=PASSIVE
CTRKIT=${CTRKIT:-.venv/bin/ctrkit}
"$CTRKIT" bench scale --models tiny,small --scale 1024 --world-sizes 1,2,4 --output benchmarks/results/scale.json
