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


RETAIN_PROBE = """
import resource, sys, torch, numpy as np
from ctrkit import hugepages
if sys.argv[1] == "default":
    hugepages.retain_freed_memory = lambda: False  # TrainStep calls it on the CPU
from ctrkit.bench.config import TrainBenchConfig
from ctrkit.bench.train_bench import make_batches
from ctrkit.models.registry import create_model, make_config
from ctrkit.train.optim import build_optimizers
from ctrkit.train.step import TrainStep
torch.set_num_threads(2)
shape = dict(num_numerical=13, cardinalities=(1000,) * 8, embedding_dim=16, bottom_mlp=(512, 256, 16))
model = create_model("dlrm", make_config("dlrm", shape))
step = TrainStep(model, build_optimizers(model, "sgd", 0.01, "sgd", 0.01, "sgd", 0.01), torch.device("cpu"))
batches = make_batches(TrainBenchConfig(batch_size=2048, table_rows=1000, num_tables=8, distinct_batches=2),
                       np.random.default_rng(0))
for i in range(5):
    step(batches[i % 2])
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for i in range(20):
    step(batches[i % 2])
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 20)
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc")
def test_training_steps_reuse_freed_memory_under_glibc():
    """TrainStep on the CPU calls retain_freed_memory: each step's activations reuse the pages the last one freed
    instead of faulting in fresh ones. Minor page faults a DLRM step at batch 2,048, in child processes, with and
    without it (here: 945-2,014 a step without, 0.7-129 with, over four runs of each; since the chained MLP and the
    split step allocate less, 215-918 without and 52-129 with, so the bound is half)."""
    counts = {}
    for mode in ("default", "retain"):
        done = subprocess.run([sys.executable, "-c", RETAIN_PROBE, mode], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        counts[mode] = float(done.stdout.split()[-1])
    assert counts["retain"] * 2 < counts["default"], counts
