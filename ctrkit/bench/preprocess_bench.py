"""Preprocessing throughput and peak memory, measured on a real `ctrkit preprocess` process."""

from __future__ import annotations

import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from ctrkit.data.synthetic import write_criteo_tsv

PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024


def _tree_rss_kb(root: int) -> int:
    """Resident memory of ``root`` and all its descendants (Spark's JVM is a grandchild), from /proc."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
        rss[int(entry)] = int(fields[21]) * PAGE_KB
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += rss.get(pid, 0)
        todo.extend(children.get(pid, []))
    return total


def run_preprocess_bench(
    rows: int,
    input_file: Path | None = None,
    engine: str = "polars",
    seed: int = 0,
    spark_master: str = "local[*]",
    repeats: int = 1,
) -> dict:
    """Times ``ctrkit preprocess criteo --engine ENGINE`` on ``input_file`` (or ``rows`` generated raw rows).

    The preprocessing runs as a child process, ``repeats`` times; the result is the median time (this
    machine is shared: single runs vary) and the largest peak memory, the sum of resident memory over
    the child and its descendants (the JVM, for Spark), sampled every 0.2 s.
    """
    if engine not in ("polars", "spark"):
        raise ValueError(f"engine must be polars or spark, got '{engine}'")
    if repeats < 1:
        raise ValueError(f"`repeats` must be >= 1, got {repeats}")
    with tempfile.TemporaryDirectory(prefix="ctrkit-bench-") as tmp:
        raw = input_file
        if raw is None:
            raw = write_criteo_tsv(Path(tmp) / "raw.tsv", rows, seed=seed, progress=False)
        with open(raw, "rb") as f:
            lines = sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 24), b""))
        size = os.path.getsize(raw)
        cmd = [sys.executable, "-m", "ctrkit", "preprocess", "criteo", str(raw), "--out", str(Path(tmp) / "out")]
        cmd += ["--engine", engine, "--no-progress"] + (["--spark-master", spark_master] if engine == "spark" else [])
        runs = [_timed_run(cmd, Path(tmp) / "out") for _ in range(repeats)]
    seconds = float(np.median([s for s, _ in runs]))
    return {
        "benchmark": "preprocess",
        "engine": engine,
        "rows": lines,
        "input_bytes": size,
        "seconds": seconds,
        "rows_per_s": lines / seconds,
        "peak_rss_mb": max(kb for _, kb in runs) / 1024,
        "repeats": repeats,
        "seconds_each": [round(s, 3) for s, _ in runs],
        "command": " ".join(cmd[1:]),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
    }


def _timed_run(cmd: list[str], out: Path) -> tuple[float, int]:
    """(wall seconds, peak resident KB of the process tree) of one run; removes ``out`` first."""
    shutil.rmtree(out, ignore_errors=True)
    start = time.perf_counter()
    child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak_kb = 0
    while child.poll() is None:
        peak_kb = max(peak_kb, _tree_rss_kb(child.pid))
        time.sleep(0.2)
    seconds = time.perf_counter() - start
    _, stderr = child.communicate()
    if child.returncode != 0:
        raise RuntimeError(f"preprocess failed: {stderr.strip()[-500:]}")
    return seconds, max(peak_kb, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
