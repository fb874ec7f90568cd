#!/usr/bin/env bash
# Peak memory and wall time of `ctrkit preprocess outbrain`: the whole-table code (BEFORE, default 5b72dd5,
# checked out in a git worktree) against this checkout's block code, interleaved over ROUNDS rounds, on
# `synth outbrain-raw --rows ROWS` and on the same files with each clicks row 4 times (4x the clicks rows,
# the other files unchanged). Then every dataset file is compared with diff (summary.json's timings differ).
# Usage: bash benchmarks/results/outbrain_blocks/run.sh > benchmarks/results/outbrain_blocks/results.txt
set -euo pipefail
cd "$(dirname "$0")/../../.."
export OMP_WAIT_POLICY=PASSIVE
ROWS=${ROWS:-2000000}
ROUNDS=${ROUNDS:-2}
BEFORE=${BEFORE:-5b72dd5}
work=${WORK:-build/outbrain_blocks}
py=$PWD/.venv/bin/python
mkdir -p "$work"
[ -d "$work/before" ] || git worktree add --detach "$work/before" "$BEFORE" >/dev/null
[ -d "$work/raw" ] || .venv/bin/ctrkit synth outbrain-raw --out "$work/raw" --rows "$ROWS" --seed 0 >/dev/null
if [ ! -d "$work/raw_x4" ]; then
  mkdir -p "$work/raw_x4"
  for f in "$work"/raw/*; do [ "$(basename "$f")" = clicks_train.csv ] || ln -s "$PWD/$f" "$work/raw_x4/"; done
  "$py" -c "
import sys, numpy as np, polars as pl
c = pl.read_csv(sys.argv[1])
c[np.repeat(np.arange(len(c)), 4)].write_csv(sys.argv[2])" "$work/raw/clicks_train.csv" "$work/raw_x4/clicks_train.csv"
fi
echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, torch capability $("$py" -c 'import torch; print(torch.backends.cpu.get_cpu_capability())'); $(date -u +%F)"
for round in $(seq "$ROUNDS"); do
  for raw in raw raw_x4; do
    for code in before blocks; do
      dir=$PWD; [ "$code" = before ] && dir=$PWD/$work/before
      out=$PWD/$work/out_${code}_$raw
      (cd "$dir" && /usr/bin/time -f "round $round, $raw ($(($(wc -l < "$OLDPWD/$work/$raw/clicks_train.csv") - 1)) clicks rows), $code: peak %M KB, wall %e s" \
        "$py" -m ctrkit preprocess outbrain "$OLDPWD/$work/$raw" --out "$out" --overwrite --no-progress 2>&1 | tail -1)
    done
  done
done
for raw in raw raw_x4; do
  if diff -r -x summary.json "$work/out_before_$raw" "$work/out_blocks_$raw" >/dev/null; then
    echo "$raw: every dataset file byte-identical"
  else
    echo "$raw: the datasets differ"
  fi
done
