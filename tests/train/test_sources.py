"""Settings' sources are data: the rules ask the layer that set a value, never the words the plan prints."""

from __future__ import annotations

from ctrkit.config import TrainConfig
from ctrkit.train.mechanisms import continued_settings
from ctrkit.train.run import resolve_run
from ctrkit.train.sources import DEFAULT, Layer, Source, source


def test_a_continued_run_halves_the_rates_left_to_defaults_whatever_their_labels_say():
    cfg = TrainConfig(lr=0.002, embedding_lr=0.02, wide_lr=0.01)
    looks_default = Source(Layer.FLAG, "dlrm's default")  # set by a flag, worded as a default
    looks_set = Source(Layer.MODEL, "flag")  # the model's default, worded as a flag
    changes = continued_settings(cfg, {"lr": looks_default, "embedding_lr": looks_set}, {}, steps=10)
    assert "lr" not in changes and changes["embedding_lr"] == 0.01 and changes["wide_lr"] == 0.04
    assert source({}, "lr") is DEFAULT and DEFAULT.left_to_defaults and not DEFAULT.user_set


def test_resolve_run_records_each_settings_layer(tiny_dataset, tmp_path):
    run = tmp_path / "run.yaml"
    run.write_text("train_config:\n  epochs: 3\n")
    spec = resolve_run(tiny_dataset, "dlrm", recipe="tuned", config=run, train={"lr": 0.01})
    layers = {k: spec.sources[k].layer for k in ("lr", "epochs")}
    assert layers == {"lr": Layer.FLAG, "epochs": Layer.RUN_FILE}
    assert str(spec.sources["epochs"]) == f"--config {run}"
    assert all(s.layer in (Layer.MODEL, Layer.RECIPE) for k, s in spec.sources.items() if k not in layers)


def test_each_setting_holds_the_value_of_the_layer_its_source_names(tiny_dataset, tmp_path):
    """One list of layers makes both the values and their sources: whichever layer a source names, the value run
    is that layer's (recipe nvidia over dlrm's defaults, a run YAML over the recipe, flags over both; a run YAML's
    null leaves the recipe's value, as its source says)."""
    run = tmp_path / "run.yaml"
    run.write_text("train_config:\n  epochs: 3\n  lr: 0.5\n  warmup_steps: null\nmodel_config:\n  embedding_dim: 12\n")
    model_file = tmp_path / "model.yaml"
    model_file.write_text("embedding_dim: 6\n")
    spec = resolve_run(tiny_dataset, "dlrm", recipe="nvidia", config=run, model_config_file=model_file,
                       train={"lr": 0.01, "batch_size": 256})  # fmt: skip
    layers = {"dlrm's default": {}, "recipe nvidia": {}, f"--config {run}": {"epochs": 3, "lr": 0.5},
              "--model-config": {"embedding_dim": 6}, "flag": {"lr": 0.01, "batch_size": 256}}  # fmt: skip
    from ctrkit.models.registry import train_defaults
    from ctrkit.train.recipes import recipe

    layers["dlrm's default"] = train_defaults("dlrm")
    layers["recipe nvidia"] = {**recipe("nvidia").layers("dlrm")[0], **recipe("nvidia").layers("dlrm")[1]}
    values = {**vars(spec.train), "embedding_dim": spec.model_config.embedding_dim}  # (others derive from it)
    for name, where in spec.sources.items():
        if name in values and name in layers[str(where)]:
            assert values[name] == (tuple(v) if isinstance(v := layers[str(where)][name], list) else v), name
    assert spec.sources["lr"].layer is Layer.FLAG and spec.sources["embedding_dim"].layer is Layer.MODEL_FILE
    assert "warmup_steps" not in spec.sources or spec.sources["warmup_steps"].layer is not Layer.RUN_FILE
