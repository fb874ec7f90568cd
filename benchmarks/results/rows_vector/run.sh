#!/bin/bash
# In-process A/B, C kernels without / with -fno-math-errno, whole DLRM / DCNv2 / Wide & Deep steps (2 threads),
# interleaved rounds.
# usage: bash benchmarks/results/rows_vector/run.sh > benchmarks/results/rows_vector/ab.txt
set -e
export OMP_WAIT_POLICY=PASSIVE
here=$(dirname "$0")
py=${PYTHON:-.venv/bin/python}
for amp in "" amp; do
  "$py" "$here/ab.py" dlrm 20 8 $amp
  "$py" "$here/ab.py" dcnv2 20 6 $amp
  "$py" "$here/ab.py" wide_deep 10 3 $amp
done
