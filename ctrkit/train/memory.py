"""How much memory a run will hold at its peak, and how much it may have: the plan's memory check.

The estimate counts what a run allocates, from the model built on the meta device: the tables and dense
weights, their optimizer states (``STATE_BYTES``), the copies kept for model selection and ensembles, the
warm start's fit (transient: freed before the first copy of the best weights is taken and, in one CPU process,
before the deep tables are first written: ``storage.FILLED_LATER``) and the batches being scored;
plus what the process already holds when the plan is made (the interpreter, torch, the data's index).
What the process may have is the least of the machine's available memory, the room left under the memory
limit of each cgroup it runs in (v1 and v2) and under its own RLIMIT_DATA or RLIMIT_AS, or the free memory of the
GPU it trains on.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ctrkit.optimizers import kind

USABLE = 0.92  # share of the available memory a plan may fill (the allocator's slack, other processes' growth)
WARM_START_ID_BYTES = 24  # the warm start's fit, per id of the first-order tables (weights, index, L-BFGS vectors)
WARM_START_VALUE_BYTES = 20  # and per (row, feature) of the rows it fits (CSR matrices of both orientations)
WARM_START_ROWS = 1_000_000  # the warm start fits on at most this many training rows and validation rows each
SCORING_BYTES = 256  # per scored sample of an evaluation batch and feature (activations, logits, ids)
# the trainer's working memory besides the counted parts (batches in flight, threads' stacks, buffers of saves and
# scoring): what the estimate lacked against measured peaks on small shapes (docs/decisions/memory-plan.md)
RUNTIME_BYTES = 128 << 20


def working_bytes(eval_batch: int, inputs: int) -> int:
    """An evaluation batch's scoring (``SCORING_BYTES`` a sample and input) and the trainer's working memory."""
    return SCORING_BYTES * eval_batch * inputs + RUNTIME_BYTES


@dataclass(frozen=True)
class Room:
    """What the process may still allocate (bytes; None: unknown) and what set it."""

    bytes: int | None
    where: str
    per_process: bool = False  # a limit of each process (an rlimit, a GPU), not shared by a job's processes


def process_rss() -> int:
    """This process's resident memory that the kernel cannot drop, in bytes: anonymous and shared memory, not the
    pages of files it has read (a memory-mapped dataset scanned, the libraries), which are reclaimed under
    pressure (VmRSS where the split is not reported; 0 where /proc is not there)."""
    fields = {}
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssShmem"):
                fields[key] = int(value.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return 0
    if "RssAnon" in fields:
        return fields["RssAnon"] + fields.get("RssShmem", 0)
    return fields.get("VmRSS", 0)


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max": no limit


def _cgroup_dirs() -> list[Path]:
    """This process's memory cgroup directories, innermost first, then each parent up to the root."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return []
    dirs = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        roots = []
        if "memory" in controllers.split(","):  # v1
            roots = [Path("/sys/fs/cgroup/memory")]
        elif controllers == "":  # v2 (alone, or beside v1 as "unified")
            roots = [Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified")]
        for root in roots:
            here = root / path.lstrip("/")
            while True:
                dirs.append(here)
                if here == root:
                    break
                here = here.parent
    return dirs


def _inactive_file(d: Path) -> int:
    """The cgroup's inactive file pages (v1's ``total_inactive_file``, v2's ``inactive_file``): counted in its
    usage, reclaimed first (a memory-mapped file read once, a dataset scanned)."""
    try:
        for line in (d / "memory.stat").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key in ("total_inactive_file", "inactive_file"):
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


def cgroup_room() -> Room | None:
    """The least room left under this process's cgroup memory limits, or None where none is set."""
    best: Room | None = None
    for d in _cgroup_dirs():
        for limit_file, usage_file in (("memory.limit_in_bytes", "memory.usage_in_bytes"),
                                       ("memory.max", "memory.current")):  # fmt: skip
            limit, usage = _read_int(d / limit_file), _read_int(d / usage_file)
            if limit is None or usage is None or limit >= 1 << 60:  # v1 writes "no limit" as a huge number
                continue
            room = max(limit - usage + _inactive_file(d), 0)  # file pages read once: the kernel reclaims them
            if best is None or room < best.bytes:
                best = Room(room, f"the memory cgroup {d} (limit {gib(limit)})")
    return best


def machine_room() -> Room:
    """MemAvailable of /proc/meminfo (None where unreadable)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return Room(int(line.split()[1]) * 1024, "this machine's available memory")
    except (OSError, ValueError, IndexError):
        pass
    return Room(None, "unknown")


def rlimit_room() -> Room | None:
    """The room under this process's RLIMIT_DATA (against its VmData) or RLIMIT_AS (against VmSize), the
    smaller; None where neither is set."""
    import resource

    status = {}
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmData", "VmSize"):
                status[key] = int(value.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    best: Room | None = None
    for limit_name, used in (("RLIMIT_DATA", "VmData"), ("RLIMIT_AS", "VmSize")):
        soft, _ = resource.getrlimit(getattr(resource, limit_name))
        if soft == resource.RLIM_INFINITY or used not in status:
            continue
        left = max(soft - status[used], 0)
        if best is None or left < best.bytes:
            best = Room(left, f"this process's {limit_name} (limit {gib(soft)})", per_process=True)
    return best


def room(device: str = "cpu") -> Room:
    """What this process may still allocate where it trains: the GPU's free memory on CUDA; else the least of
    the machine's available memory and the cgroups' room."""
    if device == "cuda":
        import torch

        free, total = torch.cuda.mem_get_info()
        return Room(int(free), f"the GPU's free memory ({gib(total)} in all)", per_process=True)
    rooms = [r for r in (machine_room(), cgroup_room(), rlimit_room()) if r is not None and r.bytes is not None]
    return min(rooms, key=lambda r: r.bytes) if rooms else Room(None, "unknown")


def gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def table_state_bytes(optimizer: str, table_bytes: int, table_rows: int) -> int:
    """Optimizer state of tables of ``table_bytes`` (float32 values) and ``table_rows`` rows (``optimizers.KINDS``:
    bytes per weight value and per row)."""
    record = kind(optimizer)
    return record.state_per_value * (table_bytes // 4) + record.state_per_row * table_rows


def local_processes(processes: int, budget: Room | None = None) -> int:
    """The processes of a job that share ``budget`` (torchrun's LOCAL_WORLD_SIZE; 1 for a per-process limit)."""
    if budget is not None and budget.per_process:
        return 1
    try:
        return max(1, min(processes, int(os.environ.get("LOCAL_WORLD_SIZE", processes))))
    except ValueError:
        return processes


def tables_directory(save_checkpoint: Any) -> Path:
    """Where files of tables (the tables on disk, the best weights' tables) go: beside the checkpoint, or in the
    temporary directory without one."""
    return Path(save_checkpoint).parent if save_checkpoint is not None else Path(tempfile.gettempdir())


def check_disk_room(spec: Any, memory: dict, free: int | None, tables: bool = True) -> None:
    """Refuses (one line) a run whose best weights' copy and, where ``tables``, tables on disk with their state
    would not fit in the ``free`` bytes of the disk of ``tables_directory`` (None: unknown, not checked)."""
    where = tables_directory(spec.save_checkpoint)
    needed = memory["copies_on_disk"] + (memory["tables_in_tier"] if tables else 0)
    what = "the tables on disk need" if tables else "the best weights' copy on disk needs"
    if free is not None and needed > free:
        raise ValueError(
            f"{where}: {what} about {gib(needed)}{' (with their optimizer state and the best weights copy)' * tables}"
            f", the disk has {gib(free)} free: free space, or save the checkpoint on another disk"
        )


def check_host_room(needed: int, host: Room) -> None:
    """Refuses (one line) a run whose tables in host memory, with their optimizer state (and, on a CPU, the rest of
    the run: ``needed`` bytes), would not fit in what the CPU's memory leaves (``host``; unknown: not checked)."""
    if host.bytes is not None and needed > host.bytes * USABLE:
        raise ValueError(
            f"the tables in host memory need about {gib(needed)} with their optimizer state, {host.where} has "
            f"{gib(host.bytes)}: use `embedding_storage` disk on a CPU, a smaller `embedding_dim` or "
            "`embedding_sizes`, or more machines with torchrun"
        )
