"""Shared fixtures: small synthetic datasets and a way to run the real CLI."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from hypothesis import settings

from ctrkit.bench.raw_rows_bench import server_ready
from ctrkit.cli import main
from ctrkit.data.synthetic import generate_dataset

# hypothesis' profiles: the suite's (make test), and a longer one for a nightly run (HYPOTHESIS_PROFILE=nightly); a
# test that states its own number of examples keeps it
settings.register_profile("default", max_examples=50, derandomize=True, database=None)
settings.register_profile("nightly", max_examples=1000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

# pytest-xdist runs one worker a core: each worker's torch (and the commands it starts) computes on its share of the
# cores, not on all of them beside the other workers; a test that needs threads asks for them (``two_threads``)
WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if WORKERS > 1:
    THREADS_EACH = str(max(1, (os.cpu_count() or 1) // WORKERS))
    os.environ.setdefault("OMP_NUM_THREADS", THREADS_EACH)
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

TINY_TABLES = (3, 10, 50, 120, 400, 2000, 7, 900)
SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


@pytest.fixture(autouse=True)
def _seed_everything():
    torch.manual_seed(0)


@pytest.fixture(scope="session")
def tiny_dataset(tmp_path_factory) -> Path:
    """24k rows (21.6k train, 2.4k test), 8 categorical tables of 3..2000 rows, 4 numerical features."""
    out = tmp_path_factory.mktemp("data") / "tiny"
    generate_dataset(out, 24_000, TINY_TABLES, num_numerical=4, test_fraction=0.1, seed=7, progress=False)
    return out


@pytest.fixture
def two_threads():
    """torch's intra-op threads set to 2 inside the test (the workers of a split step or split scoring)."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def small_model_flags() -> list[str]:
    return ["--embedding-dim", "8", "--bottom-mlp", "32,8", "--top-mlp", "32,1"]


def run_cli(*args: str, capsys=None) -> tuple[int, str, str]:
    """Runs ``ctrkit`` in this process; returns (exit code, stdout, stderr) (argparse's refusals exit: their code)."""
    try:
        code = main([str(a) for a in args])
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr() if capsys is not None else ("", "")
    return code, out, err


def run_process(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """Runs ``python -m ctrkit`` as a real process."""
    return subprocess.run(
        [sys.executable, "-m", "ctrkit", *[str(a) for a in args]], capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="session")
def tiny_checkpoint(tiny_dataset, tmp_path_factory) -> Path:
    """A DLRM trained 30 steps on tiny_dataset (small shape), for export and serving tests."""
    out = tmp_path_factory.mktemp("ckpt") / "dlrm.pt"
    code = main(
        ["train", "--dataset", str(tiny_dataset), "--max-steps", "30", "--batch-size", "256", "--no-progress",
         "--save-checkpoint", str(out), *small_model_flags()]
    )  # fmt: skip
    assert code == 0
    return out


def free_port() -> int:
    """A TCP port free on the loopback interface right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


ROOT = Path(__file__).resolve().parents[1]
HAS_TRITON = (ROOT / ".venv-triton" / "bin" / "python").exists()  # `make triton`


@contextmanager
def triton_server(repository: Path, *flags: str):
    """Real Triton (``scripts/tritonserver.sh``) serving ``repository`` on a free loopback port, ready; yields the
    port, and stops it on leaving."""
    port = free_port()
    proc = subprocess.Popen([str(ROOT / "scripts" / "tritonserver.sh"), str(repository), str(port), *flags],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 90
        while not server_ready(f"127.0.0.1:{port}"):
            assert proc.poll() is None, proc.stdout.read()[-3000:]
            assert time.monotonic() < deadline, "Triton did not become ready"
            time.sleep(0.5)
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=60)


class Interrupted(Exception):
    """What ``stop_after_save`` raises: a run ended as a kill would end it, just after a checkpoint."""


@contextmanager
def stop_after_save(member: int, step: int):
    """Within: ``RunStore.save`` (a trainer's checkpoint) raises ``Interrupted`` once it has written the checkpoint
    of seed-ensemble member ``member`` at step ``step`` or later."""
    from ctrkit.train.persistence import RunStore

    real_save = RunStore.save

    def save_then_stop(self):
        real_save(self)
        if self.trainer.log.member == member and self.trainer.step >= step:
            raise Interrupted

    with pytest.MonkeyPatch.context() as m:
        m.setattr(RunStore, "save", save_then_stop)
        yield


def trainer_of(model, info, data, cfg, where, outputs=None):
    """A Trainer built by hand, its settings decided as a Run's plan decides them (``run.settled``)."""
    from ctrkit.train.run import settled
    from ctrkit.train.trainer import RunOutputs, Trainer

    cfg, data = settled(cfg, info.model_name, data)
    return Trainer(model, info, data, cfg, where, outputs if outputs is not None else RunOutputs())


# `make test-fast` leaves out the tests these markers name; `make test` runs them all. A marker follows where a test
# lives (a part of the suite, a file) or what its name says it needs.
SLOW_PARTS = ("bench", "distributed", "refresh", "faults", "properties")
SLOW_FILES = (
    "test_memory_plan.py",
    "test_raw_values.py",
    "test_tiered_tables.py",
    "test_server.py",
    "test_dynamic_training.py",
    "test_native.py",
    "test_outbrain_raw_rows.py",
    "test_value_rules.py",
    "test_precision.py",
    "test_interactions.py",
    "test_embedding_store.py",
    "test_criteo_days.py",
    "test_linear_fit.py",
    "test_repository_writes.py",
    "test_predictor.py",
)  # fmt: skip (over 10 s of work each)
MARKERS = {
    "slow": "a part of the suite that starts processes, servers or whole runs (bench, distributed, refresh, faults, "
    "properties), or a file of over 10 s of work",
    "spark": "starts a local Spark session",
    "browser": "drives a headless Chromium",
    "cuda": "needs a CUDA device (skips without one)",
}


def pytest_configure(config):
    for name, what in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {what}")


def pytest_collection_modifyitems(config, items):
    for item in items:
        path = Path(str(item.fspath)).resolve()
        parts = path.relative_to(ROOT / "tests").parts if ROOT / "tests" in path.parents else ()
        name = item.name.lower()
        if parts and parts[0] in SLOW_PARTS or path.name in SLOW_FILES:
            item.add_marker("slow")
        if "spark" in path.name or "spark" in name:
            item.add_marker("spark")
        if any(word in name for word in ("browser", "headless", "search_finds", "opened_from_disk")):
            item.add_marker("browser")
        if "cuda" in path.name or "cuda" in name or "gpu" in name:
            item.add_marker("cuda")
