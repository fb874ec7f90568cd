"""In-process A/B of whole training steps (`ctrkit bench train`'s model, optimizers and batches): "base" with the
MLPs layer by layer (MLP.use_chain False), ATen's embedding lookups (EmbeddingCollection.use_native False) and
torch.sort for the row optimizers' ids, against "new" with the chained MLP, the C gather and the C radix sort.
Interleaved rounds, medians. argv: model rounds steps [amp] [threads=N] [split=auto|on|off] [batch=N]"""

import json
import sys

import torch

import ctrkit.bench.train_bench as T
import ctrkit.train.optim as O
from ctrkit.bench.ab import interleaved_rounds, summary
from ctrkit.bench.config import TrainBenchConfig
from ctrkit.bench.peak import machine
from ctrkit.models.embeddings import EmbeddingCollection
from ctrkit.models.mlp import MLP

name, rounds, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
amp = "amp" in sys.argv
threads = int(next((a.split("=")[1] for a in sys.argv if a.startswith("threads=")), 2))
split = next((a.split("=")[1] for a in sys.argv if a.startswith("split=")), "auto")
bs = int(next((a.split("=")[1] for a in sys.argv if a.startswith("batch=")), 2048))
torch.set_num_threads(threads)
setup = T.bench_setup(TrainBenchConfig(model=name, amp=amp, batch_size=bs, split_batch=split), torch.device("cpu"))
mods = list(setup.step.model.modules())
real_sort = O._native_sort


def setv(new):
    O._native_sort = real_sort if new else (lambda *a: None)
    for m in mods:
        if isinstance(m, MLP):
            m.use_chain = new
        if isinstance(m, EmbeddingCollection):
            m.use_native = new


times = interleaved_rounds(setup.step, setup.batches, {"base": lambda: setv(False), "new": lambda: setv(True)},
                           rounds, steps, warmup=3)  # fmt: skip
print("\n".join(summary(times, "base", f"{name} {'bf16' if amp else 'fp32'} ")))
print(json.dumps({"machine": machine()}))
