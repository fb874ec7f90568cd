"""Whole training steps in one process with ctrkit/native's kernels as at a given commit ("old", argv[1]: 0b01286,
before the interaction's forward stored whole registers and transposed in registers) against this tree's ("new"),
swapped between interleaved rounds. argv: COMMIT model rounds steps [amp]. Medians of ms a step (bench_setup: batch
2048, the model's default optimizers, 2 threads) and of the per-round ratios old / new."""

import sys

import torch

import ctrkit.bench.train_bench as T
from ctrkit import native
from ctrkit.bench.ab import interleaved_rounds, native_library_at, summary
from ctrkit.bench.config import TrainBenchConfig
from ctrkit.bench.peak import machine

commit, name, rounds, steps = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
amp = "amp" in sys.argv[5:]
libs = {"old": native_library_at(commit), "new": native.build()}
native.library()  # loaded once; replaced below each round
torch.set_num_threads(2)
setup = T.bench_setup(TrainBenchConfig(model=name, amp=amp), torch.device("cpu"))
variants = {k: (lambda lib=lib: native._loaded.__setitem__(0, lib)) for k, lib in libs.items()}
times = interleaved_rounds(setup.step, setup.batches, variants, rounds, steps)
print("\n".join(summary(times, "old", f"{name} {'bf16' if amp else 'fp32'} ")))
print("machine", machine())
