"""`--also-categorical auto`: the held-out test of ``ctrkit.preprocess.value_ids``, its fits against SciPy and
scikit-learn, and the column choice on tables whose numbers do or do not identify something."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest

from ctrkit.data.feature_spec import FeatureSpec
from ctrkit.preprocess import value_ids
from tests.conftest import run_cli


def test_fit_offsets_minimises_the_penalised_log_loss():
    optimize = pytest.importorskip("scipy.optimize")
    rng = np.random.default_rng(0)
    n, k = 500, 12
    index = rng.integers(0, k, n)
    z = rng.normal(0, 1, n)
    y = (rng.random(n) < 1 / (1 + np.exp(-(z + index % 3 - 1)))).astype(float)
    y[index == 5] = 1.0  # a value whose rows all click: only the penalty keeps its offset finite

    def objective(b):
        t = z + b[index]
        return (np.logaddexp(0, t) - y * t).sum() + value_ids.RIDGE / 2 * (b**2).sum()

    reference = optimize.minimize(objective, np.zeros(k), method="BFGS", options={"gtol": 1e-10}).x
    np.testing.assert_allclose(value_ids.fit_offsets(z, index, y, k), reference, atol=1e-4)


def test_additive_model_agrees_with_scikit_learn():
    linear_model = pytest.importorskip("sklearn.linear_model")
    rng = np.random.default_rng(1)
    n, sizes = 3000, (5, 8, 3)
    fit = [rng.integers(0, k, n) for k in sizes]
    held = [rng.integers(0, k, 400) for k in sizes]
    effects = [rng.normal(0, 1, k) for k in sizes]
    y = (rng.random(n) < 1 / (1 + np.exp(-sum(e[i] for e, i in zip(effects, fit))))).astype(float)
    _, z_held = value_ids.additive_logits([(f, h, k) for f, h, k in zip(fit, held, sizes)], y)

    def onehot(ids):
        return np.hstack([np.eye(k)[i] for i, k in zip(ids, sizes)])

    # scikit-learn's objective: |w|^2 / 2 + C x sum of log losses, the intercept unpenalised
    reference = linear_model.LogisticRegression(C=1 / value_ids.RIDGE, tol=1e-10, max_iter=10_000)
    reference.fit(onehot(fit), y)
    np.testing.assert_allclose(z_held, reference.decision_function(onehot(held)), atol=0.02)


def _household_table(seed: int = 0, rows: int = 6000) -> dict[str, np.ndarray]:
    """Households that recur, each with its own income (an amount that identifies it) and propensity; a
    smooth amount with a linear effect; a score that repeats what the person id (a categorical) already says."""
    rng = np.random.default_rng(seed)
    household = rng.integers(0, 400, rows)
    income = np.round(rng.lognormal(10, 0.5, 400), 2)[household]
    propensity = rng.normal(0, 1.5, 400)[household]
    person = rng.integers(0, 60, rows)
    score = rng.permutation(60)[person] * 0.5  # one value per person
    person_effect = rng.normal(0, 1.0, 60)[person]
    amount = rng.normal(0, 1, rows)
    logit = propensity + person_effect + 0.8 * amount - 0.5
    click = (rng.random(rows) < 1 / (1 + np.exp(-logit))).astype(int)
    return {"person": np.array([f"p{i}" for i in person]), "income": income, "amount": np.round(amount, 3),
            "score": score, "click": click}  # fmt: skip


def test_the_test_chooses_the_identifying_amount_only():
    table = _household_table()
    y = table["click"].astype(float)
    n_fit = 5000
    person = np.unique(table["person"], return_inverse=True)[1]
    numerical = {c: (table[c][:n_fit], table[c][n_fit:]) for c in ("income", "amount", "score")}
    tests = value_ids.value_id_tests(numerical, [(person[:n_fit], person[n_fit:], person.max() + 1)], y[:n_fit],
                                     y[n_fit:], frequency_threshold=3)  # fmt: skip
    assert [c for c, t in tests.items() if t.chosen] == ["income"], {c: t.as_dict() for c, t in tests.items()}
    assert tests["income"].gain > 0.02 and tests["income"].covered > 0.9
    assert tests["score"].gain < value_ids.MIN_GAIN  # the person id already says it
    # without the person id beside it, the score identifies persons too and is chosen
    alone = value_ids.value_id_tests({"score": numerical["score"]}, [], y[:n_fit], y[n_fit:], 3)
    assert alone["score"].chosen
    # too few held-out rows: no power, nothing chosen
    few = value_ids.value_id_tests(numerical, [], y[:n_fit], y[n_fit : n_fit + 100], 3)
    assert not any(t.chosen for t in few.values())


def test_preprocess_table_auto_adds_the_ids_the_test_chooses(tmp_path, capsys):
    path = tmp_path / "households.csv"
    pl.DataFrame(_household_table()).write_csv(path)
    common = ["--label", "click", "--shuffle-seed", "0", "--test-fraction", "0.15", "--no-progress"]
    assert run_cli("preprocess", "table", path, "--out", tmp_path / "auto", *common)[0] == 0
    assert "also as ids (--also-categorical auto): income" in capsys.readouterr().out
    spec = FeatureSpec.from_yaml(tmp_path / "auto")
    assert spec.onehot_features == ("person", "income_id")
    assert spec.numerical_features == ("income", "amount", "score")
    summary = json.loads((tmp_path / "auto" / "summary.json").read_text())
    assert [c for c, t in summary["value_id_tests"].items() if t["chosen"]] == ["income"]
    # the same bytes as naming the column
    assert run_cli("preprocess", "table", path, "--out", tmp_path / "named", *common, "--also-categorical",
                   "income")[0] == 0  # fmt: skip
    for name in ("train", "test"):
        for f in sorted((tmp_path / "named" / name).iterdir()):
            assert f.read_bytes() == (tmp_path / "auto" / name / f.name).read_bytes(), f
    assert run_cli("preprocess", "table", path, "--out", tmp_path / "none", *common, "--also-categorical",
                   "none")[0] == 0  # fmt: skip
    assert FeatureSpec.from_yaml(tmp_path / "none").onehot_features == ("person",)
    capsys.readouterr()
    code, _, err = run_cli("preprocess", "table", path, "--out", tmp_path / "bad", *common, "--also-categorical",
                           "auto,income", capsys=capsys)  # fmt: skip
    assert code == 2 and len(err.strip().splitlines()) == 1 and "stands alone" in err
