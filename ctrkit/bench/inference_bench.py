"""Inference throughput and latency: in process per runtime, or through a running server.

In process, each runtime scores pre-built batches of each size (no I/O in the timed loop); through a
server, a bounded number of requests is sent with the binary-tensor extension by a few concurrent
tritonclient clients. Latencies are per call; throughput is samples per second of wall time.
"""

from __future__ import annotations

import os
import platform
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from ctrkit.bench.config import INFERENCE_RUNTIMES as RUNTIMES
from ctrkit.models.signature import CATEGORICAL, MULTI_HOT, NUMERICAL, Signature

# the Criteo-Kaggle benchmark shape the inference targets are stated for (spelled out: DLRM's own
# defaults are wider)
KAGGLE_SHAPE = dict(
    num_numerical=13, cardinalities=(100_000,) * 26, embedding_dim=16, bottom_mlp=(512, 256, 64, 16),
    top_mlp=(512, 256, 1),
)  # fmt: skip


def kaggle_checkpoint(path: Path, seed: int = 0) -> Path:
    """A DLRM of the Criteo-Kaggle benchmark shape (``KAGGLE_SHAPE``: 26 x 100,000 rows, dim 16, bottom
    512-256-64-16, top 512-256-1), randomly initialised."""
    from ctrkit.checkpoint import Checkpoint, save_checkpoint
    from ctrkit.models.registry import config_to_dict, create_model, make_config

    torch.manual_seed(seed)
    cfg = make_config("dlrm", dict(KAGGLE_SHAPE))
    save_checkpoint(path, Checkpoint("dlrm", config_to_dict(cfg), {}, create_model("dlrm", cfg).state_dict()))
    return path


def _inputs(signature: Signature, batch: int, seed: int, bag_length: int = 4) -> tuple[np.ndarray, ...]:
    """The signature's inputs with power-law ids; bags of 1 to ``bag_length`` ids, -1 padded."""
    rng = np.random.default_rng(seed)
    numerical = rng.normal(size=(batch, signature.num_numerical)).astype(np.float32)
    cats = [np.minimum(rng.zipf(1.2, batch) - 1, c - 1) for c in signature.cardinalities]
    inputs: tuple[np.ndarray, ...] = (numerical, np.stack(cats, 1).astype(np.int64))
    multi_hot = signature.multi_hot_cardinalities
    if multi_hot:
        bags = np.stack([np.minimum(rng.zipf(1.2, (batch, bag_length)) - 1, c - 1) for c in multi_hot], 1)
        lengths = rng.integers(1, bag_length + 1, (batch, len(multi_hot), 1))
        inputs += (np.where(np.arange(bag_length) < lengths, bags, -1).astype(np.int64),)  # (B, Fm, L)
    return inputs


def _percentiles(seconds: list[float]) -> dict[str, float]:
    ms = np.array(seconds) * 1e3
    return {f"p{q}_ms": float(np.percentile(ms, q)) for q in (50, 90, 99)}


def _runner(runtime: str, checkpoint: Path, workdir: Path):
    """The predictor (a score function with its signature) of one runtime."""
    from ctrkit.export.exporter import export_checkpoint
    from ctrkit.serve.predictor import Predictor

    if runtime.startswith("torch-") or runtime == "torch":
        dtype = "bf16" if "bf16" in runtime else "fp32"
        predictor = Predictor.from_checkpoint(checkpoint, dtype=dtype, compile=runtime.endswith("compiled"))
        return predictor
    fmt = "torchscript" if runtime == "torchscript" else "onnx"
    out = workdir / runtime
    export_checkpoint(checkpoint, out, fmt, overwrite=True, quantize="int8" if runtime == "onnx-int8" else "none")
    return Predictor.from_export(out)


def run_in_process(
    checkpoint: Path,
    batch_sizes: list[int],
    runtimes: list[str],
    seconds: float = 2.0,
    seed: int = 0,
    repeats: int = 1,
) -> list[dict]:
    """Per runtime and batch size: samples/s and latency percentiles over ~``seconds`` of calls.

    With ``repeats`` > 1 the runtimes take turns in that many rounds (so a burst of load on a shared
    machine hits them alike): samples/s is the median over rounds, latencies pool every call, and
    ``vs_torch`` is the median of the per-round ratios to torch fp32 at the same batch size.
    """
    check_in_process_args(runtimes, repeats)
    rounds: dict[tuple[str, int], list[float]] = {(r, b): [] for r in runtimes for b in batch_sizes}
    times: dict[tuple[str, int], list[float]] = {key: [] for key in rounds}
    with tempfile.TemporaryDirectory(prefix="ctrkit-bench-inf-") as tmp:
        runners = {runtime: _runner(runtime, checkpoint, Path(tmp)) for runtime in runtimes}
        inputs = {b: _inputs(next(iter(runners.values())).signature, b, seed) for b in batch_sizes}
        for _ in range(repeats):
            for runtime, score in runners.items():
                for batch in batch_sizes:
                    took, total = _time_calls(score, inputs[batch], seconds)
                    rounds[runtime, batch].append(batch * len(took) / total)
                    times[runtime, batch] += took
    results = []
    for (runtime, batch), per_round in rounds.items():
        result = {"mode": "in-process", "runtime": runtime, "batch_size": batch, "calls": len(times[runtime, batch]),
                  "samples_per_s": float(np.median(per_round)), "rounds_samples_per_s": per_round,
                  **_percentiles(times[runtime, batch])}  # fmt: skip
        if "torch" in runtimes:
            ratios = np.array(per_round) / np.array(rounds["torch", batch])
            result["vs_torch"] = float(np.median(ratios))
        results.append(result)
    return results


def check_in_process_args(runtimes: list[str], repeats: int) -> None:
    for runtime in runtimes:
        if runtime not in RUNTIMES:
            raise ValueError(f"`runtimes`: unknown runtime '{runtime}'; expected {', '.join(RUNTIMES)}")
    if repeats < 1:
        raise ValueError(f"`repeats` must be >= 1, got {repeats}")


def _time_calls(score, inputs: tuple[np.ndarray, ...], seconds: float) -> tuple[list[float], float]:
    """Per-call times of ``score`` over about ``seconds`` (at least 5 calls, after 3 warm-up calls)."""
    for _ in range(3):
        score(*inputs)
    took: list[float] = []
    start = time.perf_counter()
    while time.perf_counter() - start < seconds or len(took) < 5:
        t0 = time.perf_counter()
        score(*inputs)
        took.append(time.perf_counter() - t0)
    return took, time.perf_counter() - start


def run_through_server(
    url: str, model: str, batch_sizes: list[int], requests: int = 2000, concurrency: int = 8, seed: int = 0
) -> list[dict]:
    """Per batch size: ``requests`` binary requests from ``concurrency`` clients; samples/s and latencies."""
    import tritonclient.http as httpclient

    url = url.split("://", 1)[-1].rstrip("/")  # tritonclient wants host:port
    meta_client = httpclient.InferenceServerClient(url)
    meta = meta_client.get_model_metadata(model)
    shape = {i["name"]: i["shape"] for i in meta["inputs"]}
    datatype = {i["name"]: i["datatype"] for i in meta["inputs"]}
    # ids below 1000 stand for any traffic (ids beyond a table are served as its unseen row)
    fake = Signature(shape[NUMERICAL][1], (1000,) * shape[CATEGORICAL][1],
                     (1000,) * shape[MULTI_HOT][1] if MULTI_HOT in shape else ())  # fmt: skip
    results = []
    for batch in batch_sizes:
        arrays = dict(zip(fake.input_names, _inputs(fake, batch, seed)))

        def client_run(n: int, arrays: dict[str, np.ndarray] = arrays) -> list[float]:
            client = httpclient.InferenceServerClient(url, connection_timeout=30, network_timeout=60)
            inputs = []
            for name, array in arrays.items():
                inputs.append(httpclient.InferInput(name, list(array.shape), datatype[name]))
                inputs[-1].set_data_from_numpy(array, binary_data=True)
            out = [httpclient.InferRequestedOutput(fake.output.name, binary_data=True)]
            times = []
            for _ in range(n):
                t0 = time.perf_counter()
                client.infer(model, inputs, outputs=out)
                times.append(time.perf_counter() - t0)
            return times

        per_client = [requests // concurrency + (1 if k < requests % concurrency else 0) for k in range(concurrency)]
        client_run(5)  # warm-up
        start = time.perf_counter()
        with ThreadPoolExecutor(concurrency) as pool:
            times = [t for ts in pool.map(client_run, per_client) for t in ts]
        total = time.perf_counter() - start
        results.append({"mode": "server", "url": url, "batch_size": batch, "requests": len(times),
                        "concurrency": concurrency, "samples_per_s": batch * len(times) / total,
                        **_percentiles(times)})  # fmt: skip
    return results


def environment() -> dict:
    """Versions, threads and the 1-minute load average (other work competing for the cores)."""
    return {"python": platform.python_version(), "torch": torch.__version__, "cpu_count": os.cpu_count(),
            "threads": torch.get_num_threads(), "load_average_1min": os.getloadavg()[0]}  # fmt: skip
