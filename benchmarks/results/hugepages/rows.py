"""Gather and write back 17,800 random rows of a 2.6M x 16 float32 table (a lazy-Adam step's row work on the
Criteo-Kaggle shape), 50 times, median of 5; run with THP_MEM_ALLOC_ENABLE=0 and =1 (torch's switch: 2 MiB pages for
every large allocation). Prints ms per gather + write and the process's AnonHugePages."""

import time

import torch

torch.set_num_threads(2)
w = torch.randn(2_600_000, 16)
m1 = torch.zeros_like(w)
m2 = torch.zeros_like(w)
idx = torch.randint(0, 2_600_000, (17800,))
for _ in range(20):
    w.index_select(0, idx)
ts = []
for _ in range(5):
    s = time.perf_counter()
    for _ in range(50):
        idx = torch.randint(0, 2_600_000, (17800,))
        r = w.index_select(0, idx)
        w.index_copy_(0, idx, r)
    ts.append((time.perf_counter() - s) / 50 * 1e3)
print(sorted(ts)[2], "ms", [line for line in open("/proc/self/smaps_rollup") if "AnonHuge" in line])
