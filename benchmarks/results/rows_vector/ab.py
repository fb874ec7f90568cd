"""In-process A/B of the C kernels built without and with -fno-math-errno ("errno" / "vector": the row optimizers'
square roots and divisions scalar behind an errno branch, or vector instructions). Both libraries are built from the
same sources; the step's library is swapped between rounds. argv: model rounds steps [amp]. Interleaved rounds,
medians of ms per whole training step (bench_setup: batch 2048, the model's default optimizers)."""

import ctypes
import statistics
import sys
import time

import torch

import ctrkit.bench.train_bench as T
from ctrkit import native
from ctrkit.bench.config import TrainBenchConfig
from ctrkit.bench.peak import machine

name, rounds, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
amp = "amp" in sys.argv
libs = {}
flags = native.FLAGS
for k, drop in (("errno", "-fno-math-errno"), ("vector", None)):
    native.FLAGS = tuple(f for f in flags if f != drop)
    lib = ctypes.CDLL(str(native._build(native._compiler())))
    for fn_name, args in native.SIGNATURES.items():
        fn = getattr(lib, fn_name)
        fn.argtypes, fn.restype = args, native.RETURNS.get(fn_name)
    libs[k] = lib
native.FLAGS = flags
native.library()  # loaded once; replaced below each round
torch.set_num_threads(2)
setup = T.bench_setup(TrainBenchConfig(model=name, amp=amp), torch.device("cpu"))
step, batches = setup.step, setup.batches
times = {k: [] for k in libs}
for r in range(rounds):
    items = list(libs.items())
    for k, lib in items if r % 2 == 0 else items[::-1]:
        native._loaded[0] = lib
        for i in range(3):
            step(batches[i % len(batches)])
        t0 = time.perf_counter()
        for i in range(steps):
            step(batches[i % len(batches)])
        times[k].append((time.perf_counter() - t0) / steps * 1e3)
for k, v in times.items():
    print(f"{name} {'bf16' if amp else 'fp32'} {k:6} median ms {statistics.median(v):.2f}", [round(x, 2) for x in v])
ratios = [a / b for a, b in zip(times["errno"], times["vector"])]
print("errno / vector per round", [round(x, 3) for x in ratios], "median", round(statistics.median(ratios), 3))
print("optimizers", setup.optimizers, "machine", machine())
