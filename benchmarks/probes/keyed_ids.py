"""One-off probe (docs/decisions/keyed-id-hashing.md): id-map time per batch (observe + lookup) on a stream of crafted
ids vs random ids, the map before keys (commit c083877) vs now. Run from the repository root:
OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/probes/keyed_ids.py"""

import importlib.util
import json
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

sys.path.insert(0, ".")
from ctrkit.models import dynamic as new
from tests.models.test_dynamic import crafted_ids

old_file = tempfile.NamedTemporaryFile("w", suffix=".py", delete=False)
old_file.write(
    subprocess.run(
        ["git", "show", "c083877:ctrkit/models/dynamic.py"], capture_output=True, text=True, check=True
    ).stdout
)
old_file.close()
spec = importlib.util.spec_from_file_location("old_dynamic", old_file.name)
old = importlib.util.module_from_spec(spec)
spec.loader.exec_module(old)
torch.set_num_threads(1)
rng = np.random.default_rng(0)
pools = {"crafted": crafted_ids(), "random": rng.integers(-(2**62), 2**62, 20_000)}
B, STEPS, ROUNDS = 4096, 40, 5


def run(mod, pool):
    dyn = mod.DynamicIds([0], [30_000])
    r = np.random.default_rng(1)
    batches = [torch.from_numpy(pool[r.integers(0, len(pool), B)]).view(-1, 1) for _ in range(STEPS)]
    t = time.perf_counter()
    for b in batches:
        dyn.observe(b)
        dyn(b)
    return (time.perf_counter() - t) / STEPS


res = {}
for _ in range(ROUNDS):
    for mod_name, mod in (("old", old), ("new", new)):
        for pool_name, pool in pools.items():
            res.setdefault(f"{mod_name}/{pool_name}", []).append(run(mod, pool))
med = {k: sorted(v)[len(v) // 2] * 1000 for k, v in res.items()}
print(
    json.dumps(
        {
            "ms_per_batch_median": med,
            "old crafted/random": med["old/crafted"] / med["old/random"],
            "new crafted/random": med["new/crafted"] / med["new/random"],
            "new/old random": med["new/random"] / med["old/random"],
            "batch": B,
            "steps": STEPS,
            "rounds": ROUNDS,
        },
        indent=1,
    )
)
