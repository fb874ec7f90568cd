"""In-process A/B: split off / split without parted rows / split with parted rows. argv: model rounds steps [amp]"""
import sys, time, statistics, torch
from ctrkit.bench.config import TrainBenchConfig
import ctrkit.bench.train_bench as T
from ctrkit.train.optim import SparseRowOptimizer
name, rounds, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
amp = "amp" in sys.argv
torch.set_num_threads(2)
setup = T.bench_setup(TrainBenchConfig(model=name, amp=amp), torch.device("cpu"))
step, batches = setup.step, setup.batches
real = SparseRowOptimizer.step_deferring_rows
def whole(self):
    self.step(); return []
def setv(split, parted):
    step.split = "auto"; step.split_threads = 2 if split else 1
    SparseRowOptimizer.step_deferring_rows = real if parted else whole
variants = {"off": lambda: setv(False, False), "split": lambda: setv(True, False), "split_parted": lambda: setv(True, True)}
times = {k: [] for k in variants}
for r in range(rounds):
    items = list(variants.items())
    for k, f in (items if r % 2 == 0 else items[::-1]):
        f()
        for i in range(3): step(batches[i % len(batches)])
        t0 = time.perf_counter()
        for i in range(steps): step(batches[i % len(batches)])
        times[k].append((time.perf_counter() - t0) / steps * 1e3)
for k, v in times.items():
    print(f"{name} {'bf16' if amp else 'fp32'} {k:13} median ms {statistics.median(v):.2f}", [round(x, 2) for x in v])
print("off / split per round", [round(a / b, 3) for a, b in zip(times["off"], times["split"])])
print("off / split_parted per round", [round(a / b, 3) for a, b in zip(times["off"], times["split_parted"])])
print("split / split_parted per round", [round(a / b, 3) for a, b in zip(times["split"], times["split_parted"])])
