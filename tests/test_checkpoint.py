"""The typed checkpoint: the current format round-trips, version 1 files load, other versions are refused."""

from __future__ import annotations

import pytest
import torch

from ctrkit.checkpoint import Checkpoint, CheckpointError, load_checkpoint, save_checkpoint
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
                      steps_per_epoch=5)  # fmt: skip
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
