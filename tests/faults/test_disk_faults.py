"""Every writer on a full disk and on a read-only one: a real tmpfs mounted for the test (root only; the
tests skip elsewhere). Each must exit 2 with one line naming what it was writing, and leave the previous
artifact byte-identical and no temporary behind."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from tests.conftest import run_process, small_model_flags
from tests.faults.conftest import digest, hidden_temporaries, one_line_error
from tests.faults.test_data_faults import csv_dataset

SIZE = 24 << 20


def mount(where, *options):
    return subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join(("size=" + str(SIZE), *options)), "tmpfs", where],
                          capture_output=True, text=True)  # fmt: skip


@pytest.fixture(scope="module")
def work(tiny_dataset, tiny_checkpoint, tmp_path_factory):
    """The inputs, and a previous artifact of every writer (what a failed write must leave as it is)."""
    work = tmp_path_factory.mktemp("disk")
    csv = work / "table.csv"
    csv.write_text("label,x,kind\n" + "".join(f"{i % 2},{i * 0.5},k{i % 7}\n" for i in range(400)))
    old = work / "old"
    old.mkdir()
    assert run_process("preprocess", "table", csv, "--out", old / "table", "--label", "label",
                       "--no-progress").returncode == 0  # fmt: skip
    csv_dataset(work / "nvidia", [float(i) for i in range(300)])
    assert run_process("transcode", "--input", work / "nvidia", "--output", old / "bin").returncode == 0
    shutil.copy(tiny_checkpoint, old / "m.pt")
    assert (
        run_process("export", "--checkpoint", tiny_checkpoint, "--format", "onnx", "--out", old / "x").returncode == 0
    )
    assert run_process("predict", "--checkpoint", tiny_checkpoint, "--dataset", tiny_dataset, "--out",
                       old / "p.npy").returncode == 0  # fmt: skip
    assert run_process("report", tiny_checkpoint, "--dataset", tiny_dataset, "--out",
                       old / "r.html").returncode == 0  # fmt: skip
    return work


def writers(work, data, ckpt, disk):
    """(command, target on the disk, its arguments) for every writer."""
    return [
        (
            "preprocess",
            disk / "table",
            ["table", work / "table.csv", "--out", disk / "table", "--label", "label", "--no-progress", "--overwrite"],
        ),  # fmt: skip
        ("transcode", disk / "bin", ["--input", work / "nvidia", "--output", disk / "bin", "--overwrite"]),
        (
            "train",
            disk / "m.pt",
            [
                "--dataset",
                data,
                "--save-checkpoint",
                disk / "m.pt",
                "--max-steps",
                "3",
                "--no-progress",
                *small_model_flags(),
            ],
        ),  # fmt: skip
        ("export", disk / "x", ["--checkpoint", ckpt, "--format", "onnx", "--out", disk / "x", "--overwrite"]),
        ("predict", disk / "p.npy", ["--checkpoint", ckpt, "--dataset", data, "--out", disk / "p.npy"]),
        ("report", disk / "r.html", [ckpt, "--dataset", data, "--out", disk / "r.html"]),
    ]


@pytest.fixture
def disk(work, tmp_path):
    """A tmpfs holding the previous artifacts, unmounted afterwards."""
    where = tmp_path / "disk"
    where.mkdir()
    done = mount(where)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip()}): needs root")
    for p in (work / "old").iterdir():
        (shutil.copytree if p.is_dir() else shutil.copy)(p, where / p.name)
    yield where
    subprocess.run(["umount", "-l", where], check=False)


def fill(where):
    """Fills the file system at ``where`` to its last byte."""
    with open(where / "filler", "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * (1 << 20))
                f.flush()
        except OSError:
            pass
        try:
            while True:
                f.write(b"\0" * 4096)
                f.flush()
        except OSError:
            pass


def check_refusals(work, tiny_dataset, tiny_checkpoint, disk, needles):
    before = {target: digest(target) for _, target, _ in writers(work, tiny_dataset, tiny_checkpoint, disk)}
    for command, target, args in writers(work, tiny_dataset, tiny_checkpoint, disk):
        proc = run_process(command, *args)
        assert proc.returncode == 2, (command, proc.stderr[-3000:])
        line = one_line_error(proc.stderr, command, str(target))
        assert any(n in line for n in needles), line
        assert digest(target) == before[target], command
        assert hidden_temporaries(disk) == [] and hidden_temporaries(target.parent) == []


def test_writers_on_a_full_disk(work, tiny_dataset, tiny_checkpoint, disk):
    fill(disk)
    check_refusals(work, tiny_dataset, tiny_checkpoint, disk, ("no space left on device", "not enough space"))


def test_writers_on_a_read_only_disk(work, tiny_dataset, tiny_checkpoint, disk):
    subprocess.run(["mount", "-o", "remount,ro", disk], check=True)
    check_refusals(work, tiny_dataset, tiny_checkpoint, disk, ("read-only file system",))


def test_a_checkpoint_larger_than_the_free_space_is_refused_before_writing(tiny_dataset, disk):
    """The estimate (its tensors' bytes) against the free space: refused before a byte is written."""
    st = os.statvfs(disk)
    (disk / "filler").write_bytes(b"\0" * (st.f_bavail * st.f_frsize - (200 << 10)))  # 200 KiB left: less than it
    proc = run_process("train", "--dataset", tiny_dataset, "--save-checkpoint", disk / "new.pt", "--max-steps",
                       "2", "--no-progress", "--embedding-dim", "16")  # fmt: skip
    assert proc.returncode == 2
    one_line_error(proc.stderr, "train", str(disk / "new.pt"), "not enough space", "it needs about")
    assert not (disk / "new.pt").exists()
