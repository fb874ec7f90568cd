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
) -> dict:
    """Times ``ctrkit preprocess criteo --engine ENGINE`` on ``input_file`` (or ``rows`` generated raw rows).

    The preprocessing runs as a child process; its peak memory is the largest sum of resident memory
    over it and its descendants (the JVM, for Spark), sampled every 0.2 s.
    """
    if engine not in ("polars", "spark"):
        raise ValueError(f"engine must be polars or spark, got '{engine}'")
    with tempfile.TemporaryDirectory(prefix="ctrkit-bench-") as tmp:
        raw = input_file
        if raw is None:
            raw = write_criteo_tsv(Path(tmp) / "raw.tsv", rows, seed=seed, progress=False)
        with open(raw, "rb") as f:
            lines = sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 24), b""))
        cmd = [sys.executable, "-m", "ctrkit", "preprocess", "criteo", str(raw), "--out", str(Path(tmp) / "out")]
        cmd += ["--engine", engine, "--no-progress"] + (["--spark-master", spark_master] if engine == "spark" else [])
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
        peak_kb = max(peak_kb, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
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
