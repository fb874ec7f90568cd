"""Summarizes ab.sh's JSON: per model and precision, samples/s of ATen's path and of the C kernels (medians of the
rounds), the ratio in each round, and the fraction of the fp32/bf16 matmul peak measured in the same runs.
Usage: python benchmarks/results/native_kernels/summarize.py [DIR] > DIR/results.txt"""

import glob
import json
import os
import statistics
import sys

root = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
first = None
for model in ("dlrm", "dcnv2", "wide_deep"):
    for tag in ("fp32", "bf16"):
        runs = {}
        for path in ("aten", "native"):
            files = sorted(
                glob.glob(f"{root}/{model}_{tag}_{path}_*.json"), key=lambda f: int(f.rsplit("_", 1)[1][:-5])
            )
            runs[path] = [json.load(open(f)) for f in files]
        n = min(len(runs["aten"]), len(runs["native"]))
        if n == 0:
            continue
        first = first or runs["native"][0]
        a = [r["samples_per_s"] for r in runs["aten"][:n]]
        b = [r["samples_per_s"] for r in runs["native"][:n]]
        # the fraction with ATen's FLOP count for both: the JSON of runs before native.suspended() counted the
        # native runs' FLOPs without the C interaction (torch's counter cannot see it)
        flops = runs["aten"][0]["flops_per_sample"]["train_step"]

        def fraction(r):
            peaks = r["matmul_peak_gflops"]
            return flops * r["samples_per_s"] / 1e9 / (peaks.get("bf16" if r["amp_dtype"] else "fp32") or peaks["fp32"])

        fa = [fraction(r) for r in runs["aten"][:n]]
        fb = [fraction(r) for r in runs["native"][:n]]
        print(
            f"{model:9s} {tag}: ATen {statistics.median(a):8,.0f}  native {statistics.median(b):8,.0f} samples/s "
            f"(medians of {n} rounds); native / ATen per round {[round(y / x, 3) for x, y in zip(a, b)]}; "
            f"fraction of peak ATen {[round(x, 3) for x in fa]} native {[round(x, 3) for x in fb]}"
        )
if first:
    m = first["machine"]
    print(
        f"machine: {m['cpu']}, {m['cores']} cores, torch capability {m['capability']}, {m['cpu_features']}, "
        f"{m['threads']} threads, OMP_WAIT_POLICY={m['omp_wait_policy']}, torch {m['torch']}"
    )
