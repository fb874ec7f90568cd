"""Embedding tables and their row optimizers' states are backed by transparent huge pages (Linux)."""

import pathlib
import re

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


def huge_kib(t: torch.Tensor) -> int:
    """AnonHugePages (KiB) of the mapping in /proc/self/smaps that holds the middle of ``t``'s memory."""
    address = t.data_ptr() + t.nbytes // 2
    inside = False
    for line in pathlib.Path("/proc/self/smaps").read_text().splitlines():
        span = re.match(r"^([0-9a-f]+)-([0-9a-f]+) ", line)
        if span:
            inside = int(span[1], 16) <= address < int(span[2], 16)
        elif inside and line.startswith("AnonHugePages:"):
            return int(line.split()[1])
    raise AssertionError("no mapping holds the tensor")


@needs_thp
def test_tables_and_adam_states_live_in_huge_pages():
    torch.manual_seed(0)
    # 51 MB: above glibc's largest mmap threshold (32 MiB), so fresh pages even in a long-lived process
    tables = EmbeddingCollection([300_000, 100_000], 32)
    assert huge_kib(tables.weight) >= 32 * 1024  # at least 16 of its 2 MiB pages
    opt = SparseRowOptimizer(tables.table_parameters(), "adam", lr=0.01)
    F.embedding(torch.tensor([[3, 370_000]]), tables.weight, sparse=True).sum().backward()
    opt.step()
    state = opt.state[tables.weight]
    assert huge_kib(state["exp_avg"]) >= 32 * 1024 and huge_kib(state["exp_avg_sq"]) >= 32 * 1024

    # a state loaded from a checkpoint is copied into huge pages too, with its values
    saved = {k: v.clone() for k, v in state.items() if isinstance(v, torch.Tensor)}
    loaded = SparseRowOptimizer(tables.table_parameters(), "adam", lr=0.01)
    loaded.load_state_dict(opt.state_dict())
    again = loaded.state[tables.weight]
    assert huge_kib(again["exp_avg_sq"]) >= 32 * 1024
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
