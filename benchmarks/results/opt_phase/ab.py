"""In-process A/B of the split step's optimizer phase (2026-11-26): "before" (each worker's optimizers in index
order, the whole batch's ids sorted by the first row optimizer), "first" (the optimizers that hand rows over run
first on their worker, costliest first) and "merged" (that, and each slice's worker sorts its own ids after its
backward, the optimizers' phase merging the sorts). argv: model rounds steps [amp]. Interleaved rounds, the order
rotating; medians of ms per whole step (bench_setup: batch 2048, the model's default optimizers, 2 threads) and of
the per-round ratios against "before".

"merged" was measured and not kept (dlrm*.txt): its code is merged_sorts.patch here (`git apply` it onto d28ab08 or
later to run it again); without it the script runs "before" and "first"."""

import sys

import torch

import ctrkit.bench.train_bench as T
from ctrkit.bench.ab import interleaved_rounds, summary
from ctrkit.bench.config import TrainBenchConfig
from ctrkit.bench.peak import machine
from ctrkit.train import split

name, rounds, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
amp = "amp" in sys.argv[4:]
torch.set_num_threads(2)
setup = T.bench_setup(TrainBenchConfig(model=name, amp=amp), torch.device("cpu"))
assign = split.assign
no_sorts = lambda grads: [None] * len(grads)  # noqa: E731
choices = {
    "before": (lambda costs, n, first=None: assign(costs, n), no_sorts),
    "first": (assign, no_sorts),
}
if hasattr(split, "sort_slice_ids"):
    choices["merged"] = (assign, split.sort_slice_ids)
variants = {
    k: (lambda c=c: (setattr(split, "assign", c[0]), setattr(split, "sort_slice_ids", c[1])))
    for k, c in choices.items()
}
times = interleaved_rounds(setup.step, setup.batches, variants, rounds, steps)
print("\n".join(summary(times, "before", f"{name} {'bf16' if amp else 'fp32'} ")))
print("machine", machine())
