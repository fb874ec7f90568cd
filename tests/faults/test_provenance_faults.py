"""Artifacts that are not what they claim: a checkpoint whose tensor bytes changed after writing, and a
sharded checkpoint whose rank files come from another run or were swapped. Each is refused with one line
naming the file, by every command that reads it."""

from __future__ import annotations

import shutil
import zipfile

import pytest

from tests.conftest import run_process, small_model_flags
from tests.faults.conftest import one_line_error


def flip_a_tensor_byte(path, member_suffix="/data/0"):
    """Flips one byte in the middle of a stored tensor's bytes (a zip member torch stores uncompressed)."""
    with zipfile.ZipFile(path) as z:
        info = next(i for i in z.infolist() if i.filename.endswith(member_suffix))
    with open(path, "r+b") as f:
        f.seek(info.header_offset + 26)
        name_len, extra_len = int.from_bytes(f.read(2), "little"), int.from_bytes(f.read(2), "little")
        at = info.header_offset + 30 + name_len + extra_len + info.file_size // 2
        f.seek(at)
        byte = f.read(1)[0]
        f.seek(at)
        f.write(bytes([byte ^ 0x10]))


@pytest.fixture(scope="module")
def two_runs(tiny_dataset, tiny_checkpoint, tmp_path_factory):
    """Two checkpoints of one shape (different weights), each also in the sharded form of a 2-rank run."""
    work = tmp_path_factory.mktemp("provenance")
    other = work / "other.pt"
    proc = run_process("train", "--dataset", tiny_dataset, "--max-steps", "8", "--batch-size", "256", "--seed", "7",
                       "--no-progress", "--save-checkpoint", other, *small_model_flags())  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    for src, out in ((tiny_checkpoint, work / "a" / "s.pt"), (other, work / "b" / "s.pt")):
        proc = run_process("convert-checkpoint", "--checkpoint", src, "--out", out, "--world-size", "2",
                           "--sharding", "table")  # fmt: skip
        assert proc.returncode == 0, proc.stderr
    return work


def rank_files(manifest):
    return sorted((manifest.parent / f"{manifest.name}.shards").glob("*.pt"))


def test_a_flipped_byte_in_a_checkpoint_is_refused_by_every_reader(tiny_dataset, tiny_checkpoint, tmp_path):
    ckpt = tmp_path / "m.pt"
    shutil.copy(tiny_checkpoint, ckpt)
    assert run_process("evaluate", "--checkpoint", ckpt, "--dataset", tiny_dataset).returncode == 0
    flip_a_tensor_byte(ckpt)
    for command, *args in (("evaluate", "--dataset", tiny_dataset), ("predict", "--dataset", tiny_dataset, "--out",
                           tmp_path / "p.npy"), ("export", "--format", "onnx", "--out", tmp_path / "x"),
                           ("train", "--dataset", tiny_dataset, "--max-steps", "2", "--save-checkpoint",
                            tmp_path / "n.pt", *small_model_flags()),
                           ("convert-checkpoint", "--out", tmp_path / "c2.pt", "--world-size", "2"),
                           ("convert-checkpoint", "--out", tmp_path / "c1.pt")):  # fmt: skip
        flag = "--load-checkpoint" if command == "train" else "--checkpoint"
        proc = run_process(command, flag, ckpt, *args)
        assert proc.returncode == 2, (command, proc.stderr[-2000:])
        one_line_error(proc.stderr, command, str(ckpt), "does not match the digest")
    assert not [p.name for p in tmp_path.iterdir() if p.name not in ("m.pt",)]  # nothing written from it
    from ctrkit.checkpoint import CheckpointError
    from ctrkit.serve.predictor import load_predictor

    with pytest.raises(CheckpointError, match="does not match the digest"):  # the server's memory-mapped store too
        load_predictor(ckpt, None, embedding_store="mmap")


def test_a_rank_file_from_another_run_of_the_same_shape_is_refused(tiny_dataset, two_runs, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    shutil.copytree(two_runs / "a", a)
    shutil.copytree(two_runs / "b", b)
    ours, theirs = rank_files(a / "s.pt"), rank_files(b / "s.pt")
    assert run_process("evaluate", "--checkpoint", a / "s.pt", "--dataset", tiny_dataset).returncode == 0
    shutil.copy(theirs[1], ours[1])  # the other run's rank 1, under this run's name
    proc = run_process("evaluate", "--checkpoint", a / "s.pt", "--dataset", tiny_dataset)
    assert proc.returncode == 2, proc.stderr[-2000:]
    one_line_error(proc.stderr, "evaluate", ours[1].name, "refused", "another run")


def test_swapped_rank_files_are_refused(tiny_dataset, two_runs, tmp_path):
    a = tmp_path / "a"
    shutil.copytree(two_runs / "a", a)
    r0, r1 = rank_files(a / "s.pt")
    r0.rename(tmp_path / "r0")
    r1.rename(r0)
    (tmp_path / "r0").rename(r1)
    proc = run_process("evaluate", "--checkpoint", a / "s.pt", "--dataset", tiny_dataset)
    assert proc.returncode == 2, proc.stderr[-2000:]
    one_line_error(proc.stderr, "evaluate", r0.name, "holds rank 1", "expects rank 0")


def test_a_flipped_byte_in_a_rank_file_is_refused(tiny_dataset, two_runs, tmp_path):
    a = tmp_path / "a"
    shutil.copytree(two_runs / "a", a)
    r1 = rank_files(a / "s.pt")[1]
    flip_a_tensor_byte(r1)
    for command, *args in (("evaluate", "--dataset", tiny_dataset),
                           ("convert-checkpoint", "--out", tmp_path / "c1.pt"),
                           ("convert-checkpoint", "--out", tmp_path / "c3.pt", "--world-size", "3")):  # fmt: skip
        proc = run_process(command, "--checkpoint", a / "s.pt", *args)
        assert proc.returncode == 2, proc.stderr[-2000:]
        one_line_error(proc.stderr, command, r1.name, "does not match the digest")
    assert not (tmp_path / "c1.pt").exists() and not (tmp_path / "c3.pt").exists()


def write_table(path, names, seed):
    """A CSV whose categorical column takes ``names`` (same counts whatever the names), labels from the name."""
    import numpy as np

    rng = np.random.default_rng(seed)
    idx = rng.choice(len(names), size=2_000, p=np.arange(len(names), 0, -1) / sum(range(1, len(names) + 1)))
    x = rng.normal(size=2_000)
    y = (rng.random(2_000) < 1 / (1 + np.exp(-(idx - 4) * 0.8 - x))).astype(int)
    lines = ["label,x,kind"] + [f"{a},{b:.4f},{names[i]}" for a, b, i in zip(y, x, idx)]
    path.write_text("\n".join(lines) + "\n")


def test_scoring_or_continuing_on_another_vocabulary_is_refused(tmp_path):
    """Two tables preprocessed separately: the same column names and cardinalities, other values. The
    checkpoint of one is refused on the other by evaluate, predict and a continued train, and the override
    flag scores it anyway."""
    for name, prefix in (("a", "red"), ("b", "blue")):
        write_table(tmp_path / f"{name}.csv", [f"{prefix}{i}" for i in range(9)], seed=0)
        proc = run_process("preprocess", "table", tmp_path / f"{name}.csv", "--out", tmp_path / name, "--label",
                           "label", "--no-progress")  # fmt: skip
        assert proc.returncode == 0, proc.stderr
    ckpt = tmp_path / "m.pt"
    proc = run_process("train", "--dataset", tmp_path / "a", "--save-checkpoint", ckpt, "--max-steps", "3",
                       "--no-progress", *small_model_flags())  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert run_process("evaluate", "--checkpoint", ckpt, "--dataset", tmp_path / "a").returncode == 0
    other = tmp_path / "b"
    new = ("--max-steps", "4", "--save-checkpoint", tmp_path / "n.pt", "--no-progress")
    for command, *args in (("evaluate",), ("predict", "--out", tmp_path / "p.npy"), ("train", *new)):
        flag = "--load-checkpoint" if command == "train" else "--checkpoint"
        proc = run_process(command, flag, ckpt, "--dataset", other, *args)
        assert proc.returncode == 2, (command, proc.stderr[-2000:])
        one_line_error(proc.stderr, command, str(other), "other vocabularies", "--allow-other-vocabulary")
    proc = run_process("evaluate", "--checkpoint", ckpt, "--dataset", other, "--allow-other-vocabulary")
    assert proc.returncode == 0, proc.stderr
