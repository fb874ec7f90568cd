"""In-process A/B of the C kernels built without and with -fno-math-errno ("errno" / "vector": the row optimizers'
square roots and divisions scalar behind an errno branch, or vector instructions). Both libraries are built from the
same sources; the step's library is swapped between rounds. argv: model rounds steps [amp]. Interleaved rounds,
medians of ms per whole training step (bench_setup: batch 2048, the model's default optimizers)."""

import sys

import torch

import ctrkit.bench.train_bench as T
from ctrkit import native
from ctrkit.bench.ab import interleaved_rounds, summary
from ctrkit.bench.config import TrainBenchConfig
from ctrkit.bench.peak import machine

name, rounds, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
amp = "amp" in sys.argv
libs = {"errno": native.build(tuple(f for f in native.FLAGS if f != "-fno-math-errno")), "vector": native.build()}
native.library()  # loaded once; replaced below each round
torch.set_num_threads(2)
setup = T.bench_setup(TrainBenchConfig(model=name, amp=amp), torch.device("cpu"))
variants = {k: (lambda lib=lib: native._loaded.__setitem__(0, lib)) for k, lib in libs.items()}
times = interleaved_rounds(setup.step, setup.batches, variants, rounds, steps, warmup=3)
print("\n".join(summary(times, "errno", f"{name} {'bf16' if amp else 'fp32'} ")))
print("optimizers", setup.optimizers, "machine", machine())
