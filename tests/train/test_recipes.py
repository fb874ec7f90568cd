"""Named recipes (--recipe): each resolves to its settings for every model, flags and a run YAML go over it,
the run YAML records it, and `plain` and `nvidia` train end to end for every model."""

from __future__ import annotations

import pytest
import yaml

from ctrkit.checkpoint import load_checkpoint
from ctrkit.config import RECIPES as RECIPE_NAMES
from ctrkit.models.registry import config_class, train_defaults
from ctrkit.train.recipes import DEFAULT_RECIPE, RECIPES
from ctrkit.train.run import resolve_run
from tests.conftest import run_cli

MODELS = ("dlrm", "dcnv2", "wide_deep")


def test_the_flag_offers_exactly_the_recipes_defined():
    assert tuple(RECIPES) == RECIPE_NAMES and DEFAULT_RECIPE in RECIPES


@pytest.mark.parametrize("name", RECIPE_NAMES)
@pytest.mark.parametrize("model", MODELS)
def test_every_recipe_sets_real_fields_for_every_model(name, model):
    train, config = RECIPES[name].layers(model)
    from ctrkit.config import TrainConfig

    assert set(train) <= set(TrainConfig.__dataclass_fields__)
    assert set(config) - {"combiner"} <= set(config_class(model).__dataclass_fields__)


def test_tuned_is_each_models_defaults(tiny_dataset):
    for model in MODELS:
        plain = resolve_run(tiny_dataset, model)
        tuned = resolve_run(tiny_dataset, model, recipe="tuned")
        assert plain.train == tuned.train and plain.model_config == tuned.model_config and plain.recipe == "tuned"
        assert tuned.train.lr == train_defaults(model)["lr"]


@pytest.mark.parametrize("model", MODELS)
def test_plain_turns_every_addition_off(tiny_dataset, model):
    spec = resolve_run(tiny_dataset, model, recipe="plain")
    t = spec.train
    assert (t.linear_warm_start, t.reinit_embeddings, t.snapshot_ensemble, t.seed_ensemble, t.small_batch,
            t.calibrate) == (False, "off", 1, 1, 0, "off")  # fmt: skip
    assert spec.model_config.numerical_buckets == 0
    if model != "wide_deep":  # Wide & Deep's wide part is the model's own first-order term
        assert spec.model_config.linear is False
    # validation, best weights and early stopping stay
    assert t.validation_fraction > 0 and t.early_stopping_patience != 0
    assert t.optimizer == train_defaults(model)["optimizer"]


def test_nvidia_is_the_published_configuration(tiny_dataset):
    dlrm = resolve_run(tiny_dataset, "dlrm", recipe="nvidia")
    assert (dlrm.train.optimizer, dlrm.train.embedding_optimizer, dlrm.train.lr, dlrm.train.embedding_lr) == (
        "sgd", "sgd", 24.0, 24.0)  # fmt: skip
    assert (dlrm.train.batch_size, dlrm.train.epochs, dlrm.train.evals_per_epoch) == (65536, 1, 1)
    assert (dlrm.train.warmup_steps, dlrm.train.decay_start_step, dlrm.train.decay_steps) == (8000, 48000, 24000)
    assert dlrm.train.early_stopping_patience == 0 and dlrm.train.plateau_patience == 0
    m = dlrm.model_config
    assert (m.embedding_dim, m.bottom_mlp, m.top_mlp, m.linear) == (128, (512, 256, 128), (1024, 1024, 512, 256, 1),
                                                                    False)  # fmt: skip
    dcn = resolve_run(tiny_dataset, "dcnv2", recipe="nvidia")
    assert (dcn.train.optimizer, dcn.train.lr, dcn.train.warmup_steps) == ("adam", 1e-4, 100)
    assert (dcn.model_config.cross_layers, dcn.model_config.cross_projection_dim) == (3, 512)
    wd = resolve_run(tiny_dataset, "wide_deep", recipe="nvidia")
    assert (wd.train.wide_optimizer, wd.train.wide_lr, wd.train.schedule_wide) == ("ftrl", 0.02, False)
    assert (wd.train.optimizer, wd.train.lr, wd.train.lr_schedule) == ("rmsprop", 1.2e-4, "step")
    assert (wd.train.batch_size, wd.train.epochs, wd.model_config.deep_mlp) == (131072, 20, (1024,) * 5)


def test_flags_and_the_run_yaml_go_over_the_recipe(tiny_dataset, tmp_path):
    spec = resolve_run(tiny_dataset, "dlrm", recipe="nvidia", train={"lr": 2.0}, model_config={"embedding_dim": 16})
    assert spec.train.lr == 2.0 and spec.train.embedding_lr == 24.0 and spec.train.optimizer == "sgd"
    assert spec.model_config.embedding_dim == 16 and spec.model_config.bottom_mlp == (512, 256, 16)
    run_file = tmp_path / "run.yaml"
    run_file.write_text(yaml.safe_dump({"recipe": "plain", "train_config": {"calibrate": "on"}}))
    from_file = resolve_run(tiny_dataset, "dlrm", config=run_file)
    assert from_file.recipe == "plain" and from_file.train.calibrate == "on" and from_file.train.seed_ensemble == 1
    assert resolve_run(tiny_dataset, "dlrm", config=run_file, recipe="tuned").recipe == "tuned"


def test_an_unknown_recipe_is_one_line_naming_the_known(tiny_dataset, tmp_path, capsys):
    with pytest.raises(ValueError, match="unknown recipe 'fast'; known: tuned, plain, nvidia"):
        resolve_run(tiny_dataset, "dlrm", recipe="fast")
    run_file = tmp_path / "run.yaml"
    for bad, said in (("fast", "unknown recipe"), (["plain"], "'recipe' holds ['plain']; expected text")):
        run_file.write_text(yaml.safe_dump({"recipe": bad}))  # a name it lacks, and not a name at all
        code, _, err = run_cli("train", "--dataset", tiny_dataset, "--config", run_file, capsys=capsys)
        assert code == 2 and said in err and "Traceback" not in err


@pytest.mark.parametrize("recipe", ("plain", "nvidia"))
@pytest.mark.parametrize("model", MODELS)
def test_plain_and_nvidia_train_end_to_end(tiny_dataset, tmp_path, capsys, recipe, model):
    ckpt = tmp_path / f"{model}.pt"
    code, out, err = run_cli("train", "--model", model, "--recipe", recipe, "--dataset", tiny_dataset,
                           "--batch-size", 256, "--max-steps", 3, "--no-progress", "--save-checkpoint", ckpt,
                           capsys=capsys)  # fmt: skip
    assert code == 0 and f"(recipe {recipe}," in out + err
    saved = load_checkpoint(ckpt)
    assert saved.member_ensemble is None and saved.ensemble is None and saved.calibration is None
    run = yaml.safe_load(ckpt.with_suffix(".yaml").read_text())
    assert run["recipe"] == recipe and run["train_config"]["linear_warm_start"] is False
    if recipe == "nvidia":
        assert run["train_config"]["evals_per_epoch"] == 1 and run["train_config"]["batch_size"] == 256


def test_models_lists_what_a_default_run_resolves(tiny_dataset, capsys):
    """`ctrkit models` and a run with no flags agree on every model's shape and optimizers (one truth)."""
    code, out, _ = run_cli("models", capsys=capsys)
    assert code == 0
    for model in MODELS:
        line = next(x for x in out.splitlines() if x.startswith(f"{model}:"))
        spec = resolve_run(tiny_dataset, model)
        for name in ("numerical_buckets", "embedding_dim"):
            assert f"'{name}': {getattr(spec.model_config, name)}," in line, (model, name)
        for name in ("optimizer", "lr", "embedding_lr", "batch_size"):
            assert f"'{name}': {getattr(spec.train, name)!r}" in line, (model, name)
