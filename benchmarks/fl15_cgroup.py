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
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

from ctrkit.bench.peak import machine

MODEL = ["--model", "dlrm", "--embedding-dim", "128", "--bottom-mlp", "512,256,128", "--top-mlp",
         "1024,1024,512,256,1", "--embedding-optimizer", "sgd", "--validation-fraction", "0",
         "--no-progress"]  # fmt: skip


class Cgroup:
    def __init__(self, limit: int):
        name = f"ctrkit-bench-{uuid.uuid4().hex[:8]}"
        if Path("/sys/fs/cgroup/memory").is_dir():
            self.dir, self.limit, self.peak = Path("/sys/fs/cgroup/memory") / name, "memory.limit_in_bytes", \
                "memory.max_usage_in_bytes"  # fmt: skip
        else:
            self.dir, self.limit, self.peak = Path("/sys/fs/cgroup") / name, "memory.max", "memory.peak"
        self.dir.mkdir()
        (self.dir / self.limit).write_text(str(limit))

    def anon(self) -> int:
        """The group's anonymous memory now (v1's ``total_rss``, v2's ``anon``): what it holds beyond the page cache."""
        for line in (self.dir / "memory.stat").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key in ("total_rss", "anon"):
                return int(value)
        return 0

    def run(self, cmd: list[str]) -> tuple[int, float, int, int, str]:
        """Runs ``cmd`` in the group: exit status, seconds, the group's peak bytes (page cache included), its
        peak anonymous bytes (sampled every 0.2 s), the end of stderr."""
        if self.peak == "memory.max_usage_in_bytes":
            (self.dir / self.peak).write_text("0")  # v1: the peak of this phase alone
        procs = self.dir / "cgroup.procs"
        start = time.perf_counter()
        join = lambda: procs.write_text(str(os.getpid()))  # noqa: E731
        child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=join)
        anon = [0]
        done = threading.Event()

        def sample() -> None:
            while not done.wait(0.2):
                anon[0] = max(anon[0], self.anon())

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        _, err = child.communicate()
        done.set()
        sampler.join()
        seconds = time.perf_counter() - start
        return child.returncode, seconds, int((self.dir / self.peak).read_text()), anon[0], err[-3000:]

    def close(self) -> None:
        for _ in range(50):
            try:
                self.dir.rmdir()
                return
            except OSError:
                time.sleep(0.2)


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
    group = Cgroup(int(a.limit_gib * 2**30))
    phases = {}
    try:
        base = [*ctrkit, "train", "--dataset", str(a.data), *MODEL, "--save-checkpoint", str(ckpt)]
        for name, cmd in (
            ("train and save", [*base, "--max-steps", str(a.steps)]),
            ("resume and save", [*base, "--max-steps", str(2 * a.steps), "--load-checkpoint", str(ckpt)]),
            ("evaluate test", [*ctrkit, "evaluate", "--checkpoint", str(ckpt), "--dataset", str(a.data),
                               "--mapping", "test", "--json"]),
        ):  # fmt: skip
            code, seconds, peak, anon, err = group.run(cmd)
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
