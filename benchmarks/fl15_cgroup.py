"""The seeds' DLRM configuration on the seeds' FL15 tables inside a memory cgroup smaller than the tables.

DLRM at width 128 (bottom MLP 512-256-128, top 1024-1024-512-256-1) on `ctrkit synth --tables criteo-1tb` data
(26 tables, 32.7M rows: 16.7 GB of tables) with SGD on the tables, run inside a real memory cgroup (v1 or v2,
made and removed here; root only): train and save, resume and save again, evaluate the test split. Each phase's
seconds, exit status, the cgroup's peak memory (v1's max_usage, v2's memory.peak: the page cache of the tables'
file included, which the kernel reclaims) and its peak anonymous memory (sampled) are written as JSON.

Usage: python benchmarks/fl15_cgroup.py --data DIR --work DIR --limit-gib 12 --output FILE
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from ctrkit.bench.cgroup import MemoryCgroup
from ctrkit.bench.peak import machine

MODEL = ["--model", "dlrm", "--embedding-dim", "128", "--bottom-mlp", "512,256,128", "--top-mlp",
         "1024,1024,512,256,1", "--embedding-optimizer", "sgd", "--validation-fraction", "0",
         "--no-progress"]  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, required=True)
    p.add_argument("--work", type=Path, required=True)
    p.add_argument("--limit-gib", type=float, default=12.0)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--output", type=Path, required=True)
    a = p.parse_args()
    ctrkit = [sys.executable, "-m", "ctrkit"]
    ckpt = a.work / "fl15.pt"
    a.work.mkdir(parents=True, exist_ok=True)
    group = MemoryCgroup(int(a.limit_gib * 2**30), prefix="ctrkit-bench")
    phases = {}
    try:
        base = [*ctrkit, "train", "--dataset", str(a.data), *MODEL, "--save-checkpoint", str(ckpt)]
        for name, cmd in (
            ("train and save", [*base, "--max-steps", str(a.steps)]),
            ("resume and save", [*base, "--max-steps", str(2 * a.steps), "--load-checkpoint", str(ckpt)]),
            ("evaluate test", [*ctrkit, "evaluate", "--checkpoint", str(ckpt), "--dataset", str(a.data),
                               "--mapping", "test", "--json"]),
        ):  # fmt: skip
            started = time.perf_counter()
            done = group.run(cmd)
            seconds = time.perf_counter() - started
            code, peak, anon, err = done.returncode, done.peak_bytes, done.peak_anonymous_bytes, done.stderr[-3000:]
            tables = [line.strip() for line in err.splitlines() if line.strip().startswith(("tables ", "memory "))]
            phases[name] = {"exit": code, "seconds": round(seconds, 1), "peak_bytes": peak, "peak_anon_bytes": anon,
                            "plan": tables}  # fmt: skip
            print(f"{name}: exit {code}, {seconds:.0f} s, cgroup peak {peak / 2**30:.2f} GiB (anonymous "
                  f"{anon / 2**30:.2f} GiB)", flush=True)  # fmt: skip
            if code != 0:
                phases[name]["stderr"] = err
                break
    finally:
        group.close()
    result = {"benchmark": "fl15-cgroup", "limit_bytes": int(a.limit_gib * 2**30), "steps": a.steps,
              "model": MODEL, "phases": phases, "machine": machine()}  # fmt: skip
    a.output.parent.mkdir(parents=True, exist_ok=True)
    a.output.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
