#!/usr/bin/env bash
# The prepared GPU check (issue 69), for one GPU with PyTorch and ctrkit's dependencies installed (no network
# needed), in about 7 minutes: FL15 data made once (ROWS rows, `ctrkit synth --tables criteo-1tb`);
# ctrkit's step against plain PyTorch in fp32, TF32 and bf16 (same batches, interleaved); `ctrkit train --recipe
# nvidia` end to end in each precision, with the start to the first step; where the bf16 step's time goes
# (profile); the loader alone and fed to the GPU; the
# training loop's host synchronisations; the host-memory tier with the GPU capped at half the tables' size; a
# run resumed from its checkpoint (benchmarks/gpu_check.py says what each measures); the accuracy panel's
# synthetic data sets in each precision; the CUDA tests.
# Each part has its own time limit, and a part that fails leaves the others running. The raw JSON of each part
# and its log go to RAW (default build/bench/gpu), then collect.py condenses them into
# benchmarks/results/gpu/<the GPU's kind>.json and render.py rewrites docs/benchmarks.md.
#   bash benchmarks/run_gpu.sh                          everything
#   RAW=/tmp/gpu ROWS=1000000 bash benchmarks/run_gpu.sh   smaller data, the raw files elsewhere
#   BUDGET=500 bash benchmarks/run_gpu.sh               each part's limit cut to what is left of 500 s (the parts
#                                                       that no longer fit are skipped, so the collection still runs)
#   PARTS="data e2e" bash benchmarks/run_gpu.sh         only the parts named (data step profile e2e loader syncs
#                                                       host resume accuracy cuda_tests)
#   QUICK=1 bash benchmarks/run_gpu.sh                  every part at a small size (1M rows, a few steps, one
#                                                       model), to find what breaks before the full run
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 OMP_WAIT_POLICY=PASSIVE
PY=${PY:-python3}
QUICK=${QUICK:-}
BUDGET=${BUDGET:-}
PARTS=${PARTS:-}
if [ -n "$QUICK" ]; then ROWS=${ROWS:-1000000}; else ROWS=${ROWS:-4000000}; fi
small() {  # small QUICK_ARGS FULL_ARGS: the arguments of this mode
  if [ -n "$QUICK" ]; then echo "$1"; else echo "$2"; fi
}
DATA=${DATA:-/tmp/ctrkit-gpu/fl15_$ROWS}
RAW=${RAW:-build/bench/gpu}
mkdir -p "$RAW"
started=$(date +%s)
part() {  # part NAME SECONDS COMMAND...: runs it under a time limit, its output in NAME.txt
  local name=$1 limit=$2; shift 2
  if [ -n "$PARTS" ] && [[ " $PARTS " != *" $name "* ]]; then return; fi
  if [ -n "$BUDGET" ]; then
    local left=$(( BUDGET - ($(date +%s) - started) ))
    if [ "$left" -lt 15 ]; then echo "!! $name: skipped, the budget of $BUDGET s is spent"; return; fi
    [ "$left" -lt "$limit" ] && limit=$left
  fi
  echo "== $name (at $(( $(date +%s) - started )) s, limit $limit s)"
  timeout "$limit" "$@" > "$RAW/$name.txt" 2>&1
  local rc=$?
  tail -3 "$RAW/$name.txt"
  [ $rc -eq 0 ] || echo "!! $name: exit status $rc"
}
{ nvidia-smi -L; $PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"; nproc; } \
  > "$RAW/machine.txt" 2>&1
cat "$RAW/machine.txt"
[ -f "$DATA/feature_spec.yaml" ] || part data 120 $PY -m ctrkit synth --out "$DATA" --rows "$ROWS" \
  --tables criteo-1tb --seed 0 --overwrite
part step 100 $PY benchmarks/gpu_check.py step --dataset "$DATA" --out "$RAW" \
  $(small "--steps 3 --rounds 1 --warmup 1" "")
part profile 60 $PY benchmarks/gpu_check.py profile --dataset "$DATA" --out "$RAW" $(small "--steps 2 --warmup 1" "--steps 10")
part e2e 150 $PY benchmarks/gpu_check.py e2e --dataset "$DATA" --out "$RAW" $(small "--max-steps 8 --print-freq 2" "")
part loader 45 $PY -m ctrkit bench loader --dataset "$DATA" --device cuda --output "$RAW/loader.json" \
  $(small "--batches 5 --rounds 1" "--batches 30 --rounds 3")
part syncs 45 $PY benchmarks/gpu_check.py syncs --dataset "$DATA" --out "$RAW" --steps "$(small 3 10)"
part host 120 env PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True $PY benchmarks/gpu_check.py host \
  --dataset "$DATA" --out "$RAW" --steps "$(small 8 40)"
part resume 120 $PY benchmarks/gpu_check.py resume --dataset "$DATA" --out "$RAW" \
  $(small "--max-steps 4 --print-freq 2" "")
# what a default precision is decided on: the planted and tabular data sets (made here, with their Bayes
# AUC) trained by each model in each precision, no baseline (logistic regression took 56 s of the H200's 150);
# the panel keeps every run it finished when the limit stops it
part accuracy 150 $PY -m ctrkit bench accuracy --seeds 0 \
  $(small "--panel planted --planted-rows 20000 --models dlrm" \
    "--panel planted,tabular --planted-rows 120000 --tabular-rows 120000") \
  --baselines none --precisions fp32,tf32,bf16 --work /tmp/ctrkit-gpu/accuracy --out "$RAW/accuracy"
# the CUDA tests last, so that a run cut short by its budget loses them rather than the figures
part cuda_tests 150 $PY -m pytest -q -p no:cacheprovider tests/distributed/test_cuda.py tests/test_precision.py \
  tests/data/test_device_feed.py tests/train/test_tiered_tables.py -k "cuda or gpu or GPU"
[ -f "$RAW/accuracy/results.json" ] && cp "$RAW/accuracy/results.json" "$RAW/accuracy.json"
if [ -z "$QUICK" ]; then  # a quick run's figures are not the suite's
  $PY benchmarks/collect.py gpu "$RAW" --command "bash benchmarks/run_gpu.sh" && $PY benchmarks/render.py
fi
echo "done in $(( $(date +%s) - started )) s: $RAW"
