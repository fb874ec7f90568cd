#!/usr/bin/env bash
# The CUDA checks, for a machine with a GPU and PyTorch already installed (no network needed).
#   scripts/cuda_check.sh tests   the CUDA-marked tests, then the suites that train, with CUDA as the
#                                 run-time device (suites needing packages such a machine may lack -
#                                 polars, lightgbm, tritonclient, pyspark - are left out)
#   scripts/cuda_check.sh demo    `make demo`'s run on one GPU
#   scripts/cuda_check.sh bench [BATCH...]   `ctrkit bench train` per model, fp32 / fp16 / bf16 autocast
#   scripts/cuda_check.sh native  the C kernels (ctrkit/native) on that machine: their tests and the CUDA tests
#                                 (CUDA training must keep ATen's operations), DLRM's CUDA bench at 65,536, and
#                                 the host CPU's DLRM bench with the kernels against CTRKIT_NATIVE=0, 2 rounds
#   scripts/cuda_check.sh split   the step split over threads on the host CPU (all its cores): the split tests,
#                                 then DLRM and DCNv2 fp32 at batch 2,048 and 16,384 with --split-batch off
#                                 and auto, 2 interleaved rounds (measured so far on 2 cores only)
# Logs and benchmark JSONs go to ${OUT:-/tmp/cuda} (the JSONs packed in one bench_json.tar); unpacked, the bench
# JSONs become benchmarks/results/train-cuda/KIND.json with `python benchmarks/collect.py train-cuda DIR`.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/cuda}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 OMP_WAIT_POLICY=PASSIVE
what=${1:-tests}; shift || true
{ nvidia-smi -L; python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name(0))"; } 2>&1 | tee "$OUT/machine.txt"
case $what in
  tests)
    python3 -m pytest -q -p no:cacheprovider tests/distributed/test_cuda.py tests/test_precision.py tests/data/test_device_feed.py tests/train/test_tiered_tables.py 2>&1 | tee "$OUT/cuda_tests.txt"
    python3 -m pytest -q -p no:cacheprovider tests/train tests/models tests/distributed tests/test_checkpoint.py \
      tests/test_cli.py tests/test_api.py tests/eval 2>&1 | tail -60 | tee "$OUT/suite.txt" ;;
  demo)
    python3 -m ctrkit synth --out /tmp/demo --rows 300000 --seed 0 --overwrite 2>&1 | tail -1
    ( time python3 -m ctrkit train --model dlrm --dataset /tmp/demo --epochs 1 --no-progress \
        --save-checkpoint /tmp/demo/dlrm.pt ) 2>&1 | tail -8 | tee "$OUT/demo.txt"
    python3 -m ctrkit evaluate --checkpoint /tmp/demo/dlrm.pt --dataset /tmp/demo --mapping test 2>&1 \
      | tail -1 | tee -a "$OUT/demo.txt" ;;
  bench)
    mkdir -p /tmp/bench_json
    for b in "${@:-2048}"; do for m in dlrm dcnv2 wide_deep; do
      python3 -m ctrkit bench train --model "$m" --batch-size "$b" --output "/tmp/bench_json/${m}_${b}_fp32.json" 2>&1 | tail -1
      for p in fp16 bf16; do
        python3 -m ctrkit bench train --model "$m" --batch-size "$b" --amp --amp-dtype $p \
          --output "/tmp/bench_json/${m}_${b}_$p.json" 2>&1 | tail -1
      done
    done; done | grep -v '^wrote' | tee "$OUT/bench.txt"
    tar -C /tmp -cf "$OUT/bench_json.tar" bench_json ;;
  native)
    { lscpu | grep -E 'Model name|^CPU\(s\)|Thread|Flags' | cut -c1-400; cc --version | head -1; } 2>&1 | tee -a "$OUT/machine.txt"
    python3 -m pytest -q -p no:cacheprovider tests/native tests/train/test_optim.py tests/distributed/test_cuda.py \
      tests/test_precision.py 2>&1 | tail -30 | tee "$OUT/native_tests.txt"
    mkdir -p /tmp/bench_json
    for p in fp32 bf16; do
      python3 -m ctrkit bench train --model dlrm --batch-size 65536 $([ $p = bf16 ] && echo --amp --amp-dtype bf16) \
        --output "/tmp/bench_json/cuda_dlrm_65536_$p.json" 2>&1 | grep -v '^wrote' | tail -2
    done | tee "$OUT/bench_cuda.txt"
    for r in 1 2; do for p in fp32 bf16; do for n in 1 0; do
      echo -n "round $r $p CTRKIT_NATIVE=$n: "
      CTRKIT_NATIVE=$n python3 -m ctrkit bench train --device cpu --model dlrm --batch-size 2048 \
        $([ $p = bf16 ] && echo --amp) --output "/tmp/bench_json/cpu_dlrm_${p}_native${n}_r$r.json" 2>&1 \
        | grep -v '^wrote' | tail -2
    done; done; done | tee "$OUT/bench_cpu.txt"
    tar -C /tmp -cf "$OUT/bench_json.tar" bench_json ;;
  split)
    { lscpu | grep -E 'Model name|^CPU\(s\)|Thread' | cut -c1-200; } 2>&1 | tee -a "$OUT/machine.txt"
    python3 -m pytest -q -p no:cacheprovider tests/train/test_split.py 2>&1 | tail -5 | tee "$OUT/split_tests.txt"
    mkdir -p /tmp/bench_json
    for r in 1 2; do for m in dlrm dcnv2; do for b in 2048 16384; do for s in off auto; do
      echo -n "round $r $m batch $b split $s: "
      python3 -m ctrkit bench train --device cpu --model "$m" --batch-size "$b" --repeats 3 --steps 10 \
        --split-batch $s --output "/tmp/bench_json/cpu_${m}_${b}_split_${s}_r$r.json" 2>&1 | grep -v '^wrote' | head -2
    done; done; done; done | tee "$OUT/bench_split.txt"
    tar -C /tmp -cf "$OUT/bench_json.tar" bench_json ;;
esac
