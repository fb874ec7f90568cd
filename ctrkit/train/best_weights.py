"""The best weights' tables kept on disk: model selection's copy without a second copy of the tables in memory.

A table is copied into a file-backed shared mapping (``torch.from_file``) of a file created beside the
checkpoint, its blocks reserved first (a full disk is an error now, never a SIGBUS mid-copy) and unlinked at
once (nothing is left behind, however the process ends). Once copied, its pages are dropped from this process
(``madvise(MADV_DONTNEED)``: the data stays in the file and the page cache, which the kernel writes back and
reclaims under memory pressure), so the copy costs disk, not resident memory. Reading it back (restoring the
best weights, saving the checkpoint) faults the pages in from the file.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ctrkit.checkpoint_files import drop_pages
from ctrkit.hugepages import file_tensor

ON_DISK_FROM = 64 << 20  # tensors of this many bytes or more go to disk (the tables); smaller ones stay in memory


def kept_on_disk(t: torch.Tensor, directory: Path | None) -> bool:
    """Whether the best weights' copy of ``t`` lives on disk: with a ``directory``, from ``ON_DISK_FROM`` bytes."""
    return directory is not None and t.numel() * t.element_size() >= ON_DISK_FROM


def drop_resident(t: torch.Tensor) -> None:
    """Drops the whole pages of ``t`` (a file-backed shared mapping) from this process's resident memory."""
    drop_pages(t.data_ptr(), t.numel() * t.element_size())


def release(state: dict[str, torch.Tensor] | None, directory: Path | None) -> None:
    """Drops from resident memory the pages of ``state``'s tensors kept on disk (``copy_state`` with
    ``directory``), after a read of them (a checkpoint's save, restoring the best weights) faulted them in."""
    if state is None or directory is None:
        return
    for v in state.values():
        if v.device.type == "cpu" and kept_on_disk(v, directory):
            drop_resident(v)


def copy_state(state: dict[str, torch.Tensor], into: dict[str, torch.Tensor] | None, directory: Path | None
               ) -> dict[str, torch.Tensor]:  # fmt: skip
    """A copy of ``state`` (``into``'s tensors reused where their shapes fit); with ``directory``, tensors of
    ``ON_DISK_FROM`` bytes or more are copied to disk (``file_tensor``; a GPU's too: no second copy of its tables
    in the GPU's memory), their pages dropped."""
    out = {}
    with torch.no_grad():
        for k, v in state.items():
            big = kept_on_disk(v, directory)
            old = into.get(k) if into is not None else None
            where = torch.device("cpu") if big else v.device  # a copy on disk is in the CPU's mapping of its file
            if old is not None and old.shape == v.shape and old.dtype == v.dtype and old.device == where:
                target = old
            elif big and directory is not None:  # (``kept_on_disk`` is true only with a directory)
                target = file_tensor(v, directory)
            else:
                out[k] = v.detach().clone()
                continue
            target.copy_(v)
            if big:
                drop_resident(target)
            out[k] = target
    return out
