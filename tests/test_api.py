"""The documentation's Python API page, its example run as written (paths moved under a temporary directory)."""

from __future__ import annotations

import re
from pathlib import Path

from sklearn.metrics import roc_auc_score

from ctrkit.data.dataset import SplitBinaryDataset

PAGE = Path(__file__).resolve().parents[1] / "docs" / "python-api.md"


def python_api_example() -> str:
    return re.search(r"```python\n(.*?)```", PAGE.read_text(), re.S).group(1)


def test_python_api_example_runs_and_agrees_with_sklearn(tmp_path, capsys):
    code = python_api_example().replace("build/api", str(tmp_path))
    scope: dict = {}
    exec(compile(code, str(PAGE), "exec"), scope)
    result, metrics, probabilities = scope["result"], scope["metrics"], scope["probabilities"]
    test = SplitBinaryDataset(tmp_path / "data", "test")
    assert len(probabilities) == len(test) == metrics["samples"]
    # the checkpoint holds the model train() ended with, and Scoring reports sklearn's AUC of its scores
    assert metrics["auc"] == result["auc"]
    assert abs(roc_auc_score(test.labels(), probabilities) - metrics["auc"]) < 1e-9
    assert metrics["auc"] > 0.6
    assert f"AUC {metrics['auc']:.4f}" in capsys.readouterr().out


def test_train_takes_every_keyword_of_resolve_run(tiny_dataset, monkeypatch):
    """``train()``'s run keywords are ``resolve_run``'s own, read from its signature (issue #81: a second list lacked
    ``allow_other_vocabulary``); each reaches the resolved run."""
    import inspect
    from types import SimpleNamespace

    from ctrkit.train import run as run_mod

    monkeypatch.setattr(run_mod, "Run", lambda spec: SimpleNamespace(fit=lambda: spec))
    spec = run_mod.train(tiny_dataset, allow_other_vocabulary=True, progress=False, device="cpu", max_steps=3)
    assert spec.allow_other_vocabulary is True and spec.progress is False and spec.train.max_steps == 3
    keywords = set(inspect.signature(run_mod.resolve_run).parameters) - {"dataset", "model", "train", "model_config"}
    assert {"allow_other_vocabulary", "continue_from", "load_checkpoint", "recipe"} <= keywords
