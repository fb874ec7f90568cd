import numpy as np
import pytest

from ctrkit.data.dataset import SplitBinaryDataset
from ctrkit.data.synthetic import SyntheticCTR, generate_dataset, power_law_ids
from ctrkit.metrics import roc_auc


def test_power_law_ids_are_skewed_and_in_range():
    ids = power_law_ids(np.random.default_rng(0), 1000, 200_000, 1.2)
    assert ids.min() >= 0 and ids.max() < 1000
    counts = np.bincount(ids, minlength=1000)
    assert counts[0] > counts[1] > counts[10] > counts[100]
    assert counts[:10].sum() > 0.4 * len(ids)  # the head holds much of the mass
    assert (counts[500:] > 0).mean() > 0.5  # but the tail is reached


def test_planted_signal_is_learnable_in_principle():
    model = SyntheticCTR((50, 1000, 20), num_numerical=3, seed=1)
    block = model.sample(np.random.default_rng(2), 50_000)
    assert 0.2 < block.labels.mean() < 0.3
    assert roc_auc(block.labels, block.logits) > 0.8  # the true odds rank clicks well


def test_generated_dataset_matches_its_spec(tiny_dataset):
    train = SplitBinaryDataset(tiny_dataset, "train")
    test = SplitBinaryDataset(tiny_dataset, "test")
    assert (len(train), len(test)) == (21_600, 2_400)
    b = train.slice(0, len(train))
    cards = train.spec.cardinalities
    assert cards == [3, 10, 50, 120, 400, 2000, 7, 900]
    assert (b.categorical.max(0).values.numpy() < np.array(cards)).all()
    assert b.numerical.shape == (21_600, 4) and set(np.unique(b.labels.numpy())) == {0.0, 1.0}
    assert train.spec.metadata["seed"] == 7


def test_refuses_to_overwrite_without_flag(tmp_path):
    out = tmp_path / "d"
    generate_dataset(out, 100, (5, 6), num_numerical=1, progress=False)
    with pytest.raises(ValueError, match="not empty; set `overwrite`"):
        generate_dataset(out, 100, (5, 6), num_numerical=1, progress=False)
    generate_dataset(out, 200, (5, 6), num_numerical=1, progress=False, overwrite=True)
    assert len(SplitBinaryDataset(out, "train")) + len(SplitBinaryDataset(out, "test")) == 200
    assert [p.name for p in tmp_path.iterdir()] == ["d"]  # no temp directories left behind


def test_raw_criteo_tsv_format(tmp_path):
    import gzip

    from ctrkit.data.synthetic import write_criteo_tsv

    path = write_criteo_tsv(tmp_path / "day_0.tsv", 3000, (5, 300, 20000), num_numerical=3, seed=4, progress=False)
    lines = path.read_text().splitlines()
    assert len(lines) == 3000
    rows = [line.split("\t") for line in lines]
    assert {len(r) for r in rows} == {1 + 3 + 3}
    labels = [int(r[0]) for r in rows]
    assert set(labels) == {0, 1}
    ints = [r[1:4] for r in rows]
    assert any(v == "" for r in ints for v in r)  # missing integers
    assert any(r[1].startswith("-") for r in ints) and all(int(v) >= -3 for r in ints for v in r if v)
    cats = [r[4:] for r in rows]
    assert any(v == "" for r in cats for v in r)  # missing categories
    assert all(len(v) == 8 and int(v, 16) >= 0 for r in cats for v in r if v)
    assert len({r[0] for r in cats if r[0]}) <= 5  # a bijection of the ids: at most cardinality values
    # deterministic, and gzip when asked
    again = write_criteo_tsv(tmp_path / "again.tsv.gz", 3000, (5, 300, 20000), num_numerical=3, seed=4, progress=False)
    with gzip.open(again, "rt") as f:
        assert f.read() == path.read_text()
    with pytest.raises(ValueError, match="file exists; set `overwrite`"):
        write_criteo_tsv(path, 10, (5,), num_numerical=1, progress=False)


def test_synth_criteo_command(tmp_path, capsys):
    from tests.conftest import run_cli

    code, out, _ = run_cli("synth", "criteo", "--out", tmp_path / "raw.tsv", "--rows", "500", capsys=capsys)
    assert code == 0 and "500 raw rows (label, 13 integer, 26 hashed columns)" in out
    assert len((tmp_path / "raw.tsv").read_text().splitlines()[0].split("\t")) == 40


def test_planted_tabular_signal_is_nonlinear_in_the_numericals(tmp_path, capsys):
    """The tabular family: `ctrkit synth planted-tabular` writes the rows the model draws, records their
    Bayes AUC, and its signal is one that trees learn and a logistic regression mostly cannot."""
    from sklearn.ensemble import HistGradientBoostingClassifier
    from sklearn.linear_model import LogisticRegression

    from ctrkit.data.synthetic_planted import PlantedTabular
    from tests.conftest import run_cli

    out = tmp_path / "tab"
    code, stdout, err = run_cli("synth", "planted-tabular", "--out", out, "--rows", 36_000, "--test-fraction", 0.25,
                                "--seed", 3, capsys=capsys)  # fmt: skip
    assert code == 0, err
    train, test = SplitBinaryDataset(out, "train"), SplitBinaryDataset(out, "test")
    assert (len(train), len(test)) == (27_000, 9_000)
    assert train.spec.cardinalities == [1_000, 200, 50, 10] and train.spec.metadata["generator"].endswith("tabular")
    tr, te = train.slice(0, len(train)), test.slice(0, len(test))
    # the same draws again from the model: the files hold them, and the recorded Bayes AUC is theirs
    rng = np.random.default_rng([3, 203])
    model = PlantedTabular(seed=3)
    drawn_train, drawn_test = model.sample(rng, 27_000), model.sample(rng, 9_000)
    np.testing.assert_array_equal(te.categorical.numpy(), drawn_test.categorical)
    np.testing.assert_allclose(te.numerical.numpy(), drawn_test.numerical, atol=2e-3)  # stored as float16
    np.testing.assert_array_equal(tr.labels.numpy(), drawn_train.labels)
    bayes = roc_auc(drawn_test.labels, drawn_test.logits)
    assert test.spec.metadata["bayes_test_auc"] == pytest.approx(bayes, abs=1e-6)
    assert f"{bayes:.4f}" in stdout
    x_tr, x_te = tr.numerical.numpy(), te.numerical.numpy()
    y_tr, y_te = tr.labels.numpy(), te.labels.numpy()
    linear = roc_auc(y_te, LogisticRegression(max_iter=500).fit(x_tr, y_tr).decision_function(x_te))
    trees = HistGradientBoostingClassifier(random_state=0).fit(x_tr, y_tr).predict_proba(x_te)[:, 1]
    assert roc_auc(y_te, trees) > linear + 0.05  # the numericals' effects are mostly nonlinear
    assert roc_auc(y_te, trees) < bayes
    other = PlantedTabular(seed=4)
    assert not np.allclose(other.weights, model.weights)  # the seed draws the model


def test_planted_amounts_are_the_tabular_rows_as_raw_amounts(tmp_path, capsys):
    """`synth planted-amounts` writes planted-tabular's rows (same seed) with each numerical feature j as
    exp(1.5 x) * 10^j in float32, so labels, ids and the Bayes AUC are the tabular data's."""
    from ctrkit.cli import main

    for kind in ("planted-tabular", "planted-amounts"):
        assert main(["synth", kind, "--out", str(tmp_path / kind), "--rows", "3000", "--seed", "2"]) == 0
    tab, amo = (SplitBinaryDataset(tmp_path / k, "train") for k in ("planted-tabular", "planted-amounts"))
    assert (
        amo.spec.metadata["bayes_test_auc"]
        == SplitBinaryDataset(tmp_path / "planted-tabular", "test").spec.metadata["bayes_test_auc"]
    )
    a, b = tab.slice(0, len(tab)), amo.slice(0, len(amo))
    assert np.array_equal(a.labels.numpy(), b.labels.numpy()) and np.array_equal(a.categorical, b.categorical)
    x = b.numerical.numpy().astype(np.float64)
    assert x.min() > 0 and np.quantile(x[:, 5], 0.999) > 1e6  # heavy-tailed amounts
    back = np.log(x / 10.0 ** np.arange(x.shape[1])) / 1.5  # the standard-normal values again
    np.testing.assert_allclose(back, a.numerical.numpy(), atol=2e-3)  # tabular stores them as float16


def test_planted_records_the_best_auc_a_model_of_its_columns_can_reach(tmp_path, capsys):
    """The planted click odds hold a hidden state the rows show only through noisy counts. Each test row's click
    probability given what it holds, every effect known (the hidden state integrated over its posterior), is the
    best prediction of the columns: calibrated, with a lower log loss than scikit-learn's gradient boosting given
    the same ids' true odds and the numerical features, and a lower AUC than the true odds. `synth planted`
    records its test AUC beside the Bayes AUC."""
    from sklearn.ensemble import HistGradientBoostingClassifier
    from sklearn.metrics import log_loss

    from ctrkit.data.synthetic_planted import PlantedCTR
    from tests.conftest import run_cli

    model = PlantedCTR(seed=3)
    rng = np.random.default_rng(5)
    train, test = model.sample(rng, 30_000), model.sample(rng, 30_000)
    best = model.observable_probability(test, np.random.default_rng(1))
    y = test.labels
    trees = HistGradientBoostingClassifier(random_state=0).fit(
        np.column_stack([model.id_logits(train.categorical), train.numerical]), train.labels
    )
    learned = trees.predict_proba(np.column_stack([model.id_logits(test.categorical), test.numerical]))[:, 1]
    true = 1.0 / (1.0 + np.exp(-test.logits))
    assert log_loss(y, true) < log_loss(y, best) < log_loss(y, learned) - 0.002
    assert roc_auc(y, learned) < roc_auc(y, best) < roc_auc(y, true) - 0.005
    for part in np.array_split(np.argsort(best), 5):  # calibrated: each fifth's clicks as predicted
        expected = best[part].sum()
        assert abs(y[part].sum() - expected) < 3.5 * np.sqrt((best[part] * (1 - best[part])).sum()) + 1, part.size

    code, stdout, err = run_cli("synth", "planted", "--out", tmp_path / "p", "--rows", 12_000, "--seed", 3,
                                capsys=capsys)  # fmt: skip
    assert code == 0, err
    meta = SplitBinaryDataset(tmp_path / "p", "test").spec.metadata
    assert 0.6 < meta["observable_test_auc"] < meta["bayes_test_auc"]
    assert f"the best any model of the columns can at {meta['observable_test_auc']:.4f}" in stdout
