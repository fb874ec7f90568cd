#!/usr/bin/env bash
# Real Triton Inference Server on this machine's CPU, serving a model repository written by `ctrkit export --format
# triton` (`--backend python` for raw values): the tritonserver binary and Python backend of the nvidia-pytriton
# wheel (installed into .venv by `make triton`), the backend's stub running in .venv-triton, an environment with
# ctrkit and NumPy < 2 (the stub's BYTES tensors are built for NumPy 1's array layout: under NumPy 2 every string
# input arrives garbled). Usage: scripts/tritonserver.sh MODEL_REPOSITORY [HTTP_PORT [TRITON_FLAGS...]]; HTTP on
# 127.0.0.1 only; TRITON_FLAGS go to tritonserver as they are (e.g. --model-control-mode=poll
# --repository-poll-secs=5, which `ctrkit refresh` publishes to). Without a --model-control-mode, the models are
# loaded at start in explicit mode, so a client may unload and load them (tritonclient's load_model, unload_model).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
REPO="$(cd "${1:?usage: scripts/tritonserver.sh MODEL_REPOSITORY [HTTP_PORT]}" && pwd)"
PORT="${2:-8000}"
shift $(( $# < 2 ? $# : 2 ))
SITE="$("$ROOT/.venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
TRITON="$SITE/pytriton/tritonserver"
STUB_ENV="$ROOT/.venv-triton"
if [ ! -x "$TRITON/bin/tritonserver" ] || [ ! -x "$STUB_ENV/bin/python" ]; then
  echo "tritonserver.sh: no Triton here: run 'make triton' first (it installs nvidia-pytriton and .venv-triton)" >&2
  exit 2
fi
VERSION="$("$STUB_ENV/bin/python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
BACKENDS="$(mktemp -d)"
trap 'rm -rf "$BACKENDS"' EXIT
mkdir "$BACKENDS/python"
cp "$TRITON/backends/python/libtriton_python.so" "$TRITON/backends/python/triton_python_backend_utils.py" \
  "$TRITON/python_backend_stubs/$VERSION/triton_python_backend_stub" "$BACKENDS/python/"
# the stub's Python finds its environment through the first python3 on PATH
MODE=(--model-control-mode=explicit "--load-model=*")
for flag in "$@"; do
  case "$flag" in --model-control-mode*) MODE=() ;; esac
done
PATH="$STUB_ENV/bin:$PATH" LD_LIBRARY_PATH="$SITE/nvidia_pytriton.libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
  "$TRITON/bin/tritonserver" --model-repository "$REPO" --backend-directory "$BACKENDS" \
  --http-address 127.0.0.1 --http-port "$PORT" --allow-grpc false --allow-metrics false --exit-timeout-secs 5 ${MODE[@]+"${MODE[@]}"} "$@" &
SERVER=$!
trap 'kill $SERVER 2>/dev/null; wait $SERVER 2>/dev/null; rm -rf "$BACKENDS"' EXIT INT TERM
wait $SERVER
