"""Each multi-hot column's pooling chosen by a held-out test (``preprocess/pooling.py``, `preprocess table --combiner
auto`): sum where the clicks add the values' effects, mean where they average them, on e-commerce logs whose click
model is known; the bag weights' fit at the penalised optimum; the choice written to the feature spec the models
read, and kept by a later day written `--like`."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ctrkit.data.feature_spec import FeatureSpec
from ctrkit.data.synthetic_shop import shop_log
from ctrkit.preprocess.pooling import RIDGE, Bags, fit_bag_weights
from tests.conftest import run_cli

FLAGS = ("--label", "clicked", "--multi-hot", "tags", "--order-by", "ts", "--integers", "numerical", "--no-progress")


def _preprocess(tmp_path, frame, name: str, *flags: str, capsys=None):
    frame.write_csv(tmp_path / f"{name}.csv")
    out = tmp_path / name
    code, stdout, _ = run_cli("preprocess", "table", tmp_path / f"{name}.csv", "--out", out, *FLAGS, *flags,
                              capsys=capsys)  # fmt: skip
    assert code == 0, stdout
    return out, stdout


@pytest.mark.parametrize("tags", ["sum", "mean"])
def test_auto_chooses_the_pooling_the_clicks_were_drawn_with(tmp_path, capsys, tags):
    out, stdout = _preprocess(tmp_path, shop_log(40_000, seed=7, tags=tags)[0], "shop", capsys=capsys)
    assert f"multi-hot pooling (--combiner auto): tags {tags} (held-out log loss" in stdout
    assert FeatureSpec.from_yaml(out).multi_hot_combiners == [tags]
    test = json.loads((out / "summary.json").read_text())["pooling_tests"]["tags"]
    other = "mean" if tags == "sum" else "sum"
    assert test["chosen"] == tags and test[tags] < test[other] - 2 * test["stderr"]  # clearly, not by noise


def test_a_named_pooling_a_later_day_and_too_few_rows(tmp_path, capsys):
    frame = shop_log(12_000, seed=8, tags="sum")[0]
    named, _ = _preprocess(tmp_path, frame, "named", "--combiner", "mean")
    assert FeatureSpec.from_yaml(named).multi_hot_combiners == ["mean"]
    assert "pooling_tests" not in json.loads((named / "summary.json").read_text())
    first, _ = _preprocess(tmp_path, frame[:6000], "first")
    chosen = FeatureSpec.from_yaml(first).multi_hot_combiners
    assert chosen == ["sum"]
    frame[6000:].write_csv(tmp_path / "second.csv")
    assert run_cli("preprocess", "table", tmp_path / "second.csv", "--out", tmp_path / "second", "--label", "clicked",
                   "--order-by", "ts", "--like", first, "--no-progress")[0] == 0  # fmt: skip
    assert FeatureSpec.from_yaml(tmp_path / "second").multi_hot_combiners == chosen  # the model's pooling
    capsys.readouterr()  # (the runs before)
    small, said = _preprocess(tmp_path, frame[:1000], "small", capsys=capsys)  # 90 held-out rows: no power, the default
    assert json.loads((small / "summary.json").read_text())["pooling_tests"]["tags"] == {
        "sum": 0.0, "mean": 0.0, "stderr": 0.0, "chosen": "mean", "held_out": 90, "tested": False}  # fmt: skip
    assert "tags mean (not tested: 90 held-out rows, the test needs 200)" in said  # not a log loss of 0.0000
    assert "log loss sum" not in said


@pytest.mark.parametrize("pooling", ["sum", "mean"])
def test_bag_weights_reach_the_penalised_optimum(pooling):
    """At the fit's weights the penalised loss's gradient vanishes (a fit stopped early, or a wrong bound, leaves
    it far from zero), and it is below the loss at nearby weights."""
    rng = np.random.default_rng(0)
    n, k = 3000, 40
    lengths = rng.integers(0, 6, n)
    bags = Bags(rng.integers(0, k, int(lengths.sum())), lengths)
    truth = rng.normal(0, 1, k)
    z = rng.normal(-1.0, 0.5, n)
    rows, values = bags.rows(), bags.values(pooling)
    logit = z + np.bincount(rows, values * truth[bags.ids], n)
    y = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.float64)
    w = fit_bag_weights(z, bags, y, k, pooling)

    def loss(weights):
        s = z + np.bincount(rows, values * weights[bags.ids], n)
        return float((np.logaddexp(0, s) - y * s).sum() + RIDGE / 2 * (weights**2).sum())

    p = 1 / (1 + np.exp(-(z + np.bincount(rows, values * w[bags.ids], n))))
    gradient = np.bincount(bags.ids, values * (p - y)[rows], k) + RIDGE * w
    assert np.abs(gradient).max() < 1e-3
    for _ in range(5):
        assert loss(w) <= loss(w + rng.normal(0, 0.01, k))
    assert np.corrcoef(w, truth)[0, 1] > 0.8


def test_a_table_without_multi_hot_columns_fits_no_pooling_model(monkeypatch):
    """With no multi-hot feature there is nothing to decide: model A (seconds a million rows) is not fitted."""
    from ctrkit.preprocess import pooling

    def fitted(*_args, **_kwargs):
        raise AssertionError("model A fitted with no multi-hot feature to test")

    monkeypatch.setattr(pooling, "additive_logits", fitted)
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 5, 1000)
    labels = rng.random(1000) < 0.3
    assert pooling.pooling_tests([(ids[:600], ids[600:], 5)], [], {}, labels[:600], labels[600:]) == {}
