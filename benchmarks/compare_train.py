"""ctrkit's DLRM training step against two references on the same shape and the same batches, in
interleaved rounds: a plain PyTorch DLRM (one flat ``nn.Embedding(sparse=True)`` table, ``bmm`` dot
interaction, ``torch.optim.SGD``) and, where TorchRec and fbgemm-gpu-cpu are importable, TorchRec's
DLRM on a ``FusedEmbeddingBagCollection`` (FBGEMM's table-batched embedding bags with the SGD update
fused into the backward pass). All three train with SGD, fp32. The JSON also holds the fp32 matmul peak measured
before and after the rounds, the matrix multiplies' FLOPs a sample (the same layers in all three), each one's
fraction of the peak, and ctrkit's speed-up per round with its median.

TorchRec is not one of ctrkit's dependencies; install it beside torch in another environment:

    python -m venv --system-site-packages /tmp/trvenv && /tmp/trvenv/bin/pip install torch==2.13.0
    /tmp/trvenv/bin/pip install --no-deps torchrec==1.8.0 fbgemm-gpu-cpu==1.8.0
    /tmp/trvenv/bin/pip install tensordict iopath pyre-extensions typing-inspect mypy-extensions
    OMP_WAIT_POLICY=PASSIVE /tmp/trvenv/bin/python benchmarks/compare_train.py --out build/bench/compare
    .venv/bin/python benchmarks/collect.py compare build/bench/compare \
        --command ".venv/bin/python benchmarks/compare_train.py"

Without TorchRec the run compares ctrkit with the plain model only (and says so in its JSON).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ctrkit.bench.config import TrainBenchConfig  # noqa: E402
from ctrkit.bench.peak import machine, matmul_gflops  # noqa: E402
from ctrkit.bench.train_bench import dense_flops_per_sample, make_batches  # noqa: E402
from ctrkit.models.mlp import MLP  # noqa: E402
from ctrkit.models.registry import create_model, make_config  # noqa: E402
from ctrkit.train.optim import build_optimizers  # noqa: E402
from ctrkit.train.step import TrainStep  # noqa: E402

F_LOSS = nn.functional.binary_cross_entropy_with_logits


class PlainDLRM(nn.Module):
    """DLRM as a PyTorch user writes it first: one flat sparse table with per-feature offsets."""

    def __init__(self, cardinalities, dim: int, num_numerical: int, bottom, top):
        super().__init__()
        cards = torch.tensor(list(cardinalities))
        tables = len(cards)
        self.register_buffer("offsets", torch.cumsum(cards, 0) - cards)
        self.embedding = nn.Embedding(int(cards.sum()), dim, sparse=True)
        self.bottom = MLP(num_numerical, bottom)  # ctrkit's MLP for the same initial weights, run as nn.Sequential:
        self.bottom.use_native = False  # ATen's Linear and ReLU only, none of ctrkit's C kernels
        pairs = torch.tril_indices(tables + 1, tables + 1, offset=-1)
        self.register_buffer("rows_i", pairs[0])
        self.register_buffer("cols_i", pairs[1])
        self.top = MLP(dim + pairs.shape[1], top, relu_last=False)
        self.top.use_native = False

    def forward(self, numerical, categorical):
        x = self.bottom(numerical)  # (B, D)
        t = torch.cat([x.unsqueeze(1), self.embedding(categorical + self.offsets)], 1)  # (B, F + 1, D)
        z = torch.bmm(t, t.transpose(1, 2))[:, self.rows_i, self.cols_i]  # (B, P)
        return self.top(torch.cat([x, z], 1)).squeeze(1)


def ctrkit_model(cfg: TrainBenchConfig) -> nn.Module:
    shape = dict(num_numerical=cfg.num_numerical, cardinalities=(cfg.table_rows,) * cfg.num_tables,
                 embedding_dim=cfg.embedding_dim, bottom_mlp=cfg.bottom_mlp, top_mlp=cfg.top_mlp,
                 linear=False)  # fmt: skip
    return create_model("dlrm", make_config("dlrm", shape))


def ctrkit_step(cfg: TrainBenchConfig, lr: float):
    model = ctrkit_model(cfg)
    step = TrainStep(model, build_optimizers(model, "sgd", lr, "sgd", lr), torch.device("cpu"))
    return lambda b: step(b)


def plain_step(cfg: TrainBenchConfig, lr: float):
    model = PlainDLRM((cfg.table_rows,) * cfg.num_tables, cfg.embedding_dim, cfg.num_numerical, cfg.bottom_mlp,
                      cfg.top_mlp)  # fmt: skip
    opt = torch.optim.SGD(model.parameters(), lr=lr)

    def step(b):
        loss = F_LOSS(model(b.numerical, b.categorical), b.labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss.detach()

    return step


def torchrec_step(cfg: TrainBenchConfig, lr: float):
    from torchrec.models.dlrm import DLRM
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.fused_embedding_modules import FusedEmbeddingBagCollection
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    keys = [f"f{i}" for i in range(cfg.num_tables)]
    tables = [EmbeddingBagConfig(name=f"t{i}", embedding_dim=cfg.embedding_dim, num_embeddings=cfg.table_rows,
                                 feature_names=[k]) for i, k in enumerate(keys)]  # fmt: skip
    ebc = FusedEmbeddingBagCollection(tables, optimizer_type=torch.optim.SGD, optimizer_kwargs={"lr": lr},
                                      device=torch.device("cpu"))  # fmt: skip
    model = DLRM(ebc, cfg.num_numerical, list(cfg.bottom_mlp), list(cfg.top_mlp))
    dense = [p for n, p in model.named_parameters() if "sparse_arch" not in n]
    opt = torch.optim.SGD(dense, lr=lr)
    kjts: dict[int, KeyedJaggedTensor] = {}

    def step(b):
        kjt = kjts.get(id(b))
        if kjt is None:  # built once per distinct batch, outside the timed loop's steady state
            n = b.categorical.shape[0]
            kjt = kjts[id(b)] = KeyedJaggedTensor.from_lengths_sync(
                keys, b.categorical.t().reshape(-1), torch.ones(cfg.num_tables * n, dtype=torch.int32)
            )
        loss = F_LOSS(model(b.numerical, kjt).squeeze(1), b.labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()  # the tables are updated inside backward (fused)
        opt.step()
        return loss.detach()

    return step


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-size", type=int, default=2048)
    p.add_argument("--table-rows", type=int, default=100_000)
    p.add_argument("--steps", type=int, default=30, help="timed steps per round and implementation")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds; medians are reported")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--out", type=Path, default=None, help="directory for compare_train.json")
    a = p.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    cfg = TrainBenchConfig(batch_size=a.batch_size, table_rows=a.table_rows, embedding_dim=16,
                           bottom_mlp=(512, 256, 64, 16), top_mlp=(512, 256, 1))  # fmt: skip
    batches = make_batches(cfg, np.random.default_rng(0))
    impls = {"ctrkit": ctrkit_step, "plain_pytorch": plain_step}
    notes = {}
    try:
        import torchrec

        impls["torchrec_fused"] = torchrec_step
        notes["torchrec"] = torchrec.__version__
    except ImportError as e:
        notes["torchrec"] = f"not importable ({e})"
    steps = {}
    for name, make in impls.items():
        torch.manual_seed(0)
        steps[name] = make(cfg, a.lr)
        for i in range(a.warmup):
            steps[name](batches[i % len(batches)])
    # the matrix multiplies' FLOPs a sample (the same layers in all three) and the fp32 matmul peak before and after
    flops = dense_flops_per_sample(ctrkit_model(cfg), batches[0])["train_step"]
    peaks = [matmul_gflops(torch.float32)]
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(a.rounds):
        for name, step in steps.items():
            t0 = time.perf_counter()
            for i in range(a.steps):
                step(batches[i % len(batches)])
            times[name].append((time.perf_counter() - t0) / a.steps)
    peaks.append(matmul_gflops(torch.float32))
    peak = statistics.mean(peaks)
    result = {
        "benchmark": "compare_train",
        "shape": {"batch_size": cfg.batch_size, "tables": cfg.num_tables, "table_rows": cfg.table_rows,
                  "embedding_dim": 16, "bottom_mlp": cfg.bottom_mlp, "top_mlp": cfg.top_mlp, "optimizer": "sgd"},
        "samples_per_s": {n: cfg.batch_size / statistics.median(t) for n, t in times.items()},
        "ms_per_step_rounds": {n: [x * 1000 for x in t] for n, t in times.items()},
        "threads": torch.get_num_threads(),
        "machine": machine(),
        "notes": notes,
        "flops_per_sample": flops,
        "matmul_peak_gflops": {"fp32_before": peaks[0], "fp32_after": peaks[1]},
    }  # fmt: skip
    result["fraction_of_fp32_peak"] = {n: flops * v / 1e9 / peak for n, v in result["samples_per_s"].items()}
    base = result["samples_per_s"]["ctrkit"]
    result["ctrkit_speedup"] = {n: base / v for n, v in result["samples_per_s"].items() if n != "ctrkit"}
    result["ctrkit_speedup_per_round"] = {n: [b / c for b, c in zip(times[n], times["ctrkit"])]
                                          for n in times if n != "ctrkit"}  # fmt: skip
    result["ctrkit_speedup_per_round_median"] = {n: statistics.median(r)
                                                 for n, r in result["ctrkit_speedup_per_round"].items()}  # fmt: skip
    text = json.dumps(result, indent=2)
    print(text)
    if a.out is not None:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "compare_train.json").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
