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
