"""Preprocessing throughput and peak memory, measured on a real `ctrkit preprocess` process."""

from __future__ import annotations

import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ctrkit.data.synthetic import write_criteo_tsv


def run_preprocess_bench(rows: int, input_file: Path | None = None, engine: str = "polars", seed: int = 0) -> dict:
    """Times ``ctrkit preprocess criteo`` on ``input_file`` (or ``rows`` generated raw rows).

    The preprocessing runs as a child process so its peak RSS is its own (``ru_maxrss`` of children;
    run one benchmark per process for a clean figure).
    """
    if engine != "polars":
        raise ValueError(f"engine '{engine}' is not available yet; only polars")
    with tempfile.TemporaryDirectory(prefix="ctrkit-bench-") as tmp:
        raw = input_file
        if raw is None:
            raw = write_criteo_tsv(Path(tmp) / "raw.tsv", rows, seed=seed, progress=False)
        with open(raw, "rb") as f:
            lines = sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 24), b""))
        cmd = [sys.executable, "-m", "ctrkit", "preprocess", "criteo", str(raw), "--out", str(Path(tmp) / "out")]
        start = time.perf_counter()
        done = subprocess.run(cmd, capture_output=True, text=True)
        seconds = time.perf_counter() - start
        if done.returncode != 0:
            raise RuntimeError(f"preprocess failed: {done.stderr.strip()[-500:]}")
        peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        return {
            "benchmark": "preprocess",
            "engine": engine,
            "rows": lines,
            "input_bytes": os.path.getsize(raw),
            "seconds": seconds,
            "rows_per_s": lines / seconds,
            "peak_rss_mb": peak_kb / 1024,
            "command": " ".join(cmd[1:]),
            "python": platform.python_version(),
            "cpu_count": os.cpu_count(),
        }
