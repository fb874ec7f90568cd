"""A/B: the dense optimizer's step (fused Adam / Adagrad foreach) at 1 thread vs the run's 2, DLRM bench."""
import sys, torch
from ctrkit.bench.config import TrainBenchConfig
from ctrkit.bench import train_bench as tb
mode, model, prec = sys.argv[1], sys.argv[2], sys.argv[3]
torch.set_num_threads(2)
if mode == "one":
    for cls in (torch.optim.Adam, torch.optim.Adagrad):
        orig = cls.step
        def step(self, closure=None, _orig=orig):
            n = torch.get_num_threads(); torch.set_num_threads(1)
            try: return _orig(self, closure)
            finally: torch.set_num_threads(n)
        cls.step = step
cfg = TrainBenchConfig(model=model, amp=prec == "bf16", steps=20, repeats=3, warmup=5)
r = tb.run_train_bench(cfg, torch.device("cpu"))
print(mode, model, prec, round(r["samples_per_s"]))
