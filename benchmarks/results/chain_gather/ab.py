"""In-process A/B of whole training steps (`ctrkit bench train`'s model, optimizers and batches): "base" with the
MLPs layer by layer (MLP.use_chain False), ATen's embedding lookups (EmbeddingCollection.use_native False) and
torch.sort for the row optimizers' ids, against "new" with the chained MLP, the C gather and the C radix sort.
Interleaved rounds, medians. argv: model rounds steps [amp] [threads=N] [split=auto|on|off] [batch=N]"""
import sys, time, statistics, torch
from ctrkit.bench.config import TrainBenchConfig
import ctrkit.bench.train_bench as T
from ctrkit.models.mlp import MLP
from ctrkit.models.embeddings import EmbeddingCollection
name, rounds, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
amp = "amp" in sys.argv
threads = int(next((a.split("=")[1] for a in sys.argv if a.startswith("threads=")), 2))
split = next((a.split("=")[1] for a in sys.argv if a.startswith("split=")), "auto")
bs = int(next((a.split("=")[1] for a in sys.argv if a.startswith("batch=")), 2048))
torch.set_num_threads(threads)
setup = T.bench_setup(TrainBenchConfig(model=name, amp=amp, batch_size=bs, split_batch=split), torch.device("cpu"))
step, batches = setup.step, setup.batches
mods = list(step.model.modules())
import ctrkit.train.optim as O
real_sort = O._native_sort
def setv(new):
    O._native_sort = real_sort if new else (lambda *a: None)
    for m in mods:
        if isinstance(m, MLP): m.use_chain = new
        if isinstance(m, EmbeddingCollection): m.use_native = new
variants = {"base": lambda: setv(False), "new": lambda: setv(True)}
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
    print(f"{name} {'bf16' if amp else 'fp32'} {k:6} median ms {statistics.median(v):.2f}", [round(x, 2) for x in v])
print("base / new per round", [round(a / b, 3) for a, b in zip(times["base"], times["new"])])
import json, os
from ctrkit.bench.peak import machine
print(json.dumps({"machine": machine()}))
