"""`--amp` against fp32 on one GPU, by batch size: `ctrkit bench train`'s measurement (run_train_bench) for each
model x batch x precision, in interleaved rounds in one process (the matmul peak taken once), each cell's
samples/s appended to rounds.jsonl as it is measured; then one profile per precision of a DLRM step at the
smallest batch (kernels a step, their GPU time against the step's wall time).

    OUT=/tmp/cuda_amp python3 benchmarks/results/cuda_amp/bench.py [--batches 512,2048,...] [--rounds 3]
"""

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch

from ctrkit.bench import train_bench
from ctrkit.bench.config import TrainBenchConfig
from ctrkit.bench.peak import machine, matmul_peaks

p = argparse.ArgumentParser()
p.add_argument("--batches", default="512,2048,8192,32768,65536")
p.add_argument("--models", default="dlrm,dcnv2,wide_deep")
p.add_argument("--precisions", default="fp32,bf16,fp16")
p.add_argument("--rounds", type=int, default=3)
p.add_argument("--steps", type=int, default=20)
p.add_argument("--deadline-s", type=float, default=300.0, help="start no round after this many seconds")
p.add_argument("--device", default="cuda")
args = p.parse_args()
out = Path(os.environ.get("OUT", "/tmp/cuda_amp"))
out.mkdir(parents=True, exist_ok=True)
device = torch.device(args.device)
start = time.perf_counter()
peaks = matmul_peaks(device)
train_bench.matmul_peaks = lambda _device: peaks  # once, not per cell
(out / "machine.json").write_text(json.dumps({"machine": machine(), "matmul_peak_gflops": peaks}, indent=1))
print("peaks", peaks, flush=True)
batches = [int(b) for b in args.batches.split(",")]
models = args.models.split(",")
precisions = args.precisions.split(",")
results: dict[tuple, list[float]] = {}
with open(out / "rounds.jsonl", "w") as f:
    for r in range(args.rounds):
        if r and time.perf_counter() - start > args.deadline_s:
            print(f"deadline: {r} rounds", flush=True)
            break
        for model in models:
            for b in batches:
                for prec in precisions:
                    cfg = TrainBenchConfig(
                        model=model,
                        batch_size=b,
                        steps=args.steps,
                        repeats=3,
                        warmup=5,
                        distinct_batches=4,
                        amp=prec != "fp32",
                        amp_dtype=None if prec == "fp32" else prec,
                    )
                    res = train_bench.run_train_bench(cfg, device)
                    row = {
                        "round": r,
                        "model": model,
                        "batch": b,
                        "precision": prec,
                        "samples_per_s": res["samples_per_s"],
                        "ms_per_step": res["ms_per_step"],
                        "fraction_of_peak": res["fraction_of_peak"],
                        "amp_dtype": res["amp_dtype"],
                    }
                    f.write(json.dumps(row) + "\n")
                    f.flush()
                    results.setdefault((model, b, prec), []).append(res["samples_per_s"])
        print(f"round {r} done at {time.perf_counter() - start:.0f} s", flush=True)

lines = ["model batch " + " ".join(precisions) + "  (median samples/s; ratios to fp32 per round: min-max)"]
for model in models:
    for b in batches:
        med = {p_: statistics.median(results[(model, b, p_)]) for p_ in precisions if (model, b, p_) in results}
        ratios = []
        for p_ in precisions[1:]:
            rs = [a / c for a, c in zip(results.get((model, b, p_), []), results.get((model, b, "fp32"), []))]
            ratios.append(f"{p_} {min(rs):.2f}-{max(rs):.2f}x" if rs else "")
        rates = " ".join(f"{med.get(p_, 0):,.0f}" for p_ in precisions)
        lines.append(f"{model} {b} {rates}  " + " ".join(ratios))
text = "\n".join(lines)
print(text, flush=True)
(out / "summary.txt").write_text(text + "\n")

# one DLRM step profiled per precision at the smallest batch: is it bound by the GPU or by launching kernels?
if device.type == "cuda":
    from torch.profiler import ProfilerActivity, profile

    prof_lines = []
    for prec in precisions:
        cfg = TrainBenchConfig(
            model="dlrm",
            batch_size=min(batches),
            steps=10,
            repeats=1,
            warmup=5,
            distinct_batches=4,
            amp=prec != "fp32",
            amp_dtype=None if prec == "fp32" else prec,
        )
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            res = train_bench.run_train_bench(cfg, device)  # 5 warm-up and 10 timed steps (and the setup's copies)
        wall = res["ms_per_step"]
        kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        gpu_ms = sum(e.device_time for e in kernels) / 1000 / 15
        prof_lines.append(
            f"dlrm batch {min(batches)} {prec}: {len(kernels) / 15:.0f} kernels a step, "
            f"{gpu_ms:.2f} ms of GPU time a step, {wall:.2f} ms wall a step (timed, profiled; "
            "kernels and GPU time over all 15 steps, the setup's copies to the GPU included)"
        )
        (out / f"profile_dlrm_{prec}.txt").write_text(
            prof.key_averages().table(sort_by="cuda_time_total", row_limit=30)
        )
    print("\n".join(prof_lines), flush=True)
    (out / "profile.txt").write_text("\n".join(prof_lines) + "\n")
print(f"total {time.perf_counter() - start:.0f} s")
