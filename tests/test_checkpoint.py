"""The typed checkpoint: the current format round-trips, version 1 files load, other versions are refused."""

from __future__ import annotations

import pytest
import torch

from ctrkit.checkpoint import RESUME_KEYS, Checkpoint, CheckpointError, load_checkpoint, save_checkpoint
from ctrkit.models import create_model
from ctrkit.models.registry import config_to_dict, make_config


def multi_hot_config():
    return make_config(
        "dlrm",
        dict(num_numerical=2, cardinalities=[5, 7], embedding_dim=4, bottom_mlp=[8, 4], top_mlp=[8, 1],
             multi_hot_cardinalities=[6], multi_hot_combiners=["sum"]),
    )  # fmt: skip


def test_round_trip(tmp_path):
    cfg = multi_hot_config()
    model = create_model("dlrm", cfg)
    ckpt = Checkpoint("dlrm", config_to_dict(cfg), {"cardinalities": [5, 7]}, model.state_dict(), step=12,
                      resume={"steps_per_epoch": 5})  # fmt: skip
    save_checkpoint(tmp_path / "c.pt", ckpt)
    back = load_checkpoint(tmp_path / "c.pt")
    assert (back.step, back.epoch, back.batch_in_epoch) == (12, 2, 2)
    for k, v in model.state_dict().items():
        assert torch.equal(back.build_model().state_dict()[k], v)


def test_version_1_checkpoints_load(tmp_path):
    """A file as ctrkit wrote it before the typed checkpoint: an untyped dict with 'multihot_' field names."""
    cfg = multi_hot_config()
    model = create_model("dlrm", cfg)
    old_config = {k.replace("multi_hot", "multihot"): v for k, v in config_to_dict(cfg).items()}
    old_spec = {"cardinalities": [5, 7], "multihot_features": ["tags"], "multihot_cardinalities": [6]}
    torch.save(
        {"format": "ctrkit-checkpoint-v1", "model_name": "dlrm", "model_config": old_config, "spec": old_spec,
         "model": model.state_dict(), "step": 7, "epoch": 0, "batch_in_epoch": 7, "steps_per_epoch": 10},
        tmp_path / "v1.pt",
    )  # fmt: skip
    ckpt = load_checkpoint(tmp_path / "v1.pt")
    assert ckpt.model_config["multi_hot_cardinalities"] == [6] and ckpt.spec["multi_hot_features"] == ["tags"]
    assert ckpt.step == 7 and ckpt.batch_in_epoch == 7
    rebuilt = ckpt.build_model()
    for k, v in model.state_dict().items():
        assert torch.equal(rebuilt.state_dict()[k], v)


def _v2(model_state, **fields) -> dict:
    """A checkpoint file's contents as version 2 wrote them (``ensemble`` / ``member_ensemble`` said the kept
    model)."""
    cfg = config_to_dict(multi_hot_config())
    return {"format": "ctrkit-checkpoint", "version": 2, "model_name": "dlrm", "model_config": cfg,
            "spec": {"cardinalities": [5, 7]}, "model": model_state, "step": 8, **fields}  # fmt: skip


def test_version_2_checkpoints_load_with_their_kept_model_named(tmp_path):
    """Version 2 told the kept model by which of ``ensemble`` and ``member_ensemble`` was set, and kept each part of
    the resume state as a field; version 3 names the kept model in ``kept`` and groups the resume state in
    ``resume``; each loads as the same model and the same state."""
    torch.manual_seed(0)
    states = [create_model("dlrm", multi_hot_config()).state_dict() for _ in range(3)]
    snapshots = [{"epoch": i, "step": 4 * (i + 1), "score": 0.7, "model": s} for i, s in enumerate(states)]
    members = [
        {"seed": 3 + i, "best_step": 8, "steps": 8, "validation": {}, "models": [s]} for i, s in enumerate(states)
    ]
    cases = {
        "single": ({}, {"kind": "single"}, [0]),
        "snapshots": ({"snapshots": snapshots, "ensemble": [8, 4]}, {"kind": "snapshot_mean", "steps": [8, 4]}, [1, 0]),
        "members": ({"members": members, "member": 2, "member_ensemble": [0, 2]},
                    {"kind": "seed_mean", "members": [0, 2]}, [0, 2]),
        "a member in training": ({"members": members[:1], "member": 1, "member_ensemble": None}, {"kind": "single"},
                                 [0]),
    }  # fmt: skip
    x = (torch.randn(4, 2), torch.tensor([[0, 1], [4, 6], [2, 3], [1, 1]]))
    bags = torch.tensor([[0, 5], [1, 2], [3, 3], [4, 0]]).view(4, 1, 2)
    from ctrkit.data.batch import PaddedMultiHot

    def logits(model):
        with torch.no_grad():
            return model.eval()(*x, PaddedMultiHot(bags))

    one = [create_model("dlrm", multi_hot_config()) for _ in states]
    for model, state in zip(one, states):
        model.load_state_dict(state)
    resume = {"optimizers": [{"state": {}, "param_groups": []}], "steps_per_epoch": 4, "rng": {"torch": torch.ones(3)},
              "selection": {"best_step": 4}, "resume_model": states[2]}  # fmt: skip
    for name, (fields, kept, which) in cases.items():
        torch.save(_v2(states[0], **fields, **resume), tmp_path / "v2.pt")
        ckpt = load_checkpoint(tmp_path / "v2.pt")
        assert ckpt.kept == kept and ckpt.models_averaged == len(which), name
        assert ckpt.optimizers == resume["optimizers"] and ckpt.steps_per_epoch == 4 and ckpt.kept_step == 4
        assert ckpt.resume_model is states[2] or all(torch.equal(ckpt.resume_model[k], v) for k, v in states[2].items())
        assert ckpt.member == fields.get("member") and set(ckpt.resume) <= set(RESUME_KEYS)
        want = torch.stack([logits(one[i]) for i in which]).mean(0)
        torch.testing.assert_close(logits(ckpt.build_model()), want, rtol=0, atol=1e-6)
        save_checkpoint(tmp_path / "v3.pt", ckpt)  # written as version 3: the same model back
        again = load_checkpoint(tmp_path / "v3.pt")
        assert torch.load(tmp_path / "v3.pt", weights_only=True)["version"] == 3 and again.kept == kept
        assert torch.equal(logits(again.build_model()), logits(ckpt.build_model())), name
    torch.save(_v2(states[0], snapshots=snapshots, ensemble=[8, 16]), tmp_path / "bad.pt")
    with pytest.raises(CheckpointError, match=r"bad.pt: its kept model names snapshots \[8, 16\] it does not hold"):
        load_checkpoint(tmp_path / "bad.pt")
    torch.save({**_v2(states[0]), "version": 3, "kept": {"kind": "median"}}, tmp_path / "kind.pt")
    with pytest.raises(CheckpointError, match="kind.pt: its kept model is of kind 'median'"):
        load_checkpoint(tmp_path / "kind.pt")


def test_other_versions_and_incomplete_files_are_refused(tmp_path):
    torch.save({"format": "ctrkit-checkpoint", "version": 9, "model_name": "dlrm"}, tmp_path / "v9.pt")
    with pytest.raises(CheckpointError, match="v9.pt: checkpoint format version 9 is not readable"):
        load_checkpoint(tmp_path / "v9.pt")
    torch.save({"format": "ctrkit-checkpoint", "version": 2, "model_name": "dlrm"}, tmp_path / "part.pt")
    with pytest.raises(CheckpointError, match=r"part.pt: checkpoint lacks \['model', 'model_config'\]"):
        load_checkpoint(tmp_path / "part.pt")
    torch.save({"format": "something-else"}, tmp_path / "other.pt")
    with pytest.raises(CheckpointError, match="other.pt: not a ctrkit checkpoint"):
        load_checkpoint(tmp_path / "other.pt")


def test_checkpoints_from_before_the_linear_term_load_without_one(tmp_path):
    cfg = make_config("dlrm", dict(num_numerical=2, cardinalities=[5, 7], embedding_dim=4, bottom_mlp=[8, 4],
                                   top_mlp=[8, 1], linear=False))  # fmt: skip
    old = {k: v for k, v in config_to_dict(cfg).items() if k != "linear"}  # written before the field existed
    model = create_model("dlrm", cfg)
    save_checkpoint(tmp_path / "old.pt", Checkpoint("dlrm", old, {}, model.state_dict()))
    rebuilt = load_checkpoint(tmp_path / "old.pt").build_model()
    assert rebuilt.wide_embeddings is None and rebuilt.config.linear is False


@pytest.mark.parametrize("sharding", ["row", "column", "auto"])
def test_one_file_and_sharded_forms_convert_both_ways_and_serve_unassembled(tmp_path, capsys, sharding):
    """convert-checkpoint --world-size writes the sharded form (per-rank files, manifest last); back to
    one file it gives the same weights; the memory-mapped serving store reads the shards where they lie
    (no whole table assembled) and predicts what the one-file checkpoint predicts."""
    import numpy as np

    from ctrkit.checkpoint_shards import ShardedTableView
    from ctrkit.serve.predictor import Predictor
    from tests.conftest import run_cli

    cfg = make_config(
        "dcnv2",
        dict(num_numerical=2, cardinalities=[5, 7, 300], embedding_dim=6, bottom_mlp=[8, 6], top_mlp=[8, 1],
             cross_layers=1, multi_hot_cardinalities=[40], multi_hot_combiners=["mean"]),
    )  # fmt: skip
    torch.manual_seed(3)
    model = create_model("dcnv2", cfg)
    spec = {"cardinalities": [5, 7, 300], "multi_hot_cardinalities": [40]}
    save_checkpoint(tmp_path / "one.pt", Checkpoint("dcnv2", config_to_dict(cfg), spec, model.state_dict(), step=4))
    flags = ["--sharding", sharding, "--replicate-below-kb", "0.03", "--column-split-dim", "4"]
    code, out, _ = run_cli("convert-checkpoint", "--checkpoint", tmp_path / "one.pt", "--out", tmp_path / "s.pt",
                           "--world-size", "3", *flags, capsys=capsys)  # fmt: skip
    assert code == 0 and "3 rank files" in out
    raw = torch.load(tmp_path / "s.pt", weights_only=True)
    assert raw["model"] == {} and len(raw["shard_files"]) == 3 and raw["sharding"]
    code, _, _ = run_cli("convert-checkpoint", "--checkpoint", tmp_path / "s.pt", "--out", tmp_path / "back.pt",
                         capsys=capsys)  # fmt: skip
    back = torch.load(tmp_path / "back.pt", weights_only=True)["model"]
    assert set(back) == set(model.state_dict())
    assert all(torch.equal(back[k], v) for k, v in model.state_dict().items())
    # sharded -> sharded at another layout (each rank's shards read from the 3 rank files) -> one file
    for args, out in ((("--world-size", "2", "--sharding", "row"), "s2.pt"), ((), "back2.pt")):
        src = "s.pt" if out == "s2.pt" else "s2.pt"
        code, _, _ = run_cli("convert-checkpoint", "--checkpoint", tmp_path / src, "--out", tmp_path / out, *args,
                             capsys=capsys)  # fmt: skip
        assert code == 0
    back = torch.load(tmp_path / "back2.pt", weights_only=True)["model"]
    assert all(torch.equal(back[k], v) for k, v in model.state_dict().items())

    served = Predictor.from_checkpoint(tmp_path / "s.pt", embedding_store="mmap", cache_rows=16)
    assert served.stores and all(isinstance(s.table, ShardedTableView) for s in served.stores)
    reference = Predictor.from_checkpoint(tmp_path / "one.pt")
    gen = np.random.default_rng(0)
    numerical = gen.normal(size=(64, 2)).astype(np.float32)
    ids = np.stack([gen.integers(0, c, 64) for c in (5, 7, 300)], axis=1)
    bags = np.where(gen.random((64, 1, 3)) < 0.7, gen.integers(0, 40, (64, 1, 3)), -1)
    for _ in range(2):  # the second pass is served from the row cache
        np.testing.assert_allclose(served(numerical, ids, bags), reference(numerical, ids, bags), atol=1e-6)


def test_sharded_table_view_gathers_rows_from_row_and_column_pieces():
    import numpy as np

    from ctrkit.checkpoint_shards import ShardedTableView

    table = np.arange(40, dtype=np.float32).reshape(10, 4)
    pieces = [(0, 6, 0, 2, table[0:6, 0:2]), (6, 10, 0, 2, table[6:10, 0:2]), (0, 10, 2, 4, table[:, 2:4])]
    view = ShardedTableView(pieces, 10, 4)
    rows = np.array([9, 0, 5, 6, 6, 3])
    np.testing.assert_array_equal(view[rows], table[rows])
    with pytest.raises(IndexError):
        view[np.array([10])]
    # blocks (what a rank loading its shards at another layout reads): across pieces, no piece whole
    for r0, r1, c0, c1 in ((4, 8, 1, 3), (0, 10, 0, 4), (6, 7, 3, 4), (2, 2, 0, 4)):
        block = view[r0:r1, c0:c1]
        assert isinstance(block, torch.Tensor)
        np.testing.assert_array_equal(block.numpy(), table[r0:r1, c0:c1])


def _mapping_rss_kb(path) -> int:
    """Resident KB of this process's mappings of ``path`` (from /proc/self/smaps)."""
    import os

    total, inside = 0, False
    target = os.path.realpath(path)
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if head and "-" in head[0] and len(head) >= 5 and not head[0].endswith(":"):
                inside = len(head) == 6 and os.path.realpath(head[5]) == target
            elif inside and line.startswith("Rss:"):
                total += int(head[1])
    return total


@pytest.mark.skipif(not __import__("os").path.exists("/proc/self/smaps"), reason="needs Linux's /proc")
def test_mapped_source_copies_and_drops_the_pages_it_read(tmp_path):
    """Loading from a memory-mapped checkpoint file through MappedSource leaves its pages out of the
    resident memory (a plain copy keeps all of them); memory that is not the file's is never released."""
    from ctrkit.checkpoint_shards import MappedSource

    torch.save({"w": torch.arange(8 * 2**20, dtype=torch.float32).reshape(-1, 64)}, tmp_path / "f.pt")  # 32 MiB
    src = torch.load(tmp_path / "f.pt", mmap=True, weights_only=True)["w"]
    plain = torch.empty_like(src)
    plain.copy_(src)
    assert _mapping_rss_kb(tmp_path / "f.pt") > 30_000  # every page read stays resident
    src = torch.load(tmp_path / "f.pt", mmap=True, weights_only=True)["w"]  # a fresh mapping
    dst = torch.empty_like(src)
    MappedSource([tmp_path / "f.pt"]).copy(dst, src)
    assert torch.equal(dst, plain) and _mapping_rss_kb(tmp_path / "f.pt") < 4_000
    assert torch.equal(src, plain)  # the mapping reads the file again
    anonymous = plain.clone()
    out = torch.empty_like(anonymous)
    MappedSource([tmp_path / "f.pt"]).copy(out, anonymous)  # not the file's memory: copied only
    assert torch.equal(anonymous, plain) and torch.equal(out, plain)


def test_checkpoints_are_written_without_the_crc_that_torch_load_does_not_check(tmp_path):
    import zipfile

    from ctrkit.checkpoint_files import torch_save

    state = {"w": torch.arange(100_000, dtype=torch.float32)}
    torch_save(state, tmp_path / "fast.pt")
    torch.save(state, tmp_path / "plain.pt")
    data = [i for i in zipfile.ZipFile(tmp_path / "fast.pt").infolist() if "/data/" in i.filename]
    assert data and all(i.CRC == 0 for i in data)  # none computed
    assert any(i.CRC != 0 for i in zipfile.ZipFile(tmp_path / "plain.pt").infolist() if "/data/" in i.filename)
    assert torch.equal(torch.load(tmp_path / "fast.pt", weights_only=True)["w"], state["w"])
    # why leaving it out loses nothing: torch.load reads a record whose bytes no longer match its CRC
    raw = bytearray((tmp_path / "plain.pt").read_bytes())
    at = raw.find(state["w"][50_000:50_001].numpy().tobytes(), len(raw) // 4)
    raw[at : at + 4] = torch.tensor([-1.0]).numpy().tobytes()
    (tmp_path / "changed.pt").write_bytes(bytes(raw))
    assert (torch.load(tmp_path / "changed.pt", weights_only=True)["w"] == -1.0).sum() == 1
    assert torch.utils.serialization.config.save.compute_crc32  # torch's own default is left as it was


def _flip_value(path, old: bytes, new: bytes) -> None:
    raw = path.read_bytes()
    assert raw.count(old) == 1, "the value appears once in the file"
    path.write_bytes(raw.replace(old, new))


def test_digest_covers_values_as_well_as_tensors(tmp_path):
    """One bit of a pickled number (the calibration scale 1.094 -> 0.547: its exponent's lowest bit) is refused
    on load, as a flipped tensor byte is; a file sealed with the tensors-only digest of earlier ctrkit still loads."""
    import struct

    from ctrkit import integrity
    from ctrkit.checkpoint_files import torch_save

    cfg = multi_hot_config()
    ckpt = Checkpoint("dlrm", config_to_dict(cfg), {"cardinalities": [5, 7]}, create_model("dlrm", cfg).state_dict(),
                      step=3, calibration=1.094)  # fmt: skip
    save_checkpoint(tmp_path / "c.pt", ckpt)
    assert load_checkpoint(tmp_path / "c.pt").calibration == 1.094
    good, bad = struct.pack(">d", 1.094), struct.pack(">d", 0.547)
    assert sum(a != b for a, b in zip(good, bad)) == 1 and bin(good[1] ^ bad[1]).count("1") == 1  # one bit
    _flip_value(tmp_path / "c.pt", good, bad)
    with pytest.raises(CheckpointError, match="c.pt: refused: its data .tensors and values. does not match the digest"):
        load_checkpoint(tmp_path / "c.pt")

    old = ckpt.to_dict()
    old[integrity.KEY] = {"algorithm": "xxh3_64", "value": integrity.tensor_digest(old, "xxh3_64")}
    torch_save(old, tmp_path / "old.pt")
    assert load_checkpoint(tmp_path / "old.pt").calibration == 1.094
    _flip_value(tmp_path / "old.pt", good, bad)
    assert load_checkpoint(tmp_path / "old.pt").calibration == 0.547  # what the old digest could not see


def test_a_one_value_tensor_of_any_stride_is_digested_as_its_value():
    """A damaged checkpoint can give a one-value tensor any stride (the stride bytes of data.pkl): its digest is its
    value's, never a traceback (``view`` of a tensor whose last stride is not 1 raised before)."""
    from ctrkit import integrity

    odd = torch.empty_strided((1,), (7,)).fill_(2.5)
    plain = torch.tensor([2.5])
    assert integrity.tensor_digest({"w": odd}) == integrity.tensor_digest({"w": plain})
    assert integrity.tensor_digest({"w": odd}) != integrity.tensor_digest({"w": torch.tensor([2.0])})
