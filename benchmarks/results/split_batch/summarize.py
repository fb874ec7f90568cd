"""Summarizes run.sh's JSON: per model and precision, samples/s of --split-batch off and auto per round, their
ratio, and the fp32 fraction of the peak. Usage: python summarize.py [DIR]"""
import json
import statistics
import sys
from pathlib import Path

root = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent)
runs: dict = {}
for f in sorted(root.glob("*_*_*_*.json")):
    model, prec, split, r = f.stem.rsplit("_", 3)
    runs.setdefault((model, prec), {}).setdefault(split, {})[int(r)] = json.loads(f.read_text())
machine = None
for (model, prec), d in sorted(runs.items()):
    rounds = sorted(set(d.get("off", {})) & set(d.get("auto", {})))
    off = [d["off"][r]["samples_per_s"] for r in rounds]
    on = [d["auto"][r]["samples_per_s"] for r in rounds]
    frac = lambda s: [round(d[s][r]["fraction_of_peak"] * 100) for r in rounds]
    line = (f"{model:9} {prec}: off {statistics.median(off):9,.0f}  split {statistics.median(on):9,.0f} samples/s; "
            f"split / off per round {[round(b / a, 3) for a, b in zip(off, on)]}")
    if prec == "fp32":
        line += f"; % of fp32 peak off {frac('off')} split {frac('auto')}"
    print(line)
    machine = machine or d["off"][rounds[0]]["machine"]
for model in sorted({m for m, _ in runs}):
    if (model, "bf16") in runs and (model, "fp32") in runs:
        for s in ("off", "auto"):
            a, b = runs[(model, "fp32")][s], runs[(model, "bf16")][s]
            print(f"{model:9} bf16 / fp32, {s}: {[round(b[r]['samples_per_s'] / a[r]['samples_per_s'], 2) for r in sorted(a)]}")
if machine:
    print("machine:", {k: machine.get(k) for k in ("cpu", "capability", "cpu_features", "cores", "threads", "omp_wait_policy", "torch")})
