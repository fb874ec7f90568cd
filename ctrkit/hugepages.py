"""Transparent huge pages for the large tables a step reads and writes at random rows.

An optimizer step on the embeddings gathers and scatters a batch's distinct rows (about 18,000 of 2.6M
on the Criteo-Kaggle shape) in the tables and in their optimizer states. With 4 KiB pages nearly every
such row costs a TLB miss and a page walk. Linux backs a region with 2 MiB pages when it is advised to
(``madvise(MADV_HUGEPAGE)``), which many kernels require ("madvise" in
/sys/kernel/mm/transparent_hugepage/enabled). Only these tables are advised: torch's own switch for every
large allocation (``THP_MEM_ALLOC_ENABLE=1``) also covers each step's short-lived activations, whose
fresh huge pages made DLRM's training step slower, not faster (README, Benchmarks, "Huge pages").

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

import torch

HUGE_PAGE = 2 << 20  # bytes: the x86-64 and common Arm transparent huge page
MADV_HUGEPAGE = 14  # <sys/mman.h> on Linux
MIN_BYTES = 2 * HUGE_PAGE  # smaller tensors hold at most one aligned huge page: not worth a call


@functools.cache
def _madvise():
    """libc's madvise, or None where there is none to call (not Linux, switched off)."""
    if not sys.platform.startswith("linux") or os.environ.get("CTRKIT_HUGE_PAGES", "1") == "0":
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
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
