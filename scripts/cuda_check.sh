#!/usr/bin/env bash
# The CUDA checks, for a machine with a GPU and PyTorch already installed (no network needed).
#   scripts/cuda_check.sh tests   the CUDA-marked tests, then the suites that train, with CUDA as the
#                                 run-time device (suites needing packages such a machine may lack -
#                                 polars, lightgbm, tritonclient, pyspark - are left out)
#   scripts/cuda_check.sh demo    `make demo`'s run on one GPU
#   scripts/cuda_check.sh bench [BATCH...]   `ctrkit bench train` per model, fp32 / fp16 / bf16 autocast
# Logs and benchmark JSONs go to ${OUT:-/tmp/cuda} (the JSONs packed in one bench_json.tar).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/cuda}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 OMP_WAIT_POLICY=PASSIVE
what=${1:-tests}; shift || true
{ nvidia-smi -L; python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name(0))"; } 2>&1 | tee "$OUT/machine.txt"
case $what in
  tests)
    python3 -m pytest -q -p no:cacheprovider tests/distributed/test_cuda.py tests/test_precision.py 2>&1 | tee "$OUT/cuda_tests.txt"
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
esac
