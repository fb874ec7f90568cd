"""Raw rows in, clicks out, timed: ``predict --input`` on a CSV of new rows (end to end, in a child process: its wall
time and peak resident memory, at two file sizes, so a bounded memory shows as one peak for both) and one-row
raw-value requests to a real ``ctrkit serve`` on loopback (latency percentiles), beside one-row id requests to the
same server in the same rounds."""

from __future__ import annotations

import gc
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
        said = proc.stderr.read().decode()[-2000:] if proc.stderr is not None else ""
        raise RuntimeError(f"{' '.join(cmd)} failed: {said}")
    return seconds, usage.ru_maxrss / 1024


def prepare(work: Path, rows: int, train_rows: int, steps: int, seed: int = 0) -> dict[str, Path]:
    """The training log (``train_rows`` rows), its dataset and a DLRM trained on it with the default shape for
    ``steps`` steps (the benchmark times scoring, not accuracy), and the new rows to score: ``rows`` and twice as
    many, without the click column."""
    work.mkdir(parents=True, exist_ok=True)
    paths = {"train_csv": work / "clicks.csv", "data": work / "data", "checkpoint": work / "dlrm.pt",
             "new": work / "new.csv", "new_double": work / "new_double.csv"}  # fmt: skip
    click_log(train_rows, seed).write_csv(paths["train_csv"])
    click_log(rows, seed, first_row=train_rows).drop(LABEL).write_csv(paths["new"])
    click_log(2 * rows, seed, first_row=train_rows).drop(LABEL).write_csv(paths["new_double"])
    subprocess.run(_ctrkit("preprocess", "table", paths["train_csv"], "--out", paths["data"], "--label", LABEL,
                           "--order-by", "ts", "--integers", "categorical", "--no-progress", "--overwrite"),
                   check=True, capture_output=True)  # fmt: skip
    train = _ctrkit("train", "--dataset", paths["data"], "--model", "dlrm", "--max-steps", steps, "--no-progress",
                    "--save-checkpoint", paths["checkpoint"])  # fmt: skip
    subprocess.run(train, check=True, capture_output=True)
    return paths


def time_predict(paths: dict[str, Path], rounds: int) -> list[dict[str, Any]]:
    """``predict --input`` of the file and of the one twice as long, in interleaved rounds."""
    runs = []
    for r in range(rounds):
        for name in ("new", "new_double"):
            rows = sum(1 for _ in open(paths[name])) - 1
            out = paths[name].with_name(f"scores_{name}.csv")
            cmd = _ctrkit("predict", "--checkpoint", paths["checkpoint"], "--input", paths[name], "--out", out,
                          "--keep", "ts", "--no-progress")  # fmt: skip
            seconds, peak = _run_measured(cmd)
            runs.append({"round": r, "file": name, "rows": rows, "seconds": seconds, "rows_per_s": rows / seconds,
                         "peak_rss_mib": peak})  # fmt: skip
    return runs


def server_ready(url: str) -> bool:
    """Whether the server at ``url`` (HOST:PORT) answers its readiness route."""
    try:
        with urllib.request.urlopen(f"http://{url}/v2/health/ready", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def time_requests(paths: dict[str, Path], requests: int, port: int, warm_up: float = 8.0) -> dict[str, Any]:
    """One-row requests to a real ``ctrkit serve`` of the checkpoint's ONNX export (the serving path for latency),
    raw values and ids taking turns, one client on loopback; latency in milliseconds (after ``warm_up`` seconds of
    requests of each kind)."""
    import tritonclient.http as httpclient

    from ctrkit.preprocess.transform import from_dataset

    url = f"127.0.0.1:{port}"
    export = paths["checkpoint"].with_name("onnx")
    subprocess.run(_ctrkit("export", "--checkpoint", paths["checkpoint"], "--format", "onnx", "--out", export,
                           "--overwrite"), check=True, capture_output=True)  # fmt: skip
    server = subprocess.Popen(_ctrkit("serve", "--model-dir", export, "--port", port, "--name", "dlrm"),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not server_ready(url):
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("ctrkit serve did not become ready")
            time.sleep(0.2)
        client = httpclient.InferenceServerClient(url)
        rows = pl.read_csv(paths["new"], n_rows=requests + 50)
        transform = from_dataset(paths["data"])
        if transform is None:
            raise RuntimeError(f"{paths['data']}: carries no preprocessing (made by `preprocess table`, it should)")
        meta = {i["name"]: i["datatype"] for i in client.get_model_metadata("dlrm")["inputs"]}
        specs = [{"name": c, "datatype": meta[c]} for c in transform.column_names]
        built = [(raw_inputs(rows[i], specs), _id_inputs(rows[i], transform))
                 for i in range(requests + 50)]  # fmt: skip  # every request built before the clock runs
        output = [httpclient.InferRequestedOutput("probability", binary_data=True)]
        latencies: dict[str, list[float]] = {"raw": [], "ids": []}
        # warm up for ``warm_up`` seconds: the server spawns its large-body parser process as it starts, which takes a
        # core for seconds; the latency measured is the steady state's
        deadline = time.monotonic() + warm_up
        while time.monotonic() < deadline:
            for raw, ids in built[:50]:
                client.infer("dlrm", raw, outputs=output)
                client.infer("dlrm", ids, outputs=output)
        gc.collect()
        gc.disable()  # the client's own collections of the prebuilt requests would show as the server's latency
        try:
            for raw, ids in built[50:]:
                for name, inputs in (("raw", raw), ("ids", ids)):
                    start = time.perf_counter()
                    client.infer("dlrm", inputs, outputs=output)
                    latencies[name].append((time.perf_counter() - start) * 1e3)
        finally:
            gc.enable()
    finally:
        server.terminate()
        server.wait(timeout=60)
    out = {}
    for name, values in latencies.items():
        v = np.array(values)
        out[name] = {"requests": len(v), "p50_ms": float(np.percentile(v, 50)), "p99_ms": float(np.percentile(v, 99)),
                     "mean_ms": float(v.mean())}  # fmt: skip
    return out


def raw_inputs(rows: pl.DataFrame, specs: list[dict[str, Any]]) -> list:
    """``rows``' raw values as binary tensors, one [B, 1] input a column, of the datatypes ``specs`` (a model's
    ``RowTransform.input_specs``: name, datatype) declare; a missing value: "" (BYTES), NaN (FP32) or -1 (INT64)."""
    import tritonclient.http as httpclient

    inputs = []
    for spec in specs:
        name, kind = spec["name"], spec["datatype"]
        values = rows[name].to_list()
        if kind == "BYTES":
            array = np.array([["" if v is None else str(v)] for v in values], dtype=object)
        elif kind == "INT64":
            array = np.array([[-1 if v is None else int(v)] for v in values], np.int64)
        else:
            array = np.array([[np.nan if v is None else float(v)] for v in values], np.float32)
        item = httpclient.InferInput(name, [len(values), 1], kind)
        item.set_data_from_numpy(array, binary_data=True)
        inputs.append(item)
    return inputs


def _id_inputs(row: pl.DataFrame, transform) -> list:
    """The same row as the id inputs the transform makes of it."""
    import tritonclient.http as httpclient

    numerical, categorical, _ = transform(transform.typed(row.select(transform.column_names)))
    inputs = [httpclient.InferInput("numerical", list(numerical.shape), "FP32"),
              httpclient.InferInput("categorical", list(categorical.shape), "INT64")]  # fmt: skip
    inputs[0].set_data_from_numpy(numerical, binary_data=True)
    inputs[1].set_data_from_numpy(categorical, binary_data=True)
    return inputs


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the rounds, per file."""
    out = {}
    for name in sorted({r["file"] for r in runs}):
        mine = [r for r in runs if r["file"] == name]
        out[name] = {"rows": mine[0]["rows"], "rows_per_s": statistics.median(r["rows_per_s"] for r in mine),
                     "seconds": statistics.median(r["seconds"] for r in mine),
                     "peak_rss_mib": statistics.median(r["peak_rss_mib"] for r in mine)}  # fmt: skip
    return out


def run_raw_rows(
    work: Path,
    rows: int,
    rounds: int,
    requests: int,
    port: int,
    train_rows: int = 200_000,
    steps: int = 300,
    warm_up: float = 8.0,
) -> dict[str, Any]:
    paths = prepare(work, rows, train_rows, steps)
    runs = time_predict(paths, rounds)
    return {"rows": rows, "rounds": rounds, "predict": runs, "predict_median": summarize(runs),
            "requests": time_requests(paths, requests, port, warm_up)}  # fmt: skip
