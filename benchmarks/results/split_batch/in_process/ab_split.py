"""In-process A/B: split off / split without parted rows / split with parted rows. argv: model rounds steps [amp]"""

import sys

import torch

import ctrkit.bench.train_bench as T
from ctrkit.bench.ab import interleaved_rounds, summary
from ctrkit.bench.config import TrainBenchConfig
from ctrkit.train.optim import SparseRowOptimizer

name, rounds, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
amp = "amp" in sys.argv
torch.set_num_threads(2)
setup = T.bench_setup(TrainBenchConfig(model=name, amp=amp), torch.device("cpu"))
step = setup.step
real = SparseRowOptimizer.step_deferring_rows


def whole(self):
    self.step()
    return []


def setv(split, parted):
    step.split = "auto"
    step.split_threads = 2 if split else 1
    SparseRowOptimizer.step_deferring_rows = real if parted else whole


variants = {
    "off": lambda: setv(False, False),
    "split": lambda: setv(True, False),
    "split_parted": lambda: setv(True, True),
}
times = interleaved_rounds(step, setup.batches, variants, rounds, steps, warmup=3)
label = f"{name} {'bf16' if amp else 'fp32'} "
print("\n".join(summary(times, "off", label) + summary(times, "split", label)[2:]))
