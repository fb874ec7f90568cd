#!/usr/bin/env bash
# One-off probe (kept in git history, not in the tree): predict --input of 1M raw CSV rows and preprocess table of
# 2M rows, the commit before (a worktree at BASE, default /tmp/base: `git worktree add /tmp/base 2e35123`) against
# this tree, interleaved rounds, the same venv (PYTHONPATH picks the tree); wall seconds and peak RSS (/usr/bin/time).
set -euo pipefail
export OMP_WAIT_POLICY=PASSIVE
PY=/work/main/.venv/bin/python
W=${WORK:-/tmp/perf}
mkdir -p "$W"
cd $W
if [ ! -f new.csv ]; then
  $PY -c "
from ctrkit.data.synthetic_clicks import click_log
click_log(200000, 0).write_csv('clicks.csv')
click_log(1000000, 0, first_row=200000).drop('clicked').write_csv('new.csv')
click_log(2000000, 1).write_csv('big.csv')
"
  $PY -m ctrkit preprocess table clicks.csv --out data --label clicked --order-by ts --integers categorical --no-progress --overwrite >/dev/null
  $PY -m ctrkit train --dataset data --max-steps 300 --no-progress --save-checkpoint dlrm.pt >/dev/null 2>&1
fi
for round in 1 2 3; do
  for tree in base head; do
    if [ $tree = base ]; then export PYTHONPATH=${BASE:-/tmp/base}; else export PYTHONPATH=/work/main; fi
    /usr/bin/time -f "$tree predict round $round: %e s %M KiB" $PY -m ctrkit predict --checkpoint dlrm.pt --input new.csv --out scores_$tree.csv --no-progress >/dev/null
    /usr/bin/time -f "$tree preprocess round $round: %e s %M KiB" $PY -m ctrkit preprocess table big.csv --out big_$tree --label clicked --order-by ts --integers categorical --no-progress --overwrite >/dev/null
  done
done
unset PYTHONPATH
$PY -c "
import polars as pl, numpy as np
a, b = pl.read_csv('scores_base.csv')['probability'].to_numpy(), pl.read_csv('scores_head.csv')['probability'].to_numpy()
print('predict scores equal:', a.shape == b.shape and np.array_equal(a, b), 'max diff', float(np.abs(a - b).max()))
import filecmp, os
same = all(filecmp.cmp(f'big_base/{m}/{f}', f'big_head/{m}/{f}', shallow=False) for m in ('train', 'test') for f in os.listdir(f'big_base/{m}'))
print('preprocess files equal:', same)
"
