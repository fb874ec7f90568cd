"""How a CPU training process's memory is mapped: transparent huge pages for the large tables a step reads and
writes at random rows, and freed memory kept for the next step (``retain_freed_memory``).

An optimizer step on the embeddings gathers and scatters a batch's distinct rows (about 18,000 of 2.6M
on the Criteo-Kaggle shape) in the tables and in their optimizer states. With 4 KiB pages nearly every
such row costs a TLB miss and a page walk. Linux backs a region with 2 MiB pages when it is advised to
(``madvise(MADV_HUGEPAGE)``), which many kernels require ("madvise" in
/sys/kernel/mm/transparent_hugepage/enabled). Only these tables are advised: torch's own switch for every
large allocation (``THP_MEM_ALLOC_ENABLE=1``) also covers each step's short-lived activations, whose
fresh huge pages made DLRM's training step slower, not faster (docs/decisions/memory-pages.md).

The advice must come before the memory is first written, so the helpers here allocate, advise, then
fill. It takes for memory the allocator maps fresh: glibc maps every allocation above its mmap threshold
(at most 32 MiB), so any table of that size. A smaller one may reuse heap pages already written, which stay
small until the kernel's background collapsing reaches them.

Elsewhere (not Linux, not a CPU tensor, a kernel without transparent huge pages, a small tensor) they are
plain ``torch.empty`` / ``zeros`` / ``full``. ``CTRKIT_HUGE_PAGES=0`` turns the advice off.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import sys
import tempfile
from pathlib import Path

import torch

HUGE_PAGE = 2 << 20  # bytes: the x86-64 and common Arm transparent huge page
MADV_HUGEPAGE = 14  # <sys/mman.h> on Linux
MIN_BYTES = 2 * HUGE_PAGE  # smaller tensors hold at most one aligned huge page: not worth a call


@functools.cache
def _libc() -> ctypes.CDLL | None:
    """The C library, or None where it is not Linux's or cannot be loaded."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None


@functools.cache
def _madvise():
    """libc's madvise, or None where there is none to call (not Linux, switched off)."""
    libc = _libc()
    if libc is None or os.environ.get("CTRKIT_HUGE_PAGES", "1") == "0":
        return None
    fn = libc.madvise
    fn.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    fn.restype = ctypes.c_int
    return fn


def advise_huge_pages(t: torch.Tensor) -> bool:
    """Advises the kernel to back the whole 2 MiB pages inside ``t``'s memory with huge pages; True when
    the advice was taken. Call it before the memory is first written: pages already faulted in stay small
    until the kernel's background collapsing reaches them. A refused advice (no transparent huge pages in
    this kernel) changes nothing and is not an error."""
    fn = _madvise()
    if fn is None or t.device.type != "cpu" or t.is_sparse or t.nbytes < MIN_BYTES:
        return False
    start = -(-t.data_ptr() // HUGE_PAGE) * HUGE_PAGE
    end = (t.data_ptr() + t.nbytes) // HUGE_PAGE * HUGE_PAGE
    return end > start and fn(start, end - start, MADV_HUGEPAGE) == 0


def empty(*shape: int, dtype: torch.dtype | None = None, device=None) -> torch.Tensor:
    """``torch.empty`` advised to huge pages (CPU, Linux, 4 MiB and more); its values are garbage."""
    t = torch.empty(*shape, dtype=dtype, device=device)
    advise_huge_pages(t)
    return t


def empty_like(like: torch.Tensor) -> torch.Tensor:
    """A contiguous ``torch.empty_like`` advised to huge pages; its values are garbage."""
    t = torch.empty_like(like, memory_format=torch.contiguous_format)
    advise_huge_pages(t)
    return t


def full_like(like: torch.Tensor, value: float) -> torch.Tensor:
    """``torch.full_like`` advised to huge pages before it is filled."""
    return empty_like(like).fill_(value)


def zeros_like(like: torch.Tensor) -> torch.Tensor:
    """``torch.zeros_like`` advised to huge pages before it is filled."""
    return full_like(like, 0.0)


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's <malloc.h>
MMAP_THRESHOLD = 32 << 20  # glibc's largest: allocations above it are still mapped fresh (the tables)
TRIM_THRESHOLD = 1 << 30  # free memory at the heap's top kept up to this much


@functools.cache
def retain_freed_memory() -> bool:
    """Makes glibc's malloc keep freed memory for the next allocation rather than return it to the kernel, so a
    training step's activations reuse pages already mapped instead of faulting in fresh ones. Once per process;
    True where it took effect (glibc on Linux).

    By default glibc raises its mmap threshold to the size of each mapped block freed (so a step's 4 MiB
    activations come from the heap after a while) but trims the heap's top beyond twice that, and the next step
    faults those pages in again, hundreds of minor faults a step (docs/decisions/memory-pages.md). Fixing both
    thresholds keeps them: the heap grows to the step's peak and stays there, and blocks above 32 MiB (the tables) are
    still mapped fresh, so ``advise_huge_pages`` keeps working (test)."""
    mallopt = getattr(_libc(), "mallopt", None)
    if mallopt is None:
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    # musl and others accept mallopt and change nothing; glibc answers 1 to each
    return mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1


def file_tensor(like: torch.Tensor, directory: Path) -> torch.Tensor:
    """An empty tensor shaped as ``like`` (any device, meta included) in a file-backed shared mapping of an unlinked
    file in ``directory``: its blocks reserved first (a full disk fails here, never as a SIGBUS later), reading as
    zeros, gone however the process ends."""
    from ctrkit.data.atomic import disk_error

    nbytes = like.numel() * like.element_size()
    directory.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=directory, prefix=".ctrkit-tables-")
    try:
        try:
            os.posix_fallocate(fd, 0, nbytes)  # the blocks now: a full disk fails here, not as a SIGBUS later
        except OSError as e:
            problem = disk_error(e, Path(name), 0, nbytes)
            raise (problem if problem is not None else e) from None
        t = torch.from_file(name, shared=True, size=like.numel(), dtype=like.dtype)
    finally:
        os.close(fd)
        os.unlink(name)
    return t.view(like.shape)
