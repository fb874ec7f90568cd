"""Embedding tables and their row optimizers' states are backed by transparent huge pages (Linux)."""

import pathlib
import platform
import re
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from ctrkit import hugepages
from ctrkit.models.embeddings import EmbeddingCollection
from ctrkit.train.optim import SparseRowOptimizer

THP = pathlib.Path("/sys/kernel/mm/transparent_hugepage/enabled")
needs_thp = pytest.mark.skipif(
    not THP.exists() or "[never]" in THP.read_text(), reason="this kernel has no transparent huge pages"
)


def vm_flags(t: torch.Tensor) -> set[str]:
    """The VmFlags in /proc/self/smaps of the mapping that holds the middle of ``t``'s memory ("hg": advised to
    huge pages). Whether the kernel then finds free 2 MiB pages depends on the machine's memory at the time,
    so the tests check the advice, which is ctrkit's part (the speed is measured in benchmarks/)."""
    address = t.data_ptr() + t.nbytes // 2
    inside = False
    for line in pathlib.Path("/proc/self/smaps").read_text().splitlines():
        span = re.match(r"^([0-9a-f]+)-([0-9a-f]+) ", line)
        if span:
            inside = int(span[1], 16) <= address < int(span[2], 16)
        elif inside and line.startswith("VmFlags:"):
            return set(line.split()[1:])
    raise AssertionError("no mapping holds the tensor")


@needs_thp
def test_tables_and_adam_states_live_in_huge_pages():
    # with freed memory kept as training keeps it (TrainStep on the CPU): tables above 32 MiB still mapped fresh
    hugepages.retain_freed_memory()
    torch.manual_seed(0)
    # 51 MB: above glibc's largest mmap threshold (32 MiB), so a mapping of its own
    tables = EmbeddingCollection([300_000, 100_000], 32)
    assert "hg" in vm_flags(tables.weight)
    opt = SparseRowOptimizer(tables.table_parameters(), "adam", lr=0.01)
    F.embedding(torch.tensor([[3, 370_000]]), tables.weight, sparse=True).sum().backward()
    opt.step()
    state = opt.state[tables.weight]
    assert "hg" in vm_flags(state["exp_avg"]) and "hg" in vm_flags(state["exp_avg_sq"])

    # a state loaded from a checkpoint is copied into huge pages too, with its values
    saved = {k: v.clone() for k, v in state.items() if isinstance(v, torch.Tensor)}
    loaded = SparseRowOptimizer(tables.table_parameters(), "adam", lr=0.01)
    loaded.load_state_dict(opt.state_dict())
    again = loaded.state[tables.weight]
    assert "hg" in vm_flags(again["exp_avg_sq"])
    assert all(torch.equal(again[k], v) for k, v in saved.items())
    assert again["exp_avg_sq"].abs().sum() > 0


def test_small_meta_and_switched_off_tensors_are_left_alone(monkeypatch):
    assert not hugepages.advise_huge_pages(torch.empty(1000))  # under 4 MiB: not worth a call
    assert not hugepages.advise_huge_pages(torch.empty(4_000_000, device="meta"))
    assert hugepages.zeros_like(torch.ones(10, 3)).eq(0).all()
    assert hugepages.full_like(torch.ones(2_000_000), 0.1).eq(0.1).all()  # filled after the advice
    monkeypatch.setenv("CTRKIT_HUGE_PAGES", "0")
    hugepages._madvise.cache_clear()
    try:
        assert not hugepages.advise_huge_pages(torch.empty(4_000_000))
    finally:
        monkeypatch.delenv("CTRKIT_HUGE_PAGES")
        hugepages._madvise.cache_clear()


@needs_thp
def test_the_advice_is_taken_on_this_kernel():
    assert hugepages.advise_huge_pages(torch.empty(4_000_000))  # 16 MB


KEPT_PROBE = """
import ctypes, sys, torch
from ctrkit import hugepages
if sys.argv[1] == "default":
    hugepages.retain_freed_memory = lambda: False  # TrainStep calls it on the CPU
from ctrkit.models.registry import create_model, make_config
from ctrkit.train.optim import build_optimizers
from ctrkit.train.step import TrainStep
shape = dict(num_numerical=13, cardinalities=(1000,) * 8, embedding_dim=16, bottom_mlp=(64, 16))
model = create_model("dlrm", make_config("dlrm", shape))
TrainStep(model, build_optimizers(model, "sgd", 0.01, "sgd", 0.01, "sgd", 0.01), torch.device("cpu"))

class Info(ctypes.Structure):  # glibc's struct mallinfo2
    names = "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost"
    _fields_ = [(name, ctypes.c_size_t) for name in names.split()]
libc = ctypes.CDLL(None)
libc.mallinfo2.restype = Info
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, (ctypes.c_size_t,)
libc.free.argtypes = (ctypes.c_void_p,)
def held():  # bytes malloc holds from the kernel: its heap and its mapped blocks
    info = libc.mallinfo2()
    return info.arena + info.hblkhd
base = held()
blocks = [libc.malloc(24 << 20) for _ in range(8)]
for block in reversed(blocks):
    libc.free(block)
print((held() - base) >> 20)
"""


def glibc_version() -> tuple[int, ...]:
    name, version = platform.libc_ver()
    return tuple(int(part) for part in version.split(".")) if name == "glibc" else ()


@pytest.mark.skipif(glibc_version() < (2, 33), reason="glibc's mallinfo2 (2.33 on)")
def test_a_training_process_keeps_the_memory_it_frees_under_glibc():
    """TrainStep on the CPU calls retain_freed_memory: glibc's malloc then serves blocks under 32 MiB from its heap
    and keeps what is freed for the next allocation, where by default it maps such blocks fresh or trims the heap
    beyond twice its mmap threshold (at most 32 MiB), so a step's activations fault their pages in again (the faults
    a step are measured in docs/decisions/memory-pages.md). Counted in malloc's own books (mallinfo2), in child
    processes with and without the call: 192 MiB of 24 MiB blocks freed."""
    kept = {}
    for mode in ("default", "retain"):
        done = subprocess.run([sys.executable, "-c", KEPT_PROBE, mode], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        kept[mode] = int(done.stdout.split()[-1])
    assert kept["retain"] >= 160 and kept["default"] <= 96, kept
