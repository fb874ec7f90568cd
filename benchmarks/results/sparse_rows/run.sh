#!/bin/bash
# How the JSON here was taken (2026-11-24): HEAD before the change checked out in /tmp/old (git worktree), the change in /work/main; 3 interleaved rounds, each model old then new.
export OMP_WAIT_POLICY=PASSIVE
out=${OUT:-$PWD/benchmarks/results/sparse_rows}; mkdir -p $out
for round in 1 2 3; do
  for model in dlrm dcnv2 wide_deep; do
    for code in old new; do
      dir=/tmp/old; [ $code = new ] && dir=/work/main
      steps=20; [ $model = wide_deep ] && steps=8
      (cd $dir && /work/main/.venv/bin/python -m ctrkit bench train --model $model --breakdown --threads 2 --repeats 3 --steps $steps --output $out/${model}_${code}_$round.json > $out/${model}_${code}_$round.log 2>&1) || echo fail
    done
  done
done
