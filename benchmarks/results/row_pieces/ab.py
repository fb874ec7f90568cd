"""In-process A/B of the split step's optimizers: "meetings" (the optimizers dealt to the workers, then the tables'
rows parted over all in a meeting of their own: TrainStep._split_step of commit fb10cf8, from the file given,
`git show fb10cf8:ctrkit/train/trainer.py > OLD`) against "pieces" (one meeting: the rows in pieces that free workers
take as the optimizers hand them over). argv: OLD model rounds steps [amp]. Interleaved rounds, medians."""

import importlib.util
import sys

import torch

import ctrkit.bench.train_bench as T
from ctrkit.bench.ab import interleaved_rounds, summary
from ctrkit.bench.config import TrainBenchConfig
from ctrkit.bench.peak import machine

old_path, name, rounds, steps = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
amp = "amp" in sys.argv
spec = importlib.util.spec_from_file_location("trainer_old", old_path)
old_module = importlib.util.module_from_spec(spec)
sys.modules["trainer_old"] = old_module  # dataclasses look their module up
spec.loader.exec_module(old_module)
torch.set_num_threads(2)
setup = T.bench_setup(TrainBenchConfig(model=name, amp=amp), torch.device("cpu"))
step = setup.step
split_steps = {"meetings": old_module.TrainStep._split_step, "pieces": type(step)._split_step}
variants = {k: (lambda fn=fn: setattr(step, "_split_step", fn.__get__(step))) for k, fn in split_steps.items()}
times = interleaved_rounds(step, setup.batches, variants, rounds, steps, warmup=3)
print("\n".join(summary(times, "meetings", f"{name} {'bf16' if amp else 'fp32'} ")))
print("machine", machine())
