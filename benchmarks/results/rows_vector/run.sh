#!/bin/bash
# In-process A/B, C kernels without / with -fno-math-errno, whole DLRM / DCNv2 / Wide & Deep steps (2 threads).
# usage: bash benchmarks/results/rows_vector/run.sh ROUNDS > benchmarks/results/rows_vector/ab.txt
set -e
export OMP_WAIT_POLICY=PASSIVE
here=$(dirname "$0")
py=${PYTHON:-.venv/bin/python}
for m in dlrm dcnv2 wide_deep; do
  "$py" "$here/ab.py" $m "${1:-6}" 20
  "$py" "$here/ab.py" $m "${1:-6}" 20 amp
done
