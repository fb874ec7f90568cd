#!/usr/bin/env bash
# `make demo` as a user runs it, its output kept: the train summary line, evaluate's line and `evaluate --json`,
# which the README and docs/training.md quote (benchmarks/render.py writes them there from the result file).
# Usage: bash benchmarks/run_demo.sh; the result goes to benchmarks/results/demo/KIND.json
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_WAIT_POLICY=PASSIVE
raw=build/bench/demo-raw
rm -rf "$raw"
mkdir -p "$raw"
make demo > "$raw/demo.log" 2>&1
.venv/bin/ctrkit evaluate --checkpoint build/demo/dlrm.pt --dataset build/demo/data --json > "$raw/evaluate.json"
.venv/bin/python - "$raw" <<'PY'
import json, sys
from pathlib import Path

from ctrkit.bench.peak import machine

raw = Path(sys.argv[1])
lines = (raw / "demo.log").read_text().splitlines()
result = {
    "machine": machine(),
    "train_line": next(x for x in lines if x.startswith("done: ")),
    "evaluate_line": next(x for x in lines if " on test: AUC " in x and x.split()[1] == "step"),
    "evaluate_json": (raw / "evaluate.json").read_text().strip(),
}
(raw / "demo.json").write_text(json.dumps(result, indent=1) + "\n")
PY
rm "$raw/evaluate.json"
.venv/bin/python benchmarks/collect.py demo "$raw/demo.json" --command "bash benchmarks/run_demo.sh"
