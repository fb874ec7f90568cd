"""Raw rows in, clicks out, timed: ``predict --input`` on a CSV of new rows (end to end, in a child process: its wall
time and peak resident memory, at two file sizes, so a bounded memory shows as one peak for both) and one-row
raw-value requests to a real ``ctrkit serve`` on loopback (latency percentiles), beside one-row id requests to the
same server in the same rounds."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from ctrkit.data.synthetic_clicks import click_log

TRAIN_ROWS = 200_000
LABEL = "clicked"


def _ctrkit(*args: Any) -> list[str]:
    return [sys.executable, "-m", "ctrkit", *map(str, args)]


def _run_measured(cmd: list[str]) -> tuple[float, float]:
    """Runs ``cmd`` to its end; its wall seconds and peak resident memory (MiB)."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {proc.stderr.read().decode()[-2000:]}")
    return seconds, usage.ru_maxrss / 1024


def prepare(work: Path, rows: int, seed: int = 0) -> dict[str, Path]:
    """The training log (``TRAIN_ROWS`` rows), its dataset and a DLRM trained on it with the default shape (300
    steps: the benchmark times scoring, not accuracy), and the new rows to score: ``rows`` and a quarter of them,
    without the click column."""
    work.mkdir(parents=True, exist_ok=True)
    paths = {"train_csv": work / "clicks.csv", "data": work / "data", "checkpoint": work / "dlrm.pt",
             "new": work / "new.csv", "new_quarter": work / "new_quarter.csv"}  # fmt: skip
    click_log(TRAIN_ROWS, seed).write_csv(paths["train_csv"])
    new = click_log(rows, seed, first_row=TRAIN_ROWS).drop(LABEL)
    new.write_csv(paths["new"])
    new.head(rows // 4).write_csv(paths["new_quarter"])
    subprocess.run(_ctrkit("preprocess", "table", paths["train_csv"], "--out", paths["data"], "--label", LABEL,
                           "--order-by", "ts", "--integers", "categorical", "--no-progress", "--overwrite"),
                   check=True, capture_output=True)  # fmt: skip
    subprocess.run(_ctrkit("train", "--dataset", paths["data"], "--model", "dlrm", "--max-steps", 300, "--no-progress",
                           "--save-checkpoint", paths["checkpoint"]), check=True, capture_output=True)  # fmt: skip
    return paths


def time_predict(paths: dict[str, Path], rounds: int) -> list[dict[str, Any]]:
    """``predict --input`` of the whole file and of its quarter, in interleaved rounds."""
    runs = []
    for r in range(rounds):
        for name in ("new", "new_quarter"):
            rows = sum(1 for _ in open(paths[name])) - 1
            out = paths[name].with_name(f"scores_{name}.csv")
            cmd = _ctrkit("predict", "--checkpoint", paths["checkpoint"], "--input", paths[name], "--out", out,
                          "--keep", "ts", "--no-progress")  # fmt: skip
            seconds, peak = _run_measured(cmd)
            runs.append({"round": r, "file": name, "rows": rows, "seconds": seconds, "rows_per_s": rows / seconds,
                         "peak_rss_mib": peak})  # fmt: skip
    return runs


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://{url}/v2/health/ready", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def time_requests(paths: dict[str, Path], requests: int, port: int) -> dict[str, Any]:
    """One-row requests to a real ``ctrkit serve`` of the checkpoint, raw values and ids taking turns, one client
    on loopback; latency in milliseconds (after 50 requests of each to warm up)."""
    import tritonclient.http as httpclient

    from ctrkit.preprocess.transform import from_dataset

    url = f"127.0.0.1:{port}"
    server = subprocess.Popen(_ctrkit("serve", "--checkpoint", paths["checkpoint"], "--port", port),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not _ready(url):
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("ctrkit serve did not become ready")
            time.sleep(0.2)
        client = httpclient.InferenceServerClient(url)
        rows = pl.read_csv(paths["new"], n_rows=requests + 50)
        transform = from_dataset(paths["data"])
        meta = {i["name"]: i["datatype"] for i in client.get_model_metadata("dlrm")["inputs"]}
        latencies: dict[str, list[float]] = {"raw": [], "ids": []}
        for i in range(requests + 50):
            row = rows[i]
            raw = []
            for column in transform.column_names:
                value = row[column][0]
                kind = meta[column]
                if kind == "BYTES":
                    array = np.array([["" if value is None else str(value)]], dtype=object)
                elif kind == "INT64":
                    array = np.array([[-1 if value is None else value]], np.int64)
                else:
                    array = np.array([[np.nan if value is None else value]], np.float32)
                item = httpclient.InferInput(column, [1, 1], kind)
                item.set_data_from_numpy(array, binary_data=False)
                raw.append(item)
            numerical, categorical, _ = transform(transform.typed(row.select(transform.column_names)))
            ids = [httpclient.InferInput("numerical", list(numerical.shape), "FP32"),
                   httpclient.InferInput("categorical", list(categorical.shape), "INT64")]  # fmt: skip
            ids[0].set_data_from_numpy(numerical, binary_data=False)
            ids[1].set_data_from_numpy(categorical, binary_data=False)
            for name, inputs in (("raw", raw), ("ids", ids)):
                start = time.perf_counter()
                client.infer("dlrm", inputs)
                if i >= 50:
                    latencies[name].append((time.perf_counter() - start) * 1e3)
    finally:
        server.terminate()
        server.wait(timeout=60)
    out = {}
    for name, values in latencies.items():
        v = np.array(values)
        out[name] = {"requests": len(v), "p50_ms": float(np.percentile(v, 50)), "p99_ms": float(np.percentile(v, 99)),
                     "mean_ms": float(v.mean())}  # fmt: skip
    return out


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the rounds, per file."""
    out = {}
    for name in sorted({r["file"] for r in runs}):
        mine = [r for r in runs if r["file"] == name]
        out[name] = {"rows": mine[0]["rows"], "rows_per_s": statistics.median(r["rows_per_s"] for r in mine),
                     "seconds": statistics.median(r["seconds"] for r in mine),
                     "peak_rss_mib": statistics.median(r["peak_rss_mib"] for r in mine)}  # fmt: skip
    return out


def run_raw_rows(work: Path, rows: int, rounds: int, requests: int, port: int) -> dict[str, Any]:
    paths = prepare(work, rows)
    runs = time_predict(paths, rounds)
    return {"rows": rows, "rounds": rounds, "predict": runs, "predict_median": summarize(runs),
            "requests": time_requests(paths, requests, port)}  # fmt: skip
