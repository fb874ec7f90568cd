#!/usr/bin/env bash
# Batch 256 and 512 against the default 1024 on the ten independent tables and the three real samples of
# the panel, as `ctrkit bench accuracy --panel criteo,avazu,movielens,independent` builds them in build/accuracy
# (the run of 2026-11-24 read the same datasets from build/independent/, where the panel's first version put them).
set -euo pipefail
for d in accuracy/benefits accuracy/doctorcontacts accuracy/hi accuracy/insteval accuracy/males \
  accuracy/movies accuracy/rwm5yr accuracy/verbagg accuracy/vietnam accuracy/vocab accuracy/criteo \
  accuracy/avazu accuracy/movielens; do
  for m in dlrm dcnv2 wide_deep; do
    for opts in '{}' '{"batch_size": 256}' '{"batch_size": 512}'; do
      OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/results/independent/one_run.py "build/$d" $m "$opts"
    done
  done
done
