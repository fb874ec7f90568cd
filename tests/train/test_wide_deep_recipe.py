"""The Wide & Deep seed's recipe options: a wide part outside the schedule, the step schedule, sum pooling."""

import numpy as np
import torch

from ctrkit.checkpoint import load_checkpoint
from ctrkit.data.dataset import SplitBinaryDataset
from ctrkit.data.feature_spec import FeatureSpec
from ctrkit.data.synthetic_outbrain import generate_outbrain
from ctrkit.models import create_model
from ctrkit.train.optim import build_optimizers
from ctrkit.train.run import resolve_model_config
from ctrkit.train.step import TrainStep
from tests.conftest import run_cli


def test_wide_part_keeps_its_lr_when_outside_the_schedule(tmp_path):
    generate_outbrain(tmp_path / "ob", 600, test_fraction=0.3, seed=0, progress=False)
    spec = FeatureSpec.from_yaml(tmp_path / "ob")
    model = create_model("wide_deep", resolve_model_config("wide_deep", spec))
    opts = build_optimizers(model, "adam", 1e-3, "adam", 3e-3, "ftrl", 0.02)
    step = TrainStep(model, opts, torch.device("cpu"))
    batch = SplitBinaryDataset(tmp_path / "ob", "train").slice(0, 64)
    step(batch, scale=0.1, wide_scale=0.5)
    lrs = {(o.is_wide, o.is_table_optimizer): o.param_groups[0]["lr"] for o in opts}
    assert np.isclose(lrs[True, True], 0.01) and np.isclose(lrs[True, False], 0.01)  # 0.02 x 0.5
    assert np.isclose(lrs[False, True], 3e-4) and np.isclose(lrs[False, False], 1e-4)  # scheduled
    step(batch, scale=0.1)  # no wide_scale: every part follows the schedule
    assert all(np.isclose(o.param_groups[0]["lr"], o.param_groups[0]["base_lr"] * 0.1) for o in opts)


def test_recipe_flags_train_and_are_recorded(tmp_path, capsys):
    generate_outbrain(tmp_path / "ob", 3_000, test_fraction=0.3, seed=1, progress=False)
    ckpt = tmp_path / "wd.pt"
    code, out, err = run_cli(
        "train", "--model", "wide_deep", "--dataset", tmp_path / "ob", "--epochs", "2", "--no-progress",
        "--lr-schedule", "step", "--no-schedule-wide", "--combiner", "sum", "--wide-optimizer", "ftrl",
        "--optimizer", "rmsprop", "--save-checkpoint", ckpt, "--log-path", tmp_path / "log.jsonl",
        "--seed-ensemble", "1", "--small-batch", "0",  # one model: the recipe's flags are what is checked here
        capsys=capsys,
    )  # fmt: skip
    assert code == 0, err
    saved = load_checkpoint(ckpt)
    assert saved.train_config["lr_schedule"] == "step" and saved.train_config["schedule_wide"] is False
    assert saved.train_config["wide_optimizer"] == "ftrl" and saved.train_config["optimizer"] == "rmsprop"
    assert set(saved.model_config["multi_hot_combiners"]) == {"sum"}
    # the mean-pooled default differs: the flag reached the model
    spec = FeatureSpec.from_yaml(tmp_path / "ob")
    assert set(resolve_model_config("wide_deep", spec).multi_hot_combiners) == {"mean"}
