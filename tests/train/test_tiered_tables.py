"""Tiered tables, on disk (``--embedding-storage disk``) and in host memory (``--embedding-storage host``, its cache
on the CPU here: the cache's device is a parameter): training through a row cache small enough to evict gives the
in-memory tables' weights and optimizer states bit for bit; a run stopped and resumed equals one that was not; the
checkpoint is the in-memory run's: evaluate and the memory-mapped serving store read it; nothing is left beside the
checkpoint."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from ctrkit.checkpoint import load_checkpoint
from ctrkit.data.batch import Batch
from ctrkit.data.synthetic import generate_dataset
from ctrkit.models.registry import create_model, make_config
from ctrkit.models.storage import in_host, on_disk
from ctrkit.models.tiered_tables import tiers
from ctrkit.serve.predictor import Predictor
from ctrkit.train.optim import build_optimizers
from ctrkit.train.step import TrainStep

CARDS = [1000, 50, 3000, 7]


def _train(tmp_path, cache_rows: int | None, optimizer: str, split: str, home: str = "disk"):
    cfg = make_config("dlrm", {"num_numerical": 3, "cardinalities": CARDS, "embedding_dim": 8,
                               "bottom_mlp": [16, 8], "top_mlp": [16, 1]})  # fmt: skip
    torch.manual_seed(0)
    if cache_rows is None:
        model = create_model("dlrm", cfg)
    else:
        storage = on_disk(tmp_path, cache_rows) if home == "disk" else in_host(cache_rows, "cpu")
        model = create_model("dlrm", cfg, storage)
    opts = build_optimizers(model, "adam", 1e-3, optimizer, 0.05, "adagrad", 0.05)
    step = TrainStep(model, opts, torch.device("cpu"), split=split)
    g = torch.Generator().manual_seed(1)
    for _ in range(25):
        ids = torch.stack([(c * torch.rand(64, generator=g).pow(3)).long() for c in CARDS], 1)  # power-law ids
        step(Batch(torch.randn(64, 3, generator=g), ids, (torch.rand(64, generator=g) < 0.3).float()))
    with torch.no_grad():  # scoring reads the file with the cached rows laid over it
        scored = model.embeddings(torch.tensor([[0, 1, 2, 3], [999, 49, 2999, 6]]))
    return model.state_dict(), [o.state_dict() for o in opts], tiers(model), scored


@pytest.mark.parametrize(
    ("optimizer", "split", "home"),
    [("rowwise_adagrad", "on", "disk"), ("adam", "off", "disk"), ("sgd", "on", "disk"), ("adam", "on", "host")],
)
def test_a_small_cache_trains_as_the_tables_in_memory(tmp_path, optimizer, split, home, two_threads):
    weights, states, _, scored = _train(tmp_path, None, optimizer, split)
    weights_d, states_d, (tier,), scored_d = _train(tmp_path, 300, optimizer, split, home)
    assert tier.home == home and tier.table.device.type == "cpu" and tier.cache.device == tier.device
    assert tier.evicted > 0 and tier.hits > 0  # rows were written back and read in again
    assert weights.keys() == weights_d.keys()
    assert weights_d["embeddings.onehot.weight"].shape == (sum(CARDS), 8)  # the whole table, not the cache
    for k in weights:
        assert torch.equal(weights[k], weights_d[k]), k
    for a, b in zip(states, states_d):
        for i, entry in a["state"].items():
            for k, v in entry.items():
                assert torch.equal(torch.as_tensor(v), torch.as_tensor(b["state"][i][k])), (i, k)
    assert torch.equal(scored, scored_d)
    assert list(tmp_path.iterdir()) == []  # the files were unlinked as soon as they were mapped


def _args(data, ckpt, *extra):
    return [sys.executable, "-m", "ctrkit", "train", "--dataset", str(data), "--model", "dlrm", "--epochs", "1",
            "--batch-size", "512", "--embedding-dim", "16", "--save-checkpoint", str(ckpt), "--no-progress",
            *map(str, extra)]  # fmt: skip


TABLES = (20_000, 5_000, 300, 20_000, 7)


def _scores(ckpt, data) -> dict:
    """``ctrkit evaluate``'s test metrics of ``ckpt``."""
    done = subprocess.run([sys.executable, "-m", "ctrkit", "evaluate", "--checkpoint", ckpt, "--dataset", data,
                           "--mapping", "test", "--json"], capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return {k: v for k, v in json.loads(done.stdout).items() if k in ("auc", "logloss", "samples")}


@pytest.fixture(scope="module")
def in_memory(tmp_path_factory):
    """The data, and the run with its tables in memory that each tier's runs must equal (its checkpoint)."""
    root = tmp_path_factory.mktemp("tiers")
    data = root / "data"
    generate_dataset(data, 12_000, TABLES, num_numerical=4, test_fraction=0.1, seed=0, progress=False)
    (root / "memory").mkdir()
    ckpt = root / "memory" / "m.pt"
    done = subprocess.run(_args(data, ckpt, "--embedding-storage", "memory"), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    return data, ckpt


@pytest.mark.parametrize("home", ["disk", "host"])
def test_a_run_with_tiered_tables_saves_resumes_and_evaluates_as_one_in_memory(tmp_path, home, in_memory):
    data, memory = in_memory
    tiered = ("--embedding-storage", home, "--embedding-cache-rows", "3000")
    for name in ("whole", "resumed"):
        (tmp_path / name).mkdir()
        ckpt, extra = tmp_path / name / "m.pt", tiered
        if name == "resumed":  # stopped at the second evaluation (step 10 of 19), then resumed to the end
            done = subprocess.run(_args(data, ckpt, *extra, "--max-steps", "10"), capture_output=True, text=True)
            assert done.returncode == 0, done.stderr[-2000:]
            extra = (*extra, "--load-checkpoint", ckpt)
        done = subprocess.run(_args(data, ckpt, *extra), capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-2000:]
        assert ("on disk (" if home == "disk" else "in host memory (") in done.stderr
        assert sorted(p.name for p in ckpt.parent.iterdir()) == ["m.pt", "m.yaml"]
    ref = load_checkpoint(memory)
    for name in ("whole", "resumed"):
        ckpt = load_checkpoint(tmp_path / name / "m.pt")
        assert ckpt.step == ref.step and ckpt.selection == ref.selection
        for k in ref.model:
            assert torch.equal(ref.model[k], ckpt.model[k]), (name, k)
    scores = _scores(tmp_path / "whole" / "m.pt", data)
    assert scores == _scores(memory, data) and scores["auc"] > 0.5
    # served from the memory-mapped store with a small row cache: the in-memory run's scores
    rng = np.random.default_rng(0)
    numerical = rng.normal(size=(64, 4)).astype(np.float32)
    ids = np.stack([rng.integers(0, c, 64) for c in TABLES], 1)
    want = Predictor.from_checkpoint(memory)(numerical, ids)
    served = Predictor.from_checkpoint(tmp_path / "whole" / "m.pt", "mmap", 1000)(numerical, ids)
    np.testing.assert_array_equal(served, want)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("optimizer", ["sgd", "rowwise_adagrad", "adam"])
def test_on_a_gpu_tables_in_host_memory_train_as_the_tables_on_the_gpu(optimizer):
    """The host tier's rows cross between the CPU's memory and the GPU's cache: the weights, the optimizer state and
    the scores equal the tables held on the GPU to float rounding (a GPU's sparse updates sum a row's gradients
    with atomics, in no fixed order, so two runs on the GPU alone are equal only to rounding too: on an H200, two
    such runs under Adam differed by 1.3e-6 in one of 32,456 table values after 25 steps, Adam's normalised step
    magnifying the rounding of a near-zero gradient; a row lost or stale between the tiers is off by the step, 0.05)."""
    device = torch.device("cuda")
    cfg = make_config("dlrm", {"num_numerical": 3, "cardinalities": CARDS, "embedding_dim": 8,
                               "bottom_mlp": [16, 8], "top_mlp": [16, 1]})  # fmt: skip
    results = []
    for storage in (None, in_host(300, device)):
        torch.manual_seed(0)
        model = (create_model("dlrm", cfg) if storage is None else create_model("dlrm", cfg, storage)).to(device)
        opts = build_optimizers(model, "adam", 1e-3, optimizer, 0.05, "adagrad", 0.05)
        step = TrainStep(model, opts, device)
        g = torch.Generator().manual_seed(1)
        for _ in range(25):
            ids = torch.stack([(c * torch.rand(64, generator=g).pow(3)).long() for c in CARDS], 1)
            step(Batch(torch.randn(64, 3, generator=g), ids, (torch.rand(64, generator=g) < 0.3).float()))
        with torch.no_grad():
            scored = model.embeddings(torch.tensor([[0, 1, 2, 3], [999, 49, 2999, 6]], device=device))
        results.append((model.state_dict(), [o.state_dict() for o in opts], tiers(model), scored))
    (weights, states, _, scored), (weights_h, states_h, (tier,), scored_h) = results
    assert tier.cache.device.type == "cuda" and tier.table.device.type == "cpu" and tier.evicted > 0
    close = {"rtol": 1e-5, "atol": 1e-5}
    for k in weights:
        torch.testing.assert_close(weights_h[k].cpu(), weights[k].cpu(), **close, msg=k)
    for a, b in zip(states, states_h):
        for i, entry in a["state"].items():
            for k, v in entry.items():
                torch.testing.assert_close(torch.as_tensor(b["state"][i][k]).cpu(), torch.as_tensor(v).cpu(), **close)
    torch.testing.assert_close(scored_h.cpu(), scored.cpu(), **close)
