"""Scoring (``predict_logits``, no autograd) with DLRM's interaction by ATen's plain ops against ctrkit's C kernel,
in interleaved rounds in one process, on DATASET's test mapping with CHECKPOINT's model (measured: make demo's
data and a DLRM checkpoint that `ctrkit train` wrote on it, DLRM's defaults, one epoch). Writes ab.json here.

    OMP_WAIT_POLICY=PASSIVE python benchmarks/results/scoring/ab.py DATASET CHECKPOINT [ROUNDS] [THREADS]
"""

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from ctrkit.bench.ab import interleaved_rounds, summary  # noqa: E402
from ctrkit.bench.peak import machine  # noqa: E402
from ctrkit.checkpoint import load_checkpoint  # noqa: E402
from ctrkit.data.dataset import SplitBinaryDataset  # noqa: E402
from ctrkit.eval.evaluator import predict_logits  # noqa: E402

dataset, checkpoint = sys.argv[1], sys.argv[2]
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 10
torch.set_num_threads(int(sys.argv[4]) if len(sys.argv) > 4 else 2)
model = load_checkpoint(checkpoint).build_model()
test = SplitBinaryDataset(dataset, "test")
cpu = torch.device("cpu")
outputs = {}


def use(native: bool):
    def switch():
        model.interaction.use_native = native

    return switch


def score(_):
    outputs[model.interaction.use_native] = predict_logits(model, test, cpu)


times = interleaved_rounds(score, [None], {"aten": use(False), "kernel": use(True)}, rounds=rounds, steps=1, warmup=1)
diff = float(abs(torch.from_numpy(outputs[True]) - torch.from_numpy(outputs[False])).max())
lines = summary(times, "aten", label=f"{len(test):,} rows, ")
print("\n".join(lines))
print(f"largest logit difference {diff:.3g}")
out = Path(__file__).parent / "ab.json"
out.write_text(json.dumps({"machine": machine(), "rows": len(test), "times_ms": times, "summary": lines,
                           "max_logit_difference": diff}, indent=1, default=str))  # fmt: skip
