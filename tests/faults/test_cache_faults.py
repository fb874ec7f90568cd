"""ctrkit's native kernel cache damaged between runs: a truncated library (a disk that filled during a copy,
a partial sync) or one that lacks a kernel. Real processes: `train` and `evaluate` must finish, say what they
found in one line, and never load the damaged file (dlopen of a truncated library dies of SIGBUS)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from ctrkit import native
from tests.conftest import small_model_flags

pytestmark = pytest.mark.skipif(native._compiler() is None, reason="no C compiler on this machine")


def ctrkit(cache, *args):
    env = {**os.environ, "XDG_CACHE_HOME": str(cache)}
    cmd = [sys.executable, "-m", "ctrkit", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)


def library(cache):
    (built,) = (cache / "ctrkit" / "native").glob("libctrkit_native_*.so")
    return built


def train(cache, data, ckpt):
    return ctrkit(cache, "train", "--dataset", data, "--save-checkpoint", ckpt, "--max-steps", "3", "--no-progress",
                  "--batch-size", "256", *small_model_flags())  # fmt: skip


@pytest.fixture(scope="module")
def built(tiny_dataset, tmp_path_factory):
    """A cache holding the built library, and the checkpoint of the run that built it."""
    work = tmp_path_factory.mktemp("native-cache")
    assert train(work / "cache", tiny_dataset, work / "a.pt").returncode == 0
    return work


@pytest.fixture
def cache(built, tmp_path):
    """A copy of the built cache for one test to damage."""
    shutil.copytree(built / "cache", tmp_path / "cache")
    shutil.copy(built / "a.pt", tmp_path / "a.pt")
    return tmp_path / "cache"


def test_a_truncated_cached_library_is_rebuilt_not_loaded(tiny_dataset, cache, tmp_path):
    built = library(cache)
    good = built.read_bytes()
    built.write_bytes(good[: len(good) // 3])  # as a disk that filled during a copy leaves it
    for args in (["evaluate", "--checkpoint", tmp_path / "a.pt", "--dataset", tiny_dataset], None):
        proc = ctrkit(cache, *args) if args else train(cache, tiny_dataset, tmp_path / "b.pt")
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert "does not match the digest recorded when it was built; rebuilding it" in proc.stderr
        assert native._check_entry(library(cache)) is None  # rebuilt whole
        built.write_bytes(good[: len(good) // 2])


def test_a_cached_library_without_its_digest_is_rebuilt(tiny_dataset, cache, tmp_path):
    native._digest_file(library(cache)).unlink()
    proc = train(cache, tiny_dataset, tmp_path / "b.pt")
    assert proc.returncode == 0 and "has no recorded digest; rebuilding it" in proc.stderr
    assert native._check_entry(library(cache)) is None


def test_a_cached_library_lacking_a_kernel_leaves_aten_with_one_line(tiny_dataset, cache, tmp_path):
    built = library(cache)
    source = tmp_path / "other.c"
    source.write_text("int ctrkit_something_else(void) { return 1; }\n")
    subprocess.run([native._compiler(), "-shared", "-fPIC", "-o", built, source], check=True)
    native._digest_file(built).write_text(native._digest(built) + "\n")  # a library its digest agrees with
    proc = train(cache, tiny_dataset, tmp_path / "b.pt")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if "native CPU kernels unavailable" in line]
    assert len(lines) == 1 and "lacks the kernel" in lines[0]
