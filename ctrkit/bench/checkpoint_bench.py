"""What the digest (``ctrkit.integrity``) costs a checkpoint's save and load.

Each round writes one checkpoint with the digest (``save_checkpoint``) and one without (the same atomic write of the
same dict, unsealed), then reads each back (``read_torch_file``, verifying the first), the variants taking turns,
and times the digest alone. It also opens each memory-mapped (``mmap``: what ``serve --embedding-store mmap``,
``convert-checkpoint`` and a sharded checkpoint's lazy reads do), verifying the first: a verified memory-mapped open
reads the whole file once and drops its pages. Times are medians over rounds; the files are read from the page
cache, the fastest a load gets, so the digest's share is at its largest. Every step starts after ``os.sync()``, so a
save pays its own writeback only; the digest's time against the plain save's is the cleaner measure of its share all
the same.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import torch

from ctrkit.bench.config import CheckpointBenchConfig
from ctrkit.checkpoint import Checkpoint, save_checkpoint
from ctrkit.checkpoint_files import read_torch_file, torch_save
from ctrkit.data.atomic import atomic_file
from ctrkit.integrity import tensor_digest


def _checkpoint(size_mb: int) -> Checkpoint:
    generator = torch.Generator().manual_seed(0)
    rows = size_mb * 2**20 // (128 * 4)
    model = {
        "embeddings.weight": torch.randn(rows, 128, generator=generator),  # the seeds' table width
        "top_mlp.0.weight": torch.randn(1024, 512, generator=generator),
        "top_mlp.0.bias": torch.zeros(1024),
    }
    return Checkpoint(model_name="dlrm", model_config={}, spec={}, model=model, step=1)


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def run_checkpoint_bench(cfg: CheckpointBenchConfig) -> dict[str, Any]:
    """Save and load seconds with and without the digest, per round and as medians, and the overheads."""
    cfg.work.mkdir(parents=True, exist_ok=True)
    ckpt = _checkpoint(cfg.size_mb)
    sealed_path, plain_path = cfg.work / "digest.pt", cfg.work / "plain.pt"

    def save_plain() -> None:
        with atomic_file(plain_path) as tmp:
            torch_save(ckpt.to_dict(), tmp)

    names = ("save", "save_digest", "load", "load_digest", "mmap", "mmap_digest", "digest")
    times: dict[str, list[float]] = {k: [] for k in names}
    steps = {
        "save_digest": lambda: save_checkpoint(sealed_path, ckpt),
        "save": save_plain,
        "load_digest": lambda: read_torch_file(sealed_path, verify=True),
        "load": lambda: read_torch_file(plain_path, verify=False),
        "mmap_digest": lambda: read_torch_file(sealed_path, mmap=True, verify=True),
        "mmap": lambda: read_torch_file(plain_path, mmap=True, verify=False),
        "digest": lambda: tensor_digest(ckpt.to_dict()),
    }
    for r in range(cfg.rounds):  # which variant goes first alternates: neither always meets the other's writeback
        first, second = ("save_digest", "load_digest"), ("save", "load")
        a, b = (first, second) if r % 2 == 0 else (second, first)
        c = ("mmap_digest", "mmap") if r % 2 == 0 else ("mmap", "mmap_digest")
        order = (a[0], b[0], a[1], b[1], *c, "digest")
        for name in order:
            os.sync()  # each save pays its own writeback, not the one before it
            times[name].append(_timed(steps[name]))
    median = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
    for p in (sealed_path, plain_path):
        Path(p).unlink(missing_ok=True)
    return {
        "size_mb": cfg.size_mb,
        "rounds": cfg.rounds,
        "seconds": times,
        "median_seconds": median,
        "save_overhead": median["save_digest"] / median["save"] - 1,
        "load_overhead": median["load_digest"] / median["load"] - 1,
        "mmap_overhead": median["mmap_digest"] / median["mmap"] - 1,
        "digest_share_of_save": median["digest"] / median["save"],
    }
