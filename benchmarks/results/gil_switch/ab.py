"""In-process A/B of Python's thread switch interval (``sys.setswitchinterval``) in the split training step: how long
a worker thread that waits for the GIL lets the holder run before it asks for it. argv: model rounds steps [amp]
[intervals in ms, comma-separated; default 5 (Python's default), 1, 0.2]. Interleaved rounds (the order rotating),
medians of ms per whole step (bench_setup: batch 2048, the model's default optimizers, 2 threads)."""

import sys

import torch

import ctrkit.bench.train_bench as T
from ctrkit.bench.ab import interleaved_rounds, summary
from ctrkit.bench.config import TrainBenchConfig
from ctrkit.bench.peak import machine

name, rounds, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
amp = "amp" in sys.argv[4:]
given = [a for a in sys.argv[4:] if a != "amp"]
intervals = given[0].split(",") if given else ["5", "1", "0.2"]
torch.set_num_threads(2)
setup = T.bench_setup(TrainBenchConfig(model=name, amp=amp), torch.device("cpu"))
variants = {f"switch {ms} ms": (lambda ms=ms: sys.setswitchinterval(float(ms) / 1000)) for ms in intervals}
times = interleaved_rounds(setup.step, setup.batches, variants, rounds, steps)
print("\n".join(summary(times, f"switch {intervals[0]} ms", f"{name} {'bf16' if amp else 'fp32'} ")))
print("machine", machine())
