"""The plan's memory check: its estimate against the peak a real run reaches, and what it does inside a memory
cgroup too small for the default (a real v1 or v2 cgroup made and removed here; root only, skipped elsewhere):
it picks row-wise Adagrad for the tables when the optimizer was left to the default, and refuses within
seconds, in one line naming the options, when the user asked for what cannot fit. Never killed."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
import yaml

from ctrkit.bench.cgroup import MemoryCgroup
from ctrkit.checkpoint import load_checkpoint
from ctrkit.data.synthetic import generate_dataset
from tests.faults.conftest import one_line_error

MEASURE = """
import resource, subprocess, sys
code = subprocess.run(sys.argv[1:]).returncode
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)
sys.exit(code)
"""


@pytest.fixture(scope="module")
def wide_tables(tmp_path_factory):
    """Two tables of a million rows beside a small one: at width 32, 256 MiB of tables (more than the process)."""
    out = tmp_path_factory.mktemp("memory") / "data"
    generate_dataset(out, 20_000, (1_000_000, 1_000_000, 50), num_numerical=4, test_fraction=0.1, seed=0,
                     progress=False)  # fmt: skip
    return out


def train_args(data, ckpt, *extra):
    return [sys.executable, "-m", "ctrkit", "train", "--dataset", str(data), "--save-checkpoint", str(ckpt),
            "--max-steps", "6", "--batch-size", "512", "--embedding-dim", "32", "--bottom-mlp", "32,32",
            "--top-mlp", "32,1", "--no-progress", *map(str, extra)]  # fmt: skip


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_the_estimate_is_within_15_percent_of_the_measured_peak(wide_tables, tmp_path, optimizer):
    ckpt = tmp_path / "m.pt"
    cmd = [sys.executable, "-c", MEASURE, *train_args(wide_tables, ckpt, "--embedding-optimizer", optimizer)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    measured = int(done.stdout.strip().splitlines()[-1])
    plan = yaml.safe_load(ckpt.with_suffix(".yaml").read_text())["plan"]
    estimate = plan["memory_bytes"]["peak"]
    assert abs(estimate - measured) <= 0.15 * measured, (estimate / 2**20, measured / 2**20)


@pytest.fixture
def cgroup_of():
    made = []

    def make(limit: int) -> MemoryCgroup:
        try:
            made.append(MemoryCgroup(limit, prefix="ctrkit-test", timeout=300))
        except OSError as e:
            pytest.skip(f"cannot make a memory cgroup here ({e}): needs root")
        return made[-1]

    yield make
    for c in made:
        c.close()


def test_in_a_small_cgroup_the_default_picks_row_wise_adagrad_and_an_explicit_adam_is_refused(
    wide_tables, tmp_path, cgroup_of
):
    # room for the run with row-wise Adagrad (one number a row), not with Adam's two numbers a value
    plan = subprocess.run([sys.executable, "-c", PLAN, str(wide_tables)], capture_output=True, text=True)
    assert plan.returncode == 0, plan.stderr
    sizes = json.loads(plan.stdout)
    limit = (sizes["rowwise"] + sizes["adam"]) // 2
    group = cgroup_of(limit)

    done = group.run(train_args(wide_tables, tmp_path / "a.pt", "--best-weights", "memory"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "rowwise_adagrad" in done.stderr and "memory: adam's state would need" in done.stderr
    ckpt = load_checkpoint(tmp_path / "a.pt")
    assert ckpt.train_config["embedding_optimizer"] == "rowwise_adagrad"  # what the run used

    refused = group.run(
        train_args(
            wide_tables,
            tmp_path / "b.pt",
            "--embedding-optimizer",
            "adam",
            "--best-weights",
            "memory",
            "--embedding-storage",
            "memory",
        )
    )
    assert refused.returncode == 2, refused.stderr[-3000:]  # refused in words, not killed by the cgroup
    one_line_error(refused.stderr, "train", "needs a peak of about", "--embedding-optimizer rowwise_adagrad",
                   "memory cgroup")  # fmt: skip
    assert not (tmp_path / "b.pt").exists()


PLAN = """
import json, sys
from ctrkit.train.run import Run, resolve_run
out = {}
for name, opt in (("adam", "adam"), ("rowwise", "rowwise_adagrad")):
    spec = resolve_run(sys.argv[1], "dlrm", train={"embedding_optimizer": opt, "max_steps": 6, "batch_size": 512,
                                                   "best_weights": "memory"},
                       model_config={"embedding_dim": 32, "bottom_mlp": (32, 32), "top_mlp": (32, 1)}, progress=False)
    out[name] = Run(spec, dry_run=True).plan.memory["peak"]
print(json.dumps(out))
"""


def test_best_weights_on_disk_train_as_in_memory(wide_tables, tmp_path):
    """The best weights' tables kept on disk (each 128 MiB table in a file-backed mapping, unlinked at once): the
    same checkpoint, bit for bit, as with them in memory, and nothing left beside it."""
    out = {}
    for where in ("memory", "disk"):
        d = tmp_path / where
        d.mkdir()
        done = subprocess.run(train_args(wide_tables, d / "m.pt", "--best-weights", where, "--embedding-optimizer",
                                         "sgd"), capture_output=True, text=True)  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        assert ("their tables on disk" in done.stderr) == (where == "disk")
        out[where] = load_checkpoint(d / "m.pt")
        assert sorted(p.name for p in d.iterdir()) == ["m.pt", "m.yaml"]
    a, b = out["memory"], out["disk"]
    assert a.selection == b.selection and a.model.keys() == b.model.keys()
    assert all(torch.equal(a.model[k], b.model[k]) for k in a.model)


def test_the_plan_keeps_the_best_tables_on_disk_where_memory_cannot_hold_them(wide_tables, tmp_path, cgroup_of):
    plan = subprocess.run([sys.executable, "-c", PLAN_BEST, str(wide_tables)], capture_output=True, text=True)
    assert plan.returncode == 0, plan.stderr
    sizes = json.loads(plan.stdout)
    group = cgroup_of((sizes["memory"] + sizes["disk"]) // 2)
    done = group.run(train_args(wide_tables, tmp_path / "m.pt", "--embedding-optimizer", "sgd"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "their tables on disk: memory: a second copy of the tables would not fit" in done.stderr
    assert load_checkpoint(tmp_path / "m.pt").train_config["best_weights"] == "disk"


PLAN_BEST = """
import json, sys
from ctrkit.train.run import Run, resolve_run
out = {}
for where in ("memory", "disk"):
    spec = resolve_run(sys.argv[1], "dlrm", train={"embedding_optimizer": "sgd", "max_steps": 6, "batch_size": 512,
                       "best_weights": where}, model_config={"embedding_dim": 32, "bottom_mlp": (32, 32),
                       "top_mlp": (32, 1)}, progress=False)
    out[where] = Run(spec, dry_run=True).plan.memory["peak"]
print(json.dumps(out))
"""


def test_where_the_tables_do_not_fit_the_default_keeps_them_on_disk_and_an_explicit_memory_is_refused(
    wide_tables, tmp_path, cgroup_of
):
    # room for the run with its tables on disk (a cache of 100,000 rows), not for them in memory even with
    # row-wise Adagrad's one number a row
    plan = subprocess.run([sys.executable, "-c", PLAN_DISK, str(wide_tables)], capture_output=True, text=True)
    assert plan.returncode == 0, plan.stderr
    sizes = json.loads(plan.stdout)
    group = cgroup_of((sizes["memory"] + sizes["disk"]) // 2)

    done = group.run(train_args(wide_tables, tmp_path / "a.pt"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "tables       on disk" in done.stderr and "memory: the tables would need a peak of" in done.stderr
    ckpt = load_checkpoint(tmp_path / "a.pt")
    assert ckpt.train_config["embedding_storage"] == "disk"
    assert ckpt.model["embeddings.onehot.weight"].shape == (2_000_050, 32)
    evaluated = group.run([sys.executable, "-m", "ctrkit", "evaluate", "--checkpoint", str(tmp_path / "a.pt"),
                           "--dataset", str(wide_tables), "--mapping", "test"])  # fmt: skip
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]

    refused = group.run(train_args(wide_tables, tmp_path / "b.pt", "--embedding-storage", "memory"))
    assert refused.returncode == 2, refused.stderr[-3000:]
    one_line_error(refused.stderr, "train", "needs a peak of about", "--embedding-storage disk (fits)")
    assert not (tmp_path / "b.pt").exists()


PLAN_DISK = """
import json, sys
from ctrkit.train.run import Run, resolve_run
out = {}
for name, storage in (("memory", {"embedding_storage": "memory", "embedding_optimizer": "rowwise_adagrad"}),
                      ("disk", {"embedding_storage": "disk", "embedding_cache_rows": 100_000})):
    spec = resolve_run(sys.argv[1], "dlrm", train={"max_steps": 6, "batch_size": 512, **storage},
                       model_config={"embedding_dim": 32, "bottom_mlp": (32, 32), "top_mlp": (32, 1)}, progress=False)
    out[name] = Run(spec, dry_run=True).plan.memory["peak"]
print(json.dumps(out))
"""
