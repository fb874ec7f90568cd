#!/usr/bin/env bash
# Wide & Deep: the CPU dropout applying its mask with where (5b72dd5) against a product, fp32 and bf16,
# 3 interleaved rounds (the results.txt run had 3 more fp32 rounds: ROUNDS=6 PRECISIONS=fp32).
set -euo pipefail
cd "$(dirname "$0")/../../.."
MODEL=wide_deep OUT=benchmarks/results/dropout bash benchmarks/ab_train.sh
