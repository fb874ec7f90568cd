"""Forward passes only (as `evaluate --amp` scores): fp32 against bf16 autocast on one device, by batch, in
interleaved rounds; prints the median samples/s and the per-round ratio range.

    python3 benchmarks/results/cuda_amp/forward.py [--device cuda] [--batches 2048,16384,65536]
"""

import argparse
import statistics
import time

import numpy as np
import torch

from ctrkit.bench.config import TrainBenchConfig
from ctrkit.bench.train_bench import make_batches
from ctrkit.models.registry import create_model, make_config

p = argparse.ArgumentParser()
p.add_argument("--device", default="cuda")
p.add_argument("--batches", default="2048,16384,65536")
p.add_argument("--rounds", type=int, default=3)
p.add_argument("--steps", type=int, default=30)
args = p.parse_args()
device = torch.device(args.device)
sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
res: dict = {}
for _ in range(args.rounds):
    for name in ("dlrm", "dcnv2", "wide_deep"):
        torch.manual_seed(0)
        shape = {"cardinalities": (100_000,) * 26, "embedding_dim": 16, "num_numerical": 13}
        if name != "wide_deep":
            shape["bottom_mlp"] = (512, 256, 16)  # the Criteo-Kaggle bottom MLP, as `bench train` builds it
        cfg = make_config(name, shape)
        model = create_model(name, cfg).to(device).eval()
        for b in map(int, args.batches.split(",")):
            batch = make_batches(TrainBenchConfig(batch_size=b, distinct_batches=1), np.random.default_rng(0))[0]
            dense, sparse = batch.numerical.to(device), batch.categorical.to(device)
            for prec in ("fp32", "bf16"):
                with torch.inference_mode(), torch.autocast(device.type, torch.bfloat16, enabled=prec == "bf16"):
                    for _ in range(3):
                        model(dense, sparse)
                    sync()
                    t0 = time.perf_counter()
                    for _ in range(args.steps):
                        model(dense, sparse)
                    sync()
                res.setdefault((name, b, prec), []).append(b * args.steps / (time.perf_counter() - t0))
for name in ("dlrm", "dcnv2", "wide_deep"):
    for b in map(int, args.batches.split(",")):
        f, h = res[(name, b, "fp32")], res[(name, b, "bf16")]
        rs = [y / x for x, y in zip(f, h)]
        print(
            f"{name} {b} fp32 {statistics.median(f):,.0f} bf16 {statistics.median(h):,.0f} samples/s  "
            f"bf16/fp32 {min(rs):.2f}-{max(rs):.2f}x"
        )
