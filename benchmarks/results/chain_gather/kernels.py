"""Kernels alone, one thread, interleaved rounds, medians (us): the embedding lookup of a batch of 1,024 DLRM rows
(26 features of 100,000 rows, widths 16 and 1) by ATen's embedding and by ctrkit's prefetching C gather; the stable
sort of the batch of 2,048's 53,248 flat ids by torch.sort (as int32, with unique_consecutive and cumsum) and by the
C radix sort. Usage: OMP_WAIT_POLICY=PASSIVE python benchmarks/results/chain_gather/kernels.py"""

import json
import statistics
import time

import numpy as np
import torch
import torch.nn.functional as F

from ctrkit import hugepages, native
from ctrkit.bench.config import TrainBenchConfig
from ctrkit.bench.peak import machine
from ctrkit.bench.train_bench import make_batches
from ctrkit.models.embeddings import _GatherRowsFn
from ctrkit.train import optim

torch.set_num_threads(1)
hugepages.retain_freed_memory()
offsets = torch.arange(26) * 100_000
small = make_batches(TrainBenchConfig(batch_size=1024), np.random.default_rng(0))
big = make_batches(TrainBenchConfig(batch_size=2048), np.random.default_rng(0))
evict = torch.empty(50_000_000)  # touched between rounds: the tables' rows come from memory, as in a step


def torch_sort(ids):
    ordered, order = torch.sort(ids.to(torch.int32), stable=True)
    rows, counts = torch.unique_consecutive(ordered, return_counts=True)
    return order, rows.long(), torch.cumsum(counts, 0) - counts


out = {"machine": machine(), "us": {}}
for dim in (16, 1):
    table = hugepages.empty(2_600_000, dim).uniform_().requires_grad_()
    cases = {
        f"lookup D={dim} ATen": lambda b, t=table: F.embedding(b.categorical + offsets, t, sparse=True),
        f"lookup D={dim} C gather": lambda b, t=table: _GatherRowsFn.apply(t, b.categorical, offsets),
    }
    times = {k: [] for k in cases}
    for r in range(60):
        if r % 4 == 0:
            evict.add_(1.0)
        for k, f in cases.items() if r % 2 else reversed(cases.items()):
            b = small[r % len(small)]
            t0 = time.perf_counter()
            f(b)
            times[k].append(time.perf_counter() - t0)
    out["us"].update({k: statistics.median(v) * 1e6 for k, v in times.items()})
ids = [(b.categorical + offsets).reshape(-1) for b in big]
assert native.library() is not None
cases = {"sort torch": lambda i: torch_sort(i), "sort C radix": lambda i: optim._native_sort(i, 2_600_000)}
times = {k: [] for k in cases}
for r in range(60):
    for k, f in cases.items() if r % 2 else reversed(cases.items()):
        t0 = time.perf_counter()
        f(ids[r % len(ids)])
        times[k].append(time.perf_counter() - t0)
out["us"].update({k: statistics.median(v) * 1e6 for k, v in times.items()})
print(json.dumps(out, indent=1))
