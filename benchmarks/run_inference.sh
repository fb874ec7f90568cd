#!/usr/bin/env bash
# Inference throughput and latency on the Criteo-Kaggle DLRM shape (26 x 100,000 x 16, randomly
# initialised), kept in benchmarks/results/inference/KIND.json: in process for each runtime, then through a real
# `ctrkit serve` (ONNX Runtime float32 and int8, compiled bf16 PyTorch) with batch-1 requests from 1 client (latency) and
# batch-1024 binary requests from 4 clients (throughput).
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_WAIT_POLICY=PASSIVE
PY=${PY:-.venv/bin/python}
OUT=build/bench/inference
WORK=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT
mkdir -p "$OUT"
"$PY" -m ctrkit bench inference --kaggle-shape --batch-sizes 1,64,1024,4096 --repeats 3 --output "$OUT/in_process.json"
"$PY" -c "from pathlib import Path; from ctrkit.bench.inference_bench import kaggle_checkpoint; kaggle_checkpoint(Path('$WORK/kaggle.pt'))"
"$PY" -m ctrkit export --checkpoint "$WORK/kaggle.pt" --format onnx --out "$WORK/onnx"
"$PY" -m ctrkit export --checkpoint "$WORK/kaggle.pt" --format onnx --quantize int8 --out "$WORK/onnx_int8"
for variant in onnx onnx_int8 bf16_compiled; do
    case "$variant" in
        onnx*) src=(--model-dir "$WORK/$variant") ;;
        *) src=(--checkpoint "$WORK/kaggle.pt" --dtype bf16 --compile) ;;
    esac
    "$PY" -m ctrkit serve "${src[@]}" --port 8311 &
    server=$!
    for _ in $(seq 60); do curl -sf http://127.0.0.1:8311/v2/health/ready >/dev/null && break; sleep 0.5; done
    "$PY" -m ctrkit bench inference --server 127.0.0.1:8311 --batch-sizes 1 --requests 2000 --concurrency 1 \
        --output "$OUT/server_${variant}_batch1.json"
    "$PY" -m ctrkit bench inference --server 127.0.0.1:8311 --batch-sizes 1024 --requests 400 --concurrency 4 \
        --output "$OUT/server_${variant}_batch1024.json"
    kill "$server"; wait "$server" 2>/dev/null || true
done
.venv/bin/python benchmarks/collect.py inference "$OUT" --command "bash benchmarks/run_inference.sh"
