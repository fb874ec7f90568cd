"""Step time per world size on the Merlin Distributed-Embeddings synthetic models, scaled down.

The blog's Table 2 gives each synthetic DLRM's table count and total embedding size (Tiny: 55
tables, 4.2 GiB; Small 107, 26.3; Medium 311, 206.2; Large 612, 773.8; Jumbo 1,022, 3,109.5). Here
each model keeps its table count and is divided in size by ``scale``; table sizes fall off as a
power law over the tables (a few large, many small) and ids follow a power law within each table.
Every world size runs as its own job (torchrun for more than one rank), with the machine's cores
split between its ranks; the optimizer is Adagrad, as in the blog.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from ctrkit.data.batch import Batch
from ctrkit.data.loader import part_bounds
from ctrkit.data.synthetic import power_law_ids

MERLIN_MODELS = {  # name: (tables, total embedding GiB), from the blog's Table 2
    "tiny": (55, 4.2),
    "small": (107, 26.3),
    "medium": (311, 206.2),
    "large": (612, 773.8),
    "jumbo": (1022, 3109.5),
}


@dataclass(frozen=True)
class ScaleBenchConfig:
    """One measurement: a synthetic model at one world size."""

    model: str = "tiny"
    scale: float = 1024.0
    embedding_dim: int = 32
    batch_size: int = 4096
    warmup: int = 3
    steps: int = 15
    sharding: str = "auto"
    seed: int = 0

    def validate(self) -> None:
        if self.model not in MERLIN_MODELS:
            raise ValueError(f"`models`: unknown model '{self.model}'; expected {', '.join(MERLIN_MODELS)}")
        if self.scale < 1:
            raise ValueError(f"`scale` must be >= 1, got {self.scale}")


def table_sizes(model: str, scale: float, dim: int) -> list[int]:
    """Rows per table: the model's total size divided by ``scale``, spread as (i + 1) ** -1 over tables."""
    tables, gib = MERLIN_MODELS[model]
    total_rows = gib * 2**30 / scale / (4 * dim)
    weights = 1.0 / np.arange(1, tables + 1)
    return [max(2, int(r)) for r in total_rows * weights / weights.sum()]


def _batches(cfg: ScaleBenchConfig, cards: list[int], n: int) -> list[Batch]:
    rng = np.random.default_rng(cfg.seed)
    out = []
    for _ in range(n):
        sparse = np.stack([power_law_ids(rng, c, cfg.batch_size, 1.1) for c in cards], 1)  # (B, F)
        dense = rng.normal(0.0, 1.0, (cfg.batch_size, 13)).astype(np.float32)  # (B, 13)
        labels = (rng.random(cfg.batch_size) < 0.25).astype(np.float32)  # (B,)
        out.append(Batch(torch.from_numpy(dense), torch.from_numpy(sparse), torch.from_numpy(labels)))
    return out


def run_worker(cfg: ScaleBenchConfig, env=None) -> dict:
    """Times training steps of the synthetic DLRM; in a torchrun job every rank calls this."""
    from ctrkit.distributed.hybrid import HybridModel, plan_model
    from ctrkit.models.registry import create_model, make_config
    from ctrkit.models.storage import DEFERRED
    from ctrkit.train.optim import build_optimizers
    from ctrkit.train.step import TrainStep

    cfg.validate()
    cards = table_sizes(cfg.model, cfg.scale, cfg.embedding_dim)
    torch.manual_seed(cfg.seed)
    shape = dict(
        num_numerical=13,
        cardinalities=cards,
        embedding_dim=cfg.embedding_dim,
        bottom_mlp=(512, 256, cfg.embedding_dim),
        top_mlp=(512, 256, 1),
        linear=False,  # the Merlin benchmark's DLRM
    )
    world, rank = (env.world_size, env.rank) if env is not None else (1, 0)
    if env is None:
        model = create_model("dlrm", make_config("dlrm", shape))
    else:  # as `ctrkit train` does: each rank allocates only its shards
        model = create_model("dlrm", make_config("dlrm", shape), DEFERRED)
        model = HybridModel(model, plan_model(model, world, cfg.sharding), rank, torch.device("cpu"))
    optimizers = build_optimizers(model, "adagrad", 0.01, "adagrad", 0.01)
    step = TrainStep(model, optimizers, torch.device("cpu"))
    batches = _batches(cfg, cards, 4)
    if env is not None:
        batches = [b.rows(slice(*part_bounds(0, len(b), rank, world))) for b in batches]
    times = []
    for i in range(cfg.warmup + cfg.steps):
        start = time.perf_counter()
        step(batches[i % len(batches)], global_size=cfg.batch_size if env is not None else None)
        if env is not None:
            torch.distributed.barrier()
        if i >= cfg.warmup:
            times.append(time.perf_counter() - start)
    ms = statistics.median(times) * 1e3
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # MiB (ru_maxrss is in KiB on Linux)
    peaks: list[float] = [peak]
    if env is not None:
        peaks = [0.0] * world  # each rank's, gathered
        torch.distributed.all_gather_object(peaks, peak)
    return {
        "benchmark": "scale",
        **asdict(cfg),
        "world_size": world,
        "tables": len(cards),
        "embedding_mib": sum(cards) * cfg.embedding_dim * 4 / 2**20,
        "largest_table_rows": max(cards),
        "ms_per_step": ms,
        "samples_per_s": cfg.batch_size / ms * 1e3,
        "threads_per_rank": torch.get_num_threads(),
        "peak_rss_mib_per_rank": peaks,
        "largest_rank_peak_rss_mib": max(peaks),
    }


def run_scale_bench(cfg: ScaleBenchConfig, world_sizes: list[int]) -> list[dict]:
    """One job per world size (torchrun above one rank, cores split between ranks); results in order."""
    from ctrkit.bench.peak import where_it_ran

    cfg.validate()
    results = []
    cores = os.cpu_count() or 1
    where = where_it_ran()  # the machine and its matmul peak, measured by this process on all cores
    for world in world_sizes:
        if world < 1:
            raise ValueError(f"`world_sizes`: world sizes must be >= 1, got {world}")
        with tempfile.TemporaryDirectory(prefix="ctrkit-scale-") as tmp:
            out = Path(tmp) / "result.json"
            worker = ["-m", "ctrkit", "bench", "scale", "--worker-output", str(out), *_flags(cfg)]
            if world == 1:
                cmd = [sys.executable, *worker]
            else:
                cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(world)]
                cmd += ["--master-addr", "127.0.0.1", "--master-port", str(free_port()), *worker]
            env = {**os.environ, "OMP_NUM_THREADS": str(max(1, cores // world))}
            done = subprocess.run(cmd, capture_output=True, text=True, env=env)
            if done.returncode != 0:
                raise RuntimeError(f"scale benchmark at world size {world} failed: {done.stderr.strip()[-800:]}")
            result = json.loads(out.read_text())
        result.update(where)
        results.append(result)
    return results


def _flags(cfg: ScaleBenchConfig) -> list[str]:
    return [
        "--models", cfg.model, "--scale", str(cfg.scale), "--embedding-dim", str(cfg.embedding_dim),
        "--batch-size", str(cfg.batch_size), "--warmup", str(cfg.warmup), "--steps", str(cfg.steps),
        "--sharding", cfg.sharding, "--seed", str(cfg.seed),
    ]  # fmt: skip


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
