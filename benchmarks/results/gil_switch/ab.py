"""In-process A/B of Python's thread switch interval (``sys.setswitchinterval``) in the split training step: how long
a worker thread that waits for the GIL lets the holder run before it asks for it. argv: model rounds steps [amp]
[intervals in ms, comma-separated; default 5 (Python's default), 1, 0.2]. Interleaved rounds (the order rotating),
medians of ms per whole step (bench_setup: batch 2048, the model's default optimizers, 2 threads)."""

import statistics
import sys
import time

import torch

import ctrkit.bench.train_bench as T
from ctrkit.bench.config import TrainBenchConfig
from ctrkit.bench.peak import machine

name, rounds, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
amp = "amp" in sys.argv[4:]
given = [a for a in sys.argv[4:] if a != "amp"]
intervals = [float(x) for x in (given[0].split(",") if given else ("5", "1", "0.2"))]
torch.set_num_threads(2)
setup = T.bench_setup(TrainBenchConfig(model=name, amp=amp), torch.device("cpu"))
step, batches = setup.step, setup.batches
times = {ms: [] for ms in intervals}
for r in range(rounds):
    order = intervals[r % len(intervals):] + intervals[: r % len(intervals)]
    for ms in order:
        sys.setswitchinterval(ms / 1000)
        for i in range(2):
            step(batches[i % len(batches)])
        t0 = time.perf_counter()
        for i in range(steps):
            step(batches[i % len(batches)])
        times[ms].append((time.perf_counter() - t0) / steps * 1e3)
base = intervals[0]
for ms, v in times.items():
    ratios = [a / b for a, b in zip(times[base], v)]
    print(f"{name} {'bf16' if amp else 'fp32'} switch {ms} ms: median {statistics.median(v):.2f} ms a step;",
          f"{base} ms / this per round median {statistics.median(ratios):.3f}", [round(x, 2) for x in v])  # fmt: skip
print("machine", machine())
