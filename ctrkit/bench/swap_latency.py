"""Requests across version swaps: a server polling a model repository (``ctrkit serve --poll-s``, or real Triton in
POLL mode) answers concurrent clients while new versions are placed in the repository as ``ctrkit refresh`` places
them (written beside, moved in by one rename, the oldest removed past the versions kept). Reports the failed
requests, the latency percentiles of the steady state and of the windows around each swap (from the placement until
a second after the new version first answers), and their ratio."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from ctrkit.bench.raw_rows_bench import raw_inputs, server_ready
from ctrkit.bench.scale_bench import free_port

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
AFTER_S = 1.0  # a swap's window lasts this long after the new version first answers


def triton_available() -> bool:
    return (SCRIPTS / "tritonserver.sh").is_file() and (SCRIPTS.parent / ".venv-triton" / "bin" / "python").is_file()


def _start(server: str, repository: Path, port: int, poll_s: float) -> subprocess.Popen:
    if server == "ctrkit":
        cmd = [sys.executable, "-m", "ctrkit", "serve", "--model-repository", str(repository), "--port", str(port),
               "--poll-s", str(poll_s), "--threads", "1"]  # fmt: skip
    else:
        cmd = [str(SCRIPTS / "tritonserver.sh"), str(repository), str(port), "--model-control-mode=poll",
               f"--repository-poll-secs={max(1, round(poll_s))}"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not server_ready(f"127.0.0.1:{port}"):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"{server} did not start: {proc.stderr.read().decode()[-2000:]}")
        time.sleep(0.3)
    return proc


def _place(staged: Path, model_dir: Path, number: int, keep: int) -> None:
    """Version ``number`` (the files in ``staged``) moved into ``model_dir`` by one rename, then the versions older
    than the newest ``keep`` moved out and removed, as ``refresh`` publishes."""
    tmp = model_dir.parent / f".{model_dir.name}.staging"
    shutil.copytree(staged, tmp)
    os.replace(tmp, model_dir / str(number))
    numbers = sorted(int(p.name) for p in model_dir.iterdir() if p.name.isdigit())
    for old in numbers[:-keep]:
        aside = model_dir.parent / f".{model_dir.name}.{old}.removed"
        os.replace(model_dir / str(old), aside)
        shutil.rmtree(aside, ignore_errors=True)


def _percentiles(seconds: Sequence[float]) -> dict[str, float | int]:
    ms = np.asarray(seconds, np.float64) * 1e3
    if not len(ms):
        return {"requests": 0}
    return {"requests": int(len(ms)), "p50_ms": round(float(np.percentile(ms, 50)), 3),
            "p99_ms": round(float(np.percentile(ms, 99)), 3)}  # fmt: skip


def run_swaps(versions: Sequence[Path], model_config: Path, rows: pl.DataFrame, specs: Sequence[dict[str, Any]],
              work: Path, server: str, clients: int = 4, steady_s: float = 10.0, poll_s: float = 1.0,
              keep: int = 3, timeout_s: float = 60.0) -> dict[str, Any]:  # fmt: skip
    """Serves ``versions[0]`` (a version directory's files; ``model_config`` the model's ``config.pbtxt``) from a new
    repository in ``work`` with ``server`` ("ctrkit" or "triton"), ``clients`` clients sending ``rows`` as raw
    values in a loop; after ``steady_s`` seconds each later version is placed in turn, the next once the last
    answers and a second has passed. Returns the failures and the steady and swap latencies."""
    import tritonclient.http as httpclient

    repository = work / f"swaps-{server}"
    shutil.rmtree(repository, ignore_errors=True)
    model_dir = repository / "ctr"
    model_dir.mkdir(parents=True)
    shutil.copyfile(model_config, model_dir / "config.pbtxt")
    shutil.copyfile(versions[0] / "ctrkit_model.json", model_dir / "ctrkit_model.json")
    shutil.copytree(versions[0], model_dir / "1")
    port = free_port()
    proc = _start(server, repository, port, poll_s)
    samples: list[tuple[float, float, int]] = []  # (sent at, seconds, version)
    failures: list[str] = []
    stop = threading.Event()
    lock = threading.Lock()

    def client() -> None:
        c = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
        inputs = raw_inputs(rows, specs)
        while not stop.is_set():
            sent = time.perf_counter()
            try:
                version = int(c.infer("ctr", inputs).get_response()["model_version"])
            except Exception as e:  # noqa: BLE001 - every failure counts
                with lock:
                    failures.append(repr(e)[:200])
                continue
            with lock:
                samples.append((sent, time.perf_counter() - sent, version))
        c.close()

    threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    windows = []
    try:
        for t in threads:
            t.start()
        time.sleep(steady_s)
        steady_end = time.perf_counter()
        for number, staged in enumerate(versions[1:], start=2):
            placed = time.perf_counter()
            _place(staged, model_dir, number, keep)
            deadline = placed + timeout_s
            while time.perf_counter() < deadline:
                with lock:
                    seen = next((s for s, _, v in samples if s >= placed and v == number), None)
                if seen is not None:
                    break
                time.sleep(0.05)
            else:
                raise RuntimeError(f"{server}: version {number} did not answer within {timeout_s:g} s")
            time.sleep(AFTER_S)
            windows.append((placed, time.perf_counter(), time.perf_counter() - placed))
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
    start = samples[0][0] if samples else 0.0
    steady = [d for s, d, _ in samples if start + 2.0 <= s < steady_end]  # (the first 2 s: warm-up)
    swapping = [d for s, d, _ in samples if any(a <= s < b for a, b, _ in windows)]
    result = {"server": server, "clients": clients, "swaps": len(windows), "failed": len(failures),
              "failures": failures[:5], "steady": _percentiles(steady), "swap": _percentiles(swapping),
              "seconds_to_serve": [round(w[2] - AFTER_S, 2) for w in windows]}  # fmt: skip
    if steady and swapping:
        result["p99_ratio"] = round(result["swap"]["p99_ms"] / result["steady"]["p99_ms"], 3)
    return result
