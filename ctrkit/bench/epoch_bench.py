"""One training epoch at scale, measured: a real ``ctrkit train`` process over a Criteo-1TB-shaped dataset, its
resident memory sampled each second, its log read back into samples/s per 5% of the epoch, memory over time
and the time of every phase (start-up and data, warm start, steps, validation, checkpoints, test)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

SHARES = 20  # the epoch's steps in 5% parts


def _rss(pid: int) -> tuple[int, int] | None:
    """(resident, anonymous) bytes of process ``pid``: VmRSS, and RssAnon + RssShmem (what it holds that the kernel
    cannot drop; the resident memory also counts the pages of files it has read, the dataset's)."""
    fields = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssShmem"):
                fields[key] = int(value.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    if "VmRSS" not in fields:
        return None
    return fields["VmRSS"], fields.get("RssAnon", fields["VmRSS"]) + fields.get("RssShmem", 0)


def run_epoch(dataset: Path, work: Path, train_args: list[str], interval: float = 1.0) -> dict[str, Any]:
    """Trains one epoch of ``dataset`` (``train_args`` added to the command) in a child process; returns its
    log records, the memory samples ``[(seconds, rss bytes)]`` and the wall time."""
    work.mkdir(parents=True, exist_ok=True)
    log = work / "train_log.jsonl"
    log.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "ctrkit", "train", "--dataset", str(dataset), "--epochs", "1", "--no-progress",
           "--log-path", str(log), "--save-checkpoint", str(work / "epoch.pt"), *train_args]  # fmt: skip
    started, unix_started = time.perf_counter(), time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    samples: list[tuple[float, int, int]] = []

    def sample() -> None:
        while proc.poll() is None:
            rss = _rss(proc.pid)
            if rss is not None:
                samples.append((round(time.perf_counter() - started, 2), *rss))
            time.sleep(interval)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, err = proc.communicate()
    sampler.join()
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise RuntimeError(f"ctrkit train failed ({proc.returncode}): {err.strip().splitlines()[-1:]}")
    records = [json.loads(line) for line in log.read_text().splitlines()]
    trainer_zero = next(r for r in records if r["event"] == "start")["unix_time"] - unix_started
    memory = [(round(t - trainer_zero, 2), m, a) for t, m, a in samples]  # on the log's clock: trainer built at 0
    return {
        "records": records,
        "memory": memory,
        "wall_seconds": wall,
        "startup_seconds": trainer_zero,
        "summary": out.strip().splitlines()[-1:],
    }


def summarize(run: dict[str, Any]) -> dict[str, Any]:
    """Samples/s and resident memory per 5% of the epoch, the phases' seconds, and the targets' ratios."""
    records, memory = run["records"], run["memory"]
    start = next(r for r in records if r["event"] == "start")
    total, batch = start["total_steps"], start["config"]["batch_size"]
    steps = [r for r in records if r["event"] == "train"]
    evals = [r for r in records if r["event"] == "eval"]
    saves = [r for r in records if r["event"] == "checkpoint"]
    test = next((r for r in records if r["event"] == "test"), None)
    warm = next((r for r in records if r["event"] == "warm_start"), None)
    shares: list[dict[str, Any]] = []
    for k in range(SHARES):
        lo, hi = total * k / SHARES, total * (k + 1) / SHARES
        inside = [r["samples_per_s"] for r in steps if lo < r["step"] <= hi]
        times = [r["time"] for r in steps if lo < r["step"] <= hi]
        rss = [m for t, m, _ in memory if times and times[0] - 1 <= t <= times[-1] + 1]
        anon = [a for t, _, a in memory if times and times[0] - 1 <= t <= times[-1] + 1]
        shares.append({"share": f"{5 * k}-{5 * (k + 1)}%", "samples_per_s": sum(inside) / len(inside) if inside
                       else None, "rss_bytes": max(rss) if rss else None,
                       "anon_bytes": max(anon) if anon else None})  # fmt: skip
    eval_seconds = sum(r.get("seconds", 0.0) for r in evals)
    save_seconds = sum(r.get("seconds", 0.0) for r in saves)
    test_seconds = test.get("seconds", 0.0) if test else 0.0
    first_step = steps[0]["time"] if steps else 0.0
    last = max(r["time"] for r in records)
    step_seconds = sum(r["time"] for r in steps[-1:]) - first_step  # from the first to the last step's record
    trained = [s["samples_per_s"] for s in shares if s["samples_per_s"]]
    rates = [s["samples_per_s"] for s in shares[1:] if s["samples_per_s"]]
    after = [s["anon_bytes"] for s in shares[1:] if s["anon_bytes"]]
    val_rows = start.get("validation_samples", 0)
    return {
        "rows": start["train_samples"],
        "steps": total,
        "batch_size": batch,
        "shares": shares,
        "phases_seconds": {
            "start-up, data and plan (before the trainer)": run["startup_seconds"],
            "warm start": warm.get("seconds") if warm else 0.0,
            "steps (first to last step record, evaluations and saves inside excluded)": step_seconds
            - sum(r.get("seconds", 0.0) for r in evals + saves if first_step < r["time"] <= first_step + step_seconds),
            "validation": eval_seconds,
            "checkpoints": save_seconds,
            "test": test_seconds,
            "trainer in all": last,
            "process wall": run["wall_seconds"],
        },
        "samples_per_s_median": sorted(trained)[len(trained) // 2] if trained else None,
        "slowest_share_vs_first": min(rates) / trained[0] if rates and trained else None,
        "memory_growth_after_first_share": (max(after) - min(after)) if after else None,
        "validation_samples_per_s": val_rows * len(evals) / eval_seconds if eval_seconds else None,
        "checkpoint_share_of_epoch": save_seconds / last if last else None,
        "peak_rss_bytes": max((m for _, m, _ in memory), default=None),
        "peak_anon_bytes": max((a for _, _, a in memory), default=None),
        "peak_anon_bytes_by_phase": _phase_peaks(records, memory, first_step, first_step + step_seconds),
    }


def _phase_peaks(records: list[dict], memory: list[tuple], first: float, last: float) -> dict[str, int | None]:
    """The largest anonymous memory sampled in each phase: before the first step (the warm start among it),
    validation, checkpoints, between the steps' records, and after the last step (calibration, test)."""
    windows: dict[str, list[tuple[float, float]]] = {"before the first step": [(-1e9, first)],
                                                     "after the last step": [(last, 1e9)]}  # fmt: skip
    for name, event in (("validation", "eval"), ("checkpoints", "checkpoint"), ("test", "test")):
        windows[name] = [(r["time"] - r.get("seconds", 0.0), r["time"]) for r in records if r["event"] == event]
    windows["warm start"] = [(r["time"] - r.get("seconds", 0.0), r["time"]) for r in records
                             if r["event"] == "warm_start"]  # fmt: skip
    inside = [(lo, hi) for name in ("validation", "checkpoints") for lo, hi in windows[name] if first < hi <= last]
    out: dict[str, int | None] = {}
    for name, spans in windows.items():
        out[name] = max((a for t, _, a in memory if any(lo - 1 <= t <= hi + 1 for lo, hi in spans)), default=None)
    out["steps"] = max(
        (a for t, _, a in memory if first <= t <= last and not any(lo - 1 <= t <= hi + 1 for lo, hi in inside)),
        default=None,
    )
    return out
