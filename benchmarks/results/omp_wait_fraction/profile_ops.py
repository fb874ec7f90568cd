# run as: OMP_WAIT_POLICY=PASSIVE (or GOMP_SPINCOUNT=infinite) PYTHONPATH=. .venv/bin/python benchmarks/results/omp_wait_fraction/profile_ops.py dlrm fp32 OUT.json
"""Per-op self CPU time per step of a bench-train model (profiled), written as JSON for diffing two wait policies."""
import json, sys, torch
from torch.profiler import profile, ProfilerActivity
from ctrkit.bench.config import TrainBenchConfig
from ctrkit.bench import train_bench as tb
torch.set_num_threads(int(sys.argv[4]) if len(sys.argv) > 4 else 2)
model_name, amp, out = sys.argv[1], sys.argv[2] == "bf16", sys.argv[3]
STEPS = 20
def sb(step, batches, steps, sync):
    for i in range(5): step(batches[i % len(batches)])
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for i in range(STEPS):
            step(batches[i % len(batches)])
    rows = {e.key: (e.self_cpu_time_total / STEPS / 1000, e.count / STEPS) for e in prof.key_averages()}
    json.dump(rows, open(out, "w"))
    return None
tb.step_breakdown = sb
cfg = TrainBenchConfig(model=model_name, amp=amp, steps=20, repeats=3, warmup=5, breakdown=True)
r = tb.run_train_bench(cfg, torch.device("cpu"))
print(out, round(r["samples_per_s"]), round(r["ms_per_step"], 2))
