"""A model repository written by concurrent exports keeps every version; exported files are sealed with their
digests and a damaged version is left out naming the file; names and versions stay within what Triton reads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from ctrkit.checkpoint import load_checkpoint, save_checkpoint
from ctrkit.export.exporter import export_checkpoint
from ctrkit.serve.names import MAX_VERSION
from ctrkit.serve.repository import ModelRepository

# an export of CHECKPOINT into REPO as model NAME, in its own process, that sleeps DELAY seconds after its model is
# written and before its version is placed (the slow export among quick ones); prints its summary as JSON
EXPORT = textwrap.dedent(
    """
    import json, sys, time
    import ctrkit.export.exporter as e
    checkpoint, repo, name, delay = sys.argv[1:5]
    seal = e.seal_files
    e.seal_files = lambda where: (seal(where), time.sleep(float(delay)))[0]
    print(json.dumps(e.export_checkpoint(checkpoint, repo, "triton", name=name)))
    """
)


def _start(checkpoint, repo, name="ctr", delay=0.0):
    args = [sys.executable, "-c", EXPORT, str(checkpoint), str(repo), name, str(delay)]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.fixture(scope="module")
def two_checkpoints(tiny_checkpoint, tmp_path_factory):
    """The tiny checkpoint and a copy claiming another step: their exports differ in ctrkit_model.json's step."""
    other = tmp_path_factory.mktemp("other") / "other.pt"
    ckpt = load_checkpoint(tiny_checkpoint)
    ckpt.step += 1000
    save_checkpoint(other, ckpt)
    return {load_checkpoint(tiny_checkpoint).step: tiny_checkpoint, ckpt.step: other}


def _finish(procs):
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=300)
        assert p.returncode == 0, stderr
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


def test_concurrent_exports_keep_every_version(two_checkpoints, tmp_path):
    """A slow export creating a new model, then three quick ones of two checkpoints under the same name, all at once:
    four versions, each holding the checkpoint of the export that reported it, nothing deleted."""
    steps = sorted(two_checkpoints)
    repo = tmp_path / "repo"
    slow = _start(two_checkpoints[steps[0]], repo, delay=6.0)  # sees no model, so it would create one
    quick = [_start(two_checkpoints[steps[i % 2]], repo) for i in range(3)]
    summaries = _finish([slow, *quick])
    versions = [s["version"] for s in summaries]
    assert sorted(versions) == [1, 2, 3, 4]
    assert versions[0] == 4  # the slow one finished last and added a version to the model the others made
    for summary, step in zip(summaries, [steps[0], steps[0], steps[1], steps[0]]):
        meta = json.loads((repo / "ctr" / str(summary["version"]) / "ctrkit_model.json").read_text())
        assert meta["step"] == step
    assert ModelRepository(repo).versions("ctr") == ["1", "2", "3", "4"]
    assert sorted(ModelRepository(repo).load("ctr")) == ["1", "2", "3", "4"]
    assert not [p for p in repo.iterdir() if p.name.startswith(".")]  # no staging directory left


def test_a_model_directory_made_meanwhile_is_never_removed(tiny_checkpoint, tmp_path, monkeypatch):
    """A directory of the model's name made by something else while an export runs is left as it is; the export
    says so and fails."""
    import ctrkit.export.exporter as exporter

    repo = tmp_path / "repo"
    seal = exporter.seal_files

    def meanwhile(where):
        (repo / "ctr").mkdir()
        (repo / "ctr" / "precious.txt").write_text("keep me")
        return seal(where)

    monkeypatch.setattr(exporter, "seal_files", meanwhile)
    with pytest.raises(ValueError, match="exists but holds no config.pbtxt"):
        export_checkpoint(tiny_checkpoint, repo, "triton", name="ctr")
    assert (repo / "ctr" / "precious.txt").read_text() == "keep me"
    monkeypatch.undo()
    plain = tmp_path / "plain"
    monkeypatch.setattr(exporter, "seal_files", lambda where: (plain.mkdir(), (plain / "x").write_text("x")))
    with pytest.raises(ValueError, match="plain: appeared while this was written"):
        export_checkpoint(tiny_checkpoint, plain, "onnx")
    assert (plain / "x").read_text() == "x"


def test_exported_files_are_sealed_and_a_damaged_version_is_left_out(tiny_checkpoint, tmp_path, caplog):
    """One flipped byte in version 2's model.onnx: version 2 is left out naming the file, version 1 serves; an
    added file or a missing one is named the same way; an export without digests.json loads with a warning."""
    import logging

    from ctrkit.serve.predictor import Predictor

    repo = tmp_path / "repo"
    for _ in range(3):
        export_checkpoint(tiny_checkpoint, repo, "triton", name="ctr")
    listed = json.loads((repo / "ctr" / "1" / "digests.json").read_text())["files"]
    assert sorted(listed) == ["ctrkit_model.json", "model.onnx"]
    onnx = repo / "ctr" / "2" / "model.onnx"
    raw = bytearray(onnx.read_bytes())
    raw[len(raw) // 2] ^= 0x40
    onnx.write_bytes(bytes(raw))
    (repo / "ctr" / "3" / "notes.txt").write_text("added")
    repository = ModelRepository(repo)
    assert sorted(repository.load("ctr")) == ["1"]
    assert "model.onnx: its bytes do not match digests.json" in repository.failed["ctr/2"]
    assert "notes.txt: not listed in digests.json" in repository.failed["ctr/3"]
    (repo / "ctr" / "3" / "notes.txt").unlink()
    (repo / "ctr" / "3" / "ctrkit_model.json").unlink()
    repository = ModelRepository(repo)
    assert sorted(repository.load("ctr")) == ["1"]
    assert "3/ctrkit_model.json: listed in digests.json but missing" in repository.failed["ctr/3"]
    (repo / "ctr" / "1" / "digests.json").unlink()
    with caplog.at_level(logging.WARNING, logger="ctrkit.serve"):
        Predictor.from_export(repo / "ctr", "1")
    assert "no digests.json" in caplog.text


def test_names_and_versions_stay_within_what_triton_reads(tiny_checkpoint, tmp_path):
    """A name with a double quote is refused (it would end config.pbtxt's quoted name); a version beyond int64 is
    refused, given or counted on; a config.pbtxt linked to outside the repository is neither served nor written
    through."""
    repo = tmp_path / "repo"
    with pytest.raises(ValueError, match="holds a double quote"):
        export_checkpoint(tiny_checkpoint, repo, "triton", name='x" max_batch_size: 1 #')
    with pytest.raises(ValueError, match="must be from 1 to 9223372036854775807"):
        export_checkpoint(tiny_checkpoint, repo, "triton", name="ctr", version=10**20)
    export_checkpoint(tiny_checkpoint, repo, "triton", name="ctr", version=MAX_VERSION)
    with pytest.raises(ValueError, match="leaves no next one: give --version"):
        export_checkpoint(tiny_checkpoint, repo, "triton", name="ctr")
    export_checkpoint(tiny_checkpoint, repo, "triton", name="ctr", version=1)
    (repo / "ctr" / "99999999999999999999").mkdir()  # beyond int64: not a version Triton or ctrkit serves
    assert ModelRepository(repo).versions("ctr") == ["1", str(MAX_VERSION)]

    outside = tmp_path / "outside.pbtxt"
    outside.write_text((repo / "ctr" / "config.pbtxt").read_text())
    (repo / "ctr" / "config.pbtxt").unlink()
    os.symlink(outside, repo / "ctr" / "config.pbtxt")
    with pytest.raises(ValueError, match="outside the model repository"):
        ModelRepository(repo).load("ctr")
    with pytest.raises(ValueError, match="outside the model repository"):
        export_checkpoint(tiny_checkpoint, repo, "triton", name="ctr")


def test_digests_linked_to_outside_the_repository_are_not_read(tiny_checkpoint, tmp_path):
    """A version's digests.json that is a link out of the repository is refused, naming it, before it is read (the
    other files were checked that way; the digests file was read wherever it led)."""
    repo = tmp_path / "repo"
    export_checkpoint(tiny_checkpoint, repo, "triton", name="ctr", version=1)
    ModelRepository(repo).load("ctr")  # as exported
    digests = repo / "ctr" / "1" / "digests.json"
    outside = tmp_path / "digests.json"
    outside.write_text(digests.read_text())
    digests.unlink()
    os.symlink(outside, digests)
    with pytest.raises(ValueError, match="digests.json: resolves to .* outside the model repository"):
        ModelRepository(repo).load("ctr")


def test_names_too_long_for_their_temporaries_and_directories_as_files_are_refused_in_words(tiny_checkpoint, tmp_path):
    """A model name or output file whose temporary's name would pass the file system's 255 bytes is refused naming
    it (the error named the internal temporary path before); `predict --out DIR` is refused as a directory."""
    from ctrkit.data.atomic import atomic_file

    with pytest.raises(ValueError, match="its name is 240 bytes; at most 207"):
        export_checkpoint(tiny_checkpoint, tmp_path / "repo", "triton", name="m" * 240)
    export_checkpoint(tiny_checkpoint, tmp_path / "repo", "triton", name="m" * 207)  # the longest taken
    with pytest.raises(ValueError, match="its name is 250 bytes"):
        with atomic_file(tmp_path / ("p" * 250)):
            pass
    with pytest.raises(ValueError, match="is a directory; expected the path of a file"):
        with atomic_file(tmp_path):
            pass
    assert sorted(p.name for p in tmp_path.iterdir()) == ["repo"]  # no temporary left
