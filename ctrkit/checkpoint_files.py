"""The files a checkpoint is made of: torch files sealed with their digest (``integrity``), written atomically and
read back verified (memory-mapped or whole), and the pages of a memory-mapped file dropped once read.

The typed checkpoint (``checkpoint.py``) and a hybrid-parallel run's rank files (``checkpoint_shards.py``) both
stand on it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch.utils.serialization import config as serialization_config

from ctrkit.data.atomic import atomic_file
from ctrkit.integrity import KEY as DIGEST
from ctrkit.integrity import check, sealed, tensor_bytes

MADV_DONTNEED = 4  # Linux


class CheckpointError(ValueError):
    """A checkpoint that cannot be read or does not fit the data or model it is used with."""


def write_sealed(path: str | os.PathLike, data: dict[str, Any]) -> str:
    """``data`` with its tensors' digest, written atomically to ``path``; returns the digest."""
    data = sealed(data)
    with atomic_file(path, needs=tensor_bytes(data)) as tmp:
        torch_save(data, tmp)
    return data[DIGEST]["value"]


def torch_save(obj: Any, path: str | os.PathLike) -> None:
    """``torch.save`` without the zip records' CRC-32: ``torch.load`` does not check it (a test: changed bytes
    load without error), and computing it took half of a checkpoint's save time (docs/decisions/checkpoint-crc.md)."""
    with serialization_config.patch({"save.compute_crc32": False}):  # type: ignore[attr-defined]  # (made at runtime)
        torch.save(obj, path)


def read_torch_file(path: Path, mmap: bool = False, verify: bool = True) -> Any:
    """What ``torch.load`` reads from ``path`` (tensors and plain containers only), its digest checked (with
    ``verify``) when it has one: checking a memory-mapped file reads all of it once, its pages then dropped."""
    if not path.exists():
        raise CheckpointError(f"{path}: checkpoint not found")
    try:
        data = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as e:  # truncated file, not a torch file, forbidden pickled object
        raise CheckpointError(
            f"{path}: not a readable ctrkit checkpoint ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
        ) from None
    problem = check(data) if verify else None
    if problem is not None:
        raise CheckpointError(f"{path}: refused: {problem}")
    if mmap and verify:
        _drop_read_pages(data)  # the check read every page in: back to the file (re-read on use)
    return data


def _drop_read_pages(data: Any) -> None:
    """Drops from this process's resident memory the pages of the memory-mapped tensors in ``data``."""
    stack, seen = [data], set()
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
        elif isinstance(item, torch.Tensor) and item.device.type == "cpu" and item.nbytes >= 1 << 20:
            storage = item.untyped_storage()
            if storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                drop_pages(storage.data_ptr(), storage.nbytes())


def mapped_file_range(address: int, path: str | os.PathLike) -> tuple[int, int] | None:
    """The (start, end) addresses of this process's mapping of file ``path`` that holds ``address``, from
    /proc/self/maps; None if there is none (not Linux, or the memory is not that file's)."""
    try:
        target = os.path.realpath(path)
        with open("/proc/self/maps") as f:
            for line in f:
                fields_ = line.split(maxsplit=5)
                lo, hi = (int(x, 16) for x in fields_[0].split("-"))
                if lo <= address < hi and len(fields_) == 6 and os.path.realpath(fields_[5].strip()) == target:
                    return lo, hi
    except (OSError, ValueError):
        return None
    return None


def drop_pages(start: int, length: int, libc: Any = None, page: int | None = None) -> None:
    """``madvise(MADV_DONTNEED)`` on the whole pages inside [start, start + length) of a file mapping: they leave
    this process's resident memory (a private mapping's read again from the file, a shared one's kept in the
    file and the page cache). Nothing where libc or the page size cannot be had."""
    import ctypes

    try:
        libc = libc if libc is not None else ctypes.CDLL(None, use_errno=True)
        page = page or os.sysconf("SC_PAGE_SIZE")
    except (OSError, AttributeError, ValueError):
        return
    lo = -(-start // page) * page
    hi = (start + length) // page * page
    if hi > lo:
        libc.madvise(ctypes.c_void_p(lo), ctypes.c_size_t(hi - lo), ctypes.c_int(MADV_DONTNEED))
