"""Times NumericalBuckets.fit (three fits) on a dataset's normaliser sample as `ctrkit train` draws it, and saves the
cuts to compare trees. Run once per tree, e.g. the code before from a worktree:

    PYTHONPATH=OLD_TREE python benchmarks/results/buckets_fit/fit.py old build/demo/data
    python benchmarks/results/buckets_fit/fit.py new build/demo/data
    python -c "import torch; print(torch.equal(torch.load('cuts_old.pt'), torch.load('cuts_new.pt')))"
"""

import sys
import time

import torch

from ctrkit.data.dataset import SplitBinaryDataset
from ctrkit.models import create_model
from ctrkit.models.inputs import normalizer_sample
from ctrkit.models.registry import make_config

name, data = sys.argv[1], sys.argv[2]
torch.set_num_threads(2)
ds = SplitBinaryDataset(data, "train")
sample, labels = normalizer_sample(ds, labels=True)
m = create_model("dlrm", make_config("dlrm", {"num_numerical": sample.shape[1], "cardinalities": ds.spec.cardinalities}))
norm, buckets = m.numerical_norm, m.wide_buckets
norm.fit(sample)
seen = norm(sample).cpu()
rarer = int(min(labels.sum(), len(labels) - labels.sum()))
times = []
for _ in range(3):
    t0 = time.perf_counter()
    out = buckets.fit(sample, rarer_label_rows=rarer, labels=labels, seen=seen)
    times.append(time.perf_counter() - t0)
print(name, "fit seconds", [round(t, 2) for t in times], out)
torch.save(buckets.cuts.clone(), f"cuts_{name}.pt")
