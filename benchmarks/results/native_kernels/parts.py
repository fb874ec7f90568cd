"""The parts of a training step the C kernels replace, timed inside real steps with the kernels on and off in the
same process (interleaved rounds): DLRM's interaction (its autograd function's forward and backward) and each
sparse row optimizer's step. The bench's shape and each model's default optimizers, as `ctrkit bench train`.
Usage: OMP_WAIT_POLICY=PASSIVE python benchmarks/results/native_kernels/parts.py [MODEL] [ROUNDS]"""

import collections
import statistics
import sys
import time

import numpy as np
import torch

import ctrkit.models.interaction as interaction
from ctrkit.bench import train_bench
from ctrkit.bench.config import TrainBenchConfig
from ctrkit.bench.peak import machine
from ctrkit.models.inputs import BottomTopConfig
from ctrkit.models.registry import config_class, create_model, make_config, train_defaults
from ctrkit.train.optim import build_optimizers
from ctrkit.train.trainer import TrainStep

model_name = sys.argv[1] if len(sys.argv) > 1 else "dlrm"
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 4
torch.set_num_threads(2)
torch.manual_seed(0)
cfg = TrainBenchConfig(model=model_name)
shape = {"num_numerical": cfg.num_numerical, "cardinalities": (cfg.table_rows,) * cfg.num_tables,
         "embedding_dim": cfg.embedding_dim, "sparse_gradients": True}  # fmt: skip
if "bottom_mlp" in config_class(model_name).__dataclass_fields__:
    shape["bottom_mlp"] = BottomTopConfig.bottom_mlp[:-1] + (cfg.embedding_dim,)
model = create_model(model_name, make_config(model_name, shape))
d = train_defaults(model_name)
opts = build_optimizers(model, d.get("optimizer", "sgd"), 1e-3, d.get("embedding_optimizer", "sgd"), 1e-3,
                        d.get("wide_optimizer", "sgd"), 1e-3)  # fmt: skip
step = TrainStep(model, opts, torch.device("cpu"), None)
batches = train_bench.make_batches(cfg, np.random.default_rng(0))
times = collections.defaultdict(list)
mode = ["aten"]


def timed(label, fn):
    def run(*args, **kwargs):
        t0 = time.perf_counter()
        out = fn(*args, **kwargs)
        times[(label, mode[0])].append(time.perf_counter() - t0)
        return out

    return run


for fn_class in (interaction._DotInteractionFn, interaction._NativeDotInteractionFn):
    fn_class.forward = staticmethod(timed("interaction forward", fn_class.forward))
    fn_class.backward = staticmethod(timed("interaction backward", fn_class.backward))
row_opts = [o for o in opts if hasattr(o, "native_on_cpu")]
for o in row_opts:
    o.step = timed(f"{o.kind} on {'first-order ' if getattr(o, 'is_wide', False) else ''}tables", o.step)
steps = collections.defaultdict(list)
for i in range(8):
    step(batches[i % 16])
for _ in range(rounds):
    for m in ("aten", "native"):
        mode[0] = m
        for o in row_opts:
            o.native_on_cpu = m == "native"
        for layer in model.modules():
            if hasattr(layer, "use_native"):
                layer.use_native = m == "native"
        for i in range(3):
            step(batches[i % 16])
        t0 = time.perf_counter()
        for i in range(20):
            step(batches[i % 16])
        steps[m].append((time.perf_counter() - t0) / 20 * 1e3)
info = machine()
print(f"{model_name} fp32, {rounds} interleaved rounds of 20 steps, {info['cpu']} ({info['capability']}), "
      f"{info['threads']} threads, OMP_WAIT_POLICY={info['omp_wait_policy']}; ms, medians over the rounds' steps")  # fmt: skip
for label in dict.fromkeys(k[0] for k in times):
    a, n = times[(label, "aten")], times[(label, "native")]
    if a and n:
        print(f"  {label:34s} ATen {statistics.median(a) * 1e3:6.2f}   native {statistics.median(n) * 1e3:6.2f}")
print(
    f"  {'whole step':34s} ATen {statistics.median(steps['aten']):6.2f}   native {statistics.median(steps['native']):6.2f}"
    f"   per round {[round(x, 1) for x in steps['aten']]} / {[round(x, 1) for x in steps['native']]}"
)
