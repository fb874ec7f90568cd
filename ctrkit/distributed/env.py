"""Process-group bootstrap from torchrun's environment: gloo on CPU, NCCL on CUDA, chosen at run time.

This is the one place below the CLI that reads environment variables (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, and the rendezvous variables torchrun sets for ``init_process_group``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

DEFAULT_TIMEOUT_S = 120


@dataclass(frozen=True)
class DistEnv:
    """This process's place in the job."""

    rank: int
    world_size: int
    local_rank: int
    backend: str
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def local_world_size(self) -> int:
        """Ranks on this node (torchrun's LOCAL_WORLD_SIZE; the whole job when it is not set)."""
        return int(os.environ.get("LOCAL_WORLD_SIZE", self.world_size))

    @property
    def part(self) -> tuple[int, int]:
        """(rank, world size): which slice of every batch this rank reads."""
        return self.rank, self.world_size


def launched_by_torchrun() -> bool:
    """True when torchrun (or SLURM via torchrun) started this process: one of several, or a job of one
    rank that torchrun launched (it runs the hybrid-parallel path, collectives included, on one rank)."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1 or "TORCHELASTIC_RUN_ID" in os.environ


def init_distributed(device: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S) -> DistEnv:
    """Joins the process group torchrun describes; NCCL when this rank gets a CUDA device, else gloo.

    A collective that waits longer than ``timeout_s`` (a peer died, the network went away) fails
    with an error instead of hanging.
    """
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device in (None, "auto"):
        use_cuda = torch.cuda.is_available()
    else:
        use_cuda = torch.device(device).type == "cuda"
        if use_cuda and not torch.cuda.is_available():
            raise ValueError(f"`device` {device}: CUDA was requested but no CUDA device is available")
    if use_cuda:
        torch.cuda.set_device(local_rank)
        dev, backend = torch.device("cuda", local_rank), "nccl"
    else:
        dev, backend = torch.device("cpu"), "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
    return DistEnv(rank, world, local_rank, backend, dev)


def gather_in_order(values: np.ndarray, positions: np.ndarray, total: int) -> np.ndarray:
    """Every rank's ``values`` placed at their global ``positions``: the (total,) array, on every rank."""
    pieces: list = [None] * dist.get_world_size()
    dist.all_gather_object(pieces, (positions, values))
    out = np.empty(total, dtype=values.dtype)
    seen = np.zeros(total, dtype=bool)
    for pos, val in pieces:
        out[pos] = val
        seen[pos] = True
    if not seen.all():
        raise RuntimeError(f"ranks returned {int(seen.sum())} of {total} predictions")
    return out


def collective_device() -> torch.device:
    """Where tensors handed to collectives must live: the current CUDA device under NCCL, else the CPU."""
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_reduce_sum(value: float) -> float:
    t = torch.tensor([value], dtype=torch.float64, device=collective_device())
    dist.all_reduce(t)
    return float(t)
