"""In-process A/B of the split step's optimizers: "meetings" (the optimizers dealt to the workers, then the tables'
rows parted over all in a meeting of their own: TrainStep._split_step of commit fb10cf8, from the file given,
`git show fb10cf8:ctrkit/train/trainer.py > OLD`) against "pieces" (one meeting: the rows in pieces that free workers
take as the optimizers hand them over). argv: OLD model rounds steps [amp]. Interleaved rounds, medians."""

import importlib.util
import statistics
import sys
import time

import torch

import ctrkit.bench.train_bench as T
from ctrkit.bench.config import TrainBenchConfig
from ctrkit.bench.peak import machine

old_path, name, rounds, steps = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
amp = "amp" in sys.argv
spec = importlib.util.spec_from_file_location("trainer_old", old_path)
old_module = importlib.util.module_from_spec(spec)
sys.modules["trainer_old"] = old_module  # dataclasses look their module up
spec.loader.exec_module(old_module)
torch.set_num_threads(2)
setup = T.bench_setup(TrainBenchConfig(model=name, amp=amp), torch.device("cpu"))
step, batches = setup.step, setup.batches
new_split = type(step)._split_step
variants = {"meetings": old_module.TrainStep._split_step, "pieces": new_split}
times = {k: [] for k in variants}
for r in range(rounds):
    items = list(variants.items())
    for k, fn in items if r % 2 == 0 else items[::-1]:
        step._split_step = fn.__get__(step)
        for i in range(3):
            step(batches[i % len(batches)])
        t0 = time.perf_counter()
        for i in range(steps):
            step(batches[i % len(batches)])
        times[k].append((time.perf_counter() - t0) / steps * 1e3)
for k, v in times.items():
    print(f"{name} {'bf16' if amp else 'fp32'} {k:8} median ms {statistics.median(v):.2f}", [round(x, 2) for x in v])
print("meetings / pieces per round", [round(a / b, 3) for a, b in zip(times["meetings"], times["pieces"])])
print("machine", machine())
