"""The row optimizers' C kernels built without and with -fno-math-errno ("errno" / "vector"), one thread: lazy Adam
on the rows of a 2.6M x 16 table and Adagrad on a 2.6M x 1 table (huge pages, as the trainer allocates them) that a
batch of 1,024 x 26 random ids looks up (26 tables of 100k rows, flat), 8 distinct batches a round, interleaved
rounds, medians; and whether the two builds give the same bits (1,000-row table, 3,000 ids, repeats)."""

import json
import statistics
import sys
import time

import torch

from ctrkit import hugepages, native
from ctrkit.bench.peak import machine
from ctrkit.train import optim

torch.set_num_threads(1)
libs = {"errno": native.build(tuple(f for f in native.FLAGS if f != "-fno-math-errno")), "vector": native.build()}


def adam(lib, w, m, v, b, t):
    ids, order, rows, starts, vals = b
    lib.ctrkit_rows_adam_f32(w.data_ptr(), m.data_ptr(), v.data_ptr(), vals.data_ptr(), order.data_ptr(),
                             rows.data_ptr(), starts.data_ptr(), len(rows), len(ids), w.shape[1], 1e-3, 0.9, 0.999,
                             1e-8, float(t))  # fmt: skip


def adagrad(lib, w, s, b):
    ids, order, rows, starts, vals = b
    lib.ctrkit_rows_adagrad_f32(w.data_ptr(), s.data_ptr(), vals.data_ptr(), order.data_ptr(), rows.data_ptr(),
                                starts.data_ptr(), len(rows), len(ids), w.shape[1], 1e-3, 1e-10)  # fmt: skip


def batch(num_rows, n, width, g):
    ids = torch.randint(0, num_rows, (n,), generator=g)
    return (ids, *optim._native_sort(ids, num_rows), torch.randn(n, width, generator=g))


R, F, B = 100_000, 26, 1024
g = torch.Generator().manual_seed(0)
tables = {d: [hugepages.zeros_like(torch.empty(R * F, d)) for _ in range(3)] for d in (16, 1)}
batches = {}
for d in (16, 1):
    batches[d] = []
    for _ in range(8):
        ids = (torch.randint(0, R, (B, F), generator=g) + torch.arange(F) * R).flatten()
        batches[d].append((ids, *optim._native_sort(ids, R * F), torch.randn(len(ids), d, generator=g)))
times = {(k, d): [] for k in libs for d in (16, 1)}
t = 0
for r in range(int(sys.argv[1]) if len(sys.argv) > 1 else 15):
    for k in libs if r % 2 == 0 else list(libs)[::-1]:
        for d in (16, 1):
            t0 = time.perf_counter()
            for b in batches[d]:
                t += 1
                w, m, v = tables[d]
                adam(libs[k], w, m, v, b, t) if d == 16 else adagrad(libs[k], w, m, b)
            times[(k, d)].append((time.perf_counter() - t0) / len(batches[d]) * 1e6)
same = True
for rep in range(5):
    out = {}
    for k, lib in libs.items():
        g = torch.Generator().manual_seed(rep)
        w, m, v = (
            torch.randn(1000, 16, generator=g),
            torch.rand(1000, 16, generator=g),
            torch.rand(1000, 16, generator=g),
        )
        w1, s1 = w[:, :1].clone(), m[:, :1].clone()
        b, b1 = batch(1000, 3000, 16, g), batch(1000, 3000, 1, g)
        adam(lib, w, m, v, b, rep + 1)
        adagrad(lib, w1, s1, b1)
        out[k] = (w, m, v, w1, s1)
    same &= all(torch.equal(x, y) for x, y in zip(out["errno"], out["vector"]))
result = {
    "us_per_batch": {
        f"{k} {'adam D16' if d == 16 else 'adagrad D1'}": statistics.median(v) for (k, d), v in times.items()
    },
    "rounds": {f"{k} {d}": v for (k, d), v in times.items()},
    "distinct_rows_per_batch": statistics.mean(len(b[2]) for b in batches[16]),
    "bit_equal": same,
    "machine": machine(),
}
print(json.dumps(result, indent=1))
