#!/usr/bin/env bash
# DCNv2 fp32: the cross network through autograd (5b72dd5) against the fused function, 4 interleaved rounds.
set -euo pipefail
cd "$(dirname "$0")/../../.."
MODEL=dcnv2 PRECISIONS=fp32 ROUNDS=4 OUT=benchmarks/results/dcnv2_cross bash benchmarks/ab_train.sh
