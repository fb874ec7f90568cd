"""In-process A/B of the split step's optimizer phase (2026-11-26): "before" (each worker's optimizers in index
order, the whole batch's ids sorted by the first row optimizer), "first" (the optimizers that hand rows over run
first on their worker, costliest first) and "merged" (that, and each slice's worker sorts its own ids after its
backward, the optimizers' phase merging the sorts). argv: model rounds steps [amp]. Interleaved rounds, the order
rotating; medians of ms per whole step (bench_setup: batch 2048, the model's default optimizers, 2 threads) and of
the per-round ratios against "before".

"merged" was measured and not kept (dlrm*.txt): its code is merged_sorts.patch here (`git apply` it onto d28ab08 or
later to run it again); without it the script runs "before" and "first"."""

import statistics
import sys
import time

import torch

import ctrkit.bench.train_bench as T
from ctrkit.bench.config import TrainBenchConfig
from ctrkit.bench.peak import machine
from ctrkit.train import split

name, rounds, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
amp = "amp" in sys.argv[4:]
torch.set_num_threads(2)
setup = T.bench_setup(TrainBenchConfig(model=name, amp=amp), torch.device("cpu"))
step, batches = setup.step, setup.batches
assign = split.assign
no_sorts = lambda grads: [None] * len(grads)  # noqa: E731
variants = {
    "before": (lambda costs, n, first=None: assign(costs, n), no_sorts),
    "first": (assign, no_sorts),
}
if hasattr(split, "sort_slice_ids"):
    variants["merged"] = (assign, split.sort_slice_ids)
times = {k: [] for k in variants}
names = list(variants)
for r in range(rounds):
    for k in names[r % len(names):] + names[: r % len(names)]:
        split.assign, split.sort_slice_ids = variants[k]
        for i in range(2):
            step(batches[i % len(batches)])
        t0 = time.perf_counter()
        for i in range(steps):
            step(batches[i % len(batches)])
        times[k].append((time.perf_counter() - t0) / steps * 1e3)
for k, v in times.items():
    ratios = [a / b for a, b in zip(times["before"], v)]
    print(f"{name} {'bf16' if amp else 'fp32'} {k:7} median {statistics.median(v):.2f} ms a step; before / this per",
          f"round median {statistics.median(ratios):.3f}", [round(x, 2) for x in v])  # fmt: skip
print("machine", machine())
