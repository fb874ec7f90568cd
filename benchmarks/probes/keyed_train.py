"""One-off probe (docs/decisions/keyed-id-hashing.md): end-to-end training samples/s (the whole call's wall time) on a
stream day whose first raw-id column holds crafted ids vs random ids (the same draw of positions into a pool of
20,000), interleaved rounds. Run from the repository root:
OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/probes/keyed_train.py"""

import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, ".")
from ctrkit.data.synthetic_stream import write_stream
from ctrkit.train.run import train
from tests.models.test_dynamic import crafted_ids

work = Path(tempfile.mkdtemp())
shutil.rmtree(work, ignore_errors=True)
day = write_stream(work / "s", 1, 200_000, (30_000, 800, 50), capacity=1.0, seed=3, progress=False, num_numerical=3)[0]
rng = np.random.default_rng(0)
pools = {"crafted": crafted_ids(), "random": rng.integers(-(2**62), 2**62, 20_000)}
for name, pool in pools.items():
    d = work / name
    shutil.copytree(day, d)
    for split in ("train", "validation", "test"):
        f = d / split / "cat_0.bin"
        n = f.stat().st_size // 8
        pool[np.random.default_rng(1).integers(0, len(pool), n)].astype(np.int64).tofile(f)
res = {}
for _ in range(3):
    for name in pools:
        t = time.perf_counter()
        out = train(
            work / name,
            "dlrm",
            max_steps=60,
            batch_size=2048,
            epochs=1,
            progress=False,
            embedding_dim=16,
            bottom_mlp=(64, 16),
            top_mlp=(64, 1),
            linear_warm_start=False,
            small_batch=0,
        )
        res.setdefault(name, []).append(60 * 2048 / (time.perf_counter() - t))
med = {k: sorted(v)[1] for k, v in res.items()}
print(
    json.dumps(
        {"samples_per_s_median": med, "crafted/random time": med["random"] / med["crafted"], "rounds": res}, indent=1
    )
)
