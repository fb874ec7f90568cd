#!/usr/bin/env bash
# Batch 256 and 512 against the default 1024 on the ten independent tables and the three real samples of
# the panel (after build.sh and `ctrkit bench accuracy`, which builds build/accuracy/{criteo,avazu,movielens}).
set -euo pipefail
for d in independent/benefits independent/doctorcontacts independent/hi independent/insteval independent/males \
  independent/movies independent/rwm5yr independent/verbagg independent/vietnam independent/vocab accuracy/criteo \
  accuracy/avazu accuracy/movielens; do
  for m in dlrm dcnv2 wide_deep; do
    for opts in '{}' '{"batch_size": 256}' '{"batch_size": 512}'; do
      OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/results/independent/one_run.py "build/$d" $m "$opts"
    done
  done
done
