"""Serving with the tables left on disk: the same predictions, bounded memory."""

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from ctrkit.checkpoint import Checkpoint, save_checkpoint
from ctrkit.models.registry import config_to_dict, create_model, make_config
from ctrkit.serve.predictor import Predictor


def inputs(meta, n, seed):
    rng = np.random.default_rng(seed)
    numerical = rng.normal(size=(n, meta["num_numerical"])).astype(np.float32)
    cats = np.stack([np.minimum(rng.zipf(1.3, n) - 1, c + 3) for c in meta["cardinalities"]], 1)  # some unseen
    return numerical, cats.astype(np.int64)


@pytest.mark.parametrize("cache_rows", [0, 7, 100_000, 2**62])  # 2**62: --cache-rows' top, capped at the rows
def test_mmap_store_predicts_like_the_in_memory_model(tiny_checkpoint, cache_rows):
    memory = Predictor.from_checkpoint(tiny_checkpoint)
    mmap = Predictor.from_checkpoint(tiny_checkpoint, "mmap", cache_rows)
    for seed in range(3):  # repeated traffic: the cache fills, collides (7 slots) and is reused
        numerical, categorical = inputs(memory.meta, 700, seed)
        np.testing.assert_array_equal(mmap(numerical, categorical), memory(numerical, categorical))
    store = mmap.stores[0]
    assert store.hits + store.misses == 3 * 700 * len(memory.meta["cardinalities"])
    assert (store.hits > 0) == (cache_rows > 0)
    rows = len(store.table)
    assert store.cache_rows == min(cache_rows, rows)
    assert store.cache.nbytes == min(cache_rows, rows) * store.dim * 4  # the only table memory the store owns


def test_mmap_store_compiles_around_its_lookups(tiny_checkpoint, recwarn):
    """--compile with the mmap store: the lookups (numpy, file reads) stay eager, the rest compiles."""
    memory = Predictor.from_checkpoint(tiny_checkpoint)
    compiled = Predictor.from_checkpoint(tiny_checkpoint, "mmap", 50, compile=True)
    for n in (300, 5):  # two batch sizes: compiled for dynamic shapes
        numerical, categorical = inputs(memory.meta, n, n)
        np.testing.assert_allclose(compiled(numerical, categorical), memory(numerical, categorical), atol=1e-6)
    assert not [w for w in recwarn if "torch.compile failed" in str(w.message)]  # no fallback to eager
    assert compiled.stores[0].misses > 0  # the memory-mapped store answered the lookups


# anonymous memory (what the process allocated; file pages of a memory-mapped table are the kernel's
# reclaimable page cache) of a process serving a checkpoint, after scoring a batch
SERVE_ONCE = """
import json, sys
import numpy as np
from ctrkit.serve.predictor import Predictor
p = Predictor.from_checkpoint(sys.argv[1], sys.argv[2], 10_000)
rng = np.random.default_rng(0)
out = p(rng.normal(size=(256, 1)).astype(np.float32), rng.integers(0, 1000, (256, 2)))
anon = [int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("RssAnon")][0]
print(json.dumps({"anon_mb": anon / 1024, "mean": float(out.mean())}))
"""


def test_mmap_store_does_not_load_the_tables(tmp_path):
    """A 256 MiB table: served from memory it is resident; served from the mmap store it is not."""
    torch.manual_seed(0)
    cfg = make_config("dlrm", dict(num_numerical=1, cardinalities=[2_000_000, 1000], embedding_dim=32,
                                   bottom_mlp=(8, 32), top_mlp=(8, 1)))  # fmt: skip
    state = create_model("dlrm", cfg).state_dict()
    save_checkpoint(tmp_path / "big.pt", Checkpoint("dlrm", config_to_dict(cfg), {}, state))
    runs = {}
    for store in ("memory", "mmap"):
        done = subprocess.run([sys.executable, "-c", SERVE_ONCE, str(tmp_path / "big.pt"), store], capture_output=True,
                              text=True, check=True)  # fmt: skip
        runs[store] = json.loads(done.stdout)
    assert runs["mmap"]["mean"] == pytest.approx(runs["memory"]["mean"], abs=1e-6)
    # the table is 244 MiB: served from memory it is in the process (177 MiB more here), from mmap it is not
    assert runs["memory"]["anon_mb"] - runs["mmap"]["anon_mb"] > 120, runs
