"""The pieces of the 2026-11-26 change alone, old way against new, interleaved rounds (README, Benchmarks).

- a sparse table optimizer's step (26 tables x 100,000 rows, a Criteo-shape batch's ids, the sort included):
  torch's fused kernel on the gathered rows (``fused_on_cpu`` True) against the elementwise operations (False);
- the sort of those ids on two threads against one;
- the numerical buckets' forward and backward (batch 2,048 x 13 features, 15 buckets): the comparison and
  torch's backward of indexing, against the module's training path.

Run: OMP_WAIT_POLICY=PASSIVE python benchmarks/results/fused_row_optim/alone.py [ROUNDS]
"""

import statistics
import sys
import time

import torch

from ctrkit.device import cpu_kind
from ctrkit.models.inputs import NumericalBuckets, bucket_of
from ctrkit.train import optim

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 4
torch.set_num_threads(2)
N = 2_600_000
gen = torch.Generator().manual_seed(0)
IDS = [(torch.randint(0, 100_000, (2048, 26), generator=gen) + torch.arange(26) * 100_000).flatten() for _ in range(10)]


def table_step(kind: str, dim: int, fused: bool, steps: int = 20) -> float:
    """Median ms of an optimizer step over ``steps`` (the first 3 left out)."""
    torch.manual_seed(1)
    p = torch.nn.Parameter(torch.randn(N, dim) * 0.01)
    opt = optim.SparseRowOptimizer([p], kind, lr=0.01)
    opt.fused_on_cpu = fused
    times = []
    for i in range(steps):
        ids = IDS[i % len(IDS)]
        p.grad = torch.sparse_coo_tensor(ids.unsqueeze(0), torch.randn(len(ids), dim, generator=gen), (N, dim))
        optim._LAST_SORT.clear()  # the sort in each step, as the first table optimizer of a step pays it
        t = time.perf_counter()
        opt.step()
        times.append(time.perf_counter() - t)
    return statistics.median(times[3:]) * 1e3


def timed(fn, n: int = 30) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def on_threads(threads: int, fn):
    def run():
        torch.set_num_threads(threads)
        try:
            return fn()
        finally:
            torch.set_num_threads(2)

    return run


keys = IDS[0].to(torch.int32)
raw = torch.randn(2048, 13, generator=gen).exp() * 10
buckets = NumericalBuckets(13, 15)
buckets.fit(raw)
with torch.no_grad():
    buckets.weight.normal_(generator=gen)
upstream = torch.randn(2048, generator=gen)


def buckets_old():
    ids = bucket_of(raw.float(), buckets.cuts.float()) + buckets.offsets
    (buckets.weight[ids].sum(1) * upstream).sum().backward()
    buckets.weight.grad = None


def buckets_new():
    (buckets(raw) * upstream).sum().backward()
    buckets.weight.grad = None


cases = {
    "lazy adam, width 16": lambda fused: table_step("adam", 16, fused),
    "adagrad, width 16": lambda fused: table_step("adagrad", 16, fused),
    "adagrad, width 1": lambda fused: table_step("adagrad", 1, fused),
    "sort of 53k ids (old: 2 threads, new: 1)": lambda new: timed(
        on_threads(1 if new else 2, lambda: torch.sort(keys, stable=True))
    ),
    "buckets forward + backward": lambda new: timed(buckets_new if new else buckets_old),
}
results = {name: {"old": [], "new": []} for name in cases}
for _ in range(ROUNDS):
    for name, case in cases.items():
        results[name]["old"].append(case(False))
        results[name]["new"].append(case(True))
print(f"{cpu_kind()}, 2 threads, {ROUNDS} interleaved rounds, ms (per round):")
for name, r in results.items():
    print(f"  {name:42s} old {[round(v, 2) for v in r['old']]}  new {[round(v, 2) for v in r['new']]}")
