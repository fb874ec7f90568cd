"""The first-order warm start against scikit-learn's logistic regression, and its place in training."""

import json

import numpy as np
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.preprocessing import OneHotEncoder, StandardScaler

from ctrkit.config import TrainConfig
from ctrkit.data.dataset import SplitBinaryDataset, split_tail
from ctrkit.models.registry import create_model, make_config
from ctrkit.train.linear_fit import fit_first_order


def tiny_model(dataset, name="dlrm"):
    spec = SplitBinaryDataset(dataset, "train").spec
    shape = {"num_numerical": len(spec.numerical_features), "cardinalities": spec.cardinalities,
             "embedding_dim": 8}  # fmt: skip
    if name != "wide_deep":
        shape.update(bottom_mlp=(16, 8), top_mlp=(16, 1))
    return create_model(name, make_config(name, shape))


def test_the_fit_is_scikit_learns_logistic_regression(tiny_dataset):
    train, validation = split_tail(SplitBinaryDataset(tiny_dataset, "train"), 0.1)
    torch.manual_seed(0)
    model = tiny_model(tiny_dataset).eval()
    fit = fit_first_order(model, train, validation, cs=(0.1,), max_iter=500, tolerance=1e-7)
    tr, va = train.slice(0, len(train)), validation.slice(0, len(validation))
    # the same regression in scikit-learn: one-hot ids (every id a column) and standardised numericals
    cards = SplitBinaryDataset(tiny_dataset, "train").spec.cardinalities
    encoder = OneHotEncoder(categories=[np.arange(c) for c in cards]).fit(tr.categorical.numpy())
    scaler = StandardScaler().fit(tr.numerical.numpy().astype(np.float64))

    def design(b):
        from scipy import sparse

        return sparse.hstack([encoder.transform(b.categorical.numpy()),
                              sparse.csr_matrix(scaler.transform(b.numerical.numpy()))]).tocsr()  # fmt: skip

    reference = LogisticRegression(C=0.1, max_iter=5000, tol=1e-10).fit(design(tr), tr.labels.numpy())
    expected = reference.decision_function(design(va))
    with torch.no_grad():
        got = model(va.numerical, va.categorical).numpy()  # the whole model: the deep output is zero
    np.testing.assert_allclose(got, expected, atol=2e-3)
    assert fit["C"] == 0.1 and fit["rows"] == len(train)


def test_small_data_chooses_c_on_validation_and_training_blocks_as_scikit_learn_would(tmp_path, monkeypatch):
    """Below CV_MAX_ROWS training rows, each C is scored by the mean AUC over the validation data and
    CV_FOLDS contiguous training blocks, each block by a fit without it; the C chosen is the one scikit-learn's
    regressions, fitted and scored the same way, choose (the path stopping at the first C that scores lower).
    Here the validation rows' labels carry nothing, so validation alone chooses another C."""
    import polars as pl
    from scipy import sparse

    import ctrkit.train.linear_fit as linear_fit
    from ctrkit.bench.panel import write_tabular
    from ctrkit.metrics import roc_auc

    rng = np.random.default_rng(1)
    n = 8000
    ids, x = rng.integers(0, 400, n), rng.normal(size=n)
    effect = rng.normal(size=400) * 0.8
    labels = (rng.random(n) < 1 / (1 + np.exp(1 - effect[ids] - 0.5 * x))).astype(np.uint8)
    labels[-800:] = rng.random(800) < 0.3  # the held-out tail (validation): noise
    frame = pl.DataFrame({"c": ids, "x": x, "label": labels})
    write_tabular(tmp_path / "d", frame, frame[:100], "label", ["c"], ["x"])
    train, validation = split_tail(SplitBinaryDataset(tmp_path / "d", "train"), 0.1)
    cards = SplitBinaryDataset(tmp_path / "d", "train").spec.cardinalities
    cs = (0.003, 0.03, 0.3, 3.0)

    def ours() -> dict:
        shape = {"num_numerical": 1, "cardinalities": cards, "embedding_dim": 4, "numerical_buckets": 0}
        model = create_model("wide_deep", make_config("wide_deep", shape))
        return fit_first_order(model, train, validation, cs=cs)

    tr, va = train.slice(0, len(train)), validation.slice(0, len(validation))
    encoder = OneHotEncoder(categories=[np.arange(c) for c in cards]).fit(tr.categorical.numpy())
    scaler = StandardScaler().fit(tr.numerical.numpy().astype(np.float64))

    def design(b):
        return sparse.hstack([encoder.transform(b.categorical.numpy()),
                              sparse.csr_matrix(scaler.transform(b.numerical.numpy()))]).tocsr()  # fmt: skip

    x_tr, y_tr, x_va, y_va = design(tr), tr.labels.numpy(), design(va), va.labels.numpy()
    m = len(y_tr)
    with_blocks, validation_only = [], []
    for c in cs:
        model = LogisticRegression(C=c, max_iter=5000)
        aucs = [roc_auc(y_va, model.fit(x_tr, y_tr).decision_function(x_va))]
        validation_only.append(aucs[0])
        for f in range(linear_fit.CV_FOLDS):
            held = np.zeros(m, bool)
            held[f * m // linear_fit.CV_FOLDS : (f + 1) * m // linear_fit.CV_FOLDS] = True
            model.fit(x_tr[~held], y_tr[~held])
            aucs.append(roc_auc(y_tr[held], model.decision_function(x_tr[held])))
        with_blocks.append(np.mean(aucs))

    def choice(scores):  # the first peak along the path
        stop = next((i for i in range(1, len(cs)) if scores[i] <= scores[i - 1]), len(cs))
        return cs[int(np.argmax(scores[:stop]))]

    fit = ours()
    assert fit["folds"] == linear_fit.CV_FOLDS and fit["C"] == choice(with_blocks)
    monkeypatch.setattr(linear_fit, "CV_MAX_ROWS", 0)  # validation alone
    alone = ours()
    assert alone["folds"] == 0 and alone["C"] == choice(validation_only) != fit["C"]


def test_the_fit_with_numerical_buckets_is_scikit_learns_on_bucket_indicators(tiny_dataset):
    train, validation = split_tail(SplitBinaryDataset(tiny_dataset, "train"), 0.1)
    torch.manual_seed(0)
    model = tiny_model(tiny_dataset, "wide_deep").eval()
    tr, va = train.slice(0, len(train)), validation.slice(0, len(validation))
    buckets = model.wide_buckets
    counts = buckets.fit(tr.numerical)["buckets"]  # the normaliser is still the identity here
    assert max(counts) > 2
    fit_first_order(model, train, validation, cs=(0.1,), max_iter=500, tolerance=1e-7)
    cards = SplitBinaryDataset(tiny_dataset, "train").spec.cardinalities
    encoder = OneHotEncoder(categories=[np.arange(c) for c in cards]).fit(tr.categorical.numpy())
    scaler = StandardScaler().fit(tr.numerical.numpy().astype(np.float64))
    cuts = buckets.cuts.numpy()
    width = buckets.buckets

    def design(b):
        from scipy import sparse

        x = b.numerical.numpy()
        ids = np.stack([np.searchsorted(cuts[f], x[:, f], side="right") for f in range(x.shape[1])], 1)
        onehot = OneHotEncoder(categories=[np.arange(width)] * x.shape[1]).fit_transform(ids)
        return sparse.hstack([encoder.transform(b.categorical.numpy()), onehot,
                              sparse.csr_matrix(scaler.transform(x))]).tocsr()  # fmt: skip

    reference = LogisticRegression(C=0.1, max_iter=5000, tol=1e-10).fit(design(tr), tr.labels.numpy())
    with torch.no_grad():
        got = model(va.numerical, va.categorical).numpy()
    np.testing.assert_allclose(got, reference.decision_function(design(va)), atol=2e-3)
    assert buckets.weight.abs().max() > 1e-3  # the buckets carry weight in that regression


def test_training_starts_from_the_fit_and_selection_may_keep_it(tiny_dataset, tmp_path):
    from ctrkit.train.trainer import Placement, RunInfo, RunOutputs, TrainData
    from tests.conftest import trainer_of

    torch.manual_seed(0)
    model = tiny_model(tiny_dataset, "wide_deep")
    spec = SplitBinaryDataset(tiny_dataset, "train").spec
    cfg = TrainConfig(epochs=1, batch_size=512, evals_per_epoch=2)
    info, data = RunInfo("wide_deep", model.config, spec.summary()), TrainData(SplitBinaryDataset(tiny_dataset))
    outputs = RunOutputs(log_path=tmp_path / "log.jsonl", progress=False)
    trainer = trainer_of(model, info, data, cfg, Placement(torch.device("cpu")), outputs)
    result = trainer.fit()
    events = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    kinds = [e["event"] for e in events]
    # the numerical inputs' statistics, then the fit, scored at step 0
    assert kinds[1:4] == ["numerical_normalizer", "warm_start", "eval"] and events[3]["step"] == 0
    assert events[2]["validation_auc"] == events[3]["auc"]  # the model at step 0 is exactly the regression
    assert result["best_step"] is not None
    first = [e for e in events if e["event"] == "first_step"]  # once, before the first training record
    assert len(first) == 1 and kinds.index("first_step") < kinds.index("train") and first[0]["step"] == 0
    assert 0 < first[0]["since_start"] < 3600


def test_no_warm_start_without_validation_or_when_off(tiny_dataset, tmp_path):
    from ctrkit.train.trainer import Placement, RunInfo, RunOutputs, TrainData
    from tests.conftest import trainer_of

    spec = SplitBinaryDataset(tiny_dataset, "train").spec
    for cfg in (TrainConfig(max_steps=3, validation_fraction=0.0), TrainConfig(max_steps=3, linear_warm_start=False)):
        model = tiny_model(tiny_dataset)
        log = tmp_path / f"{cfg.validation_fraction}.jsonl"
        info, data = RunInfo("dlrm", model.config, spec.summary()), TrainData(SplitBinaryDataset(tiny_dataset))
        outputs = RunOutputs(log_path=log, progress=False)
        trainer_of(model, info, data, cfg, Placement(torch.device("cpu")), outputs).fit()
        assert "warm_start" not in [json.loads(line)["event"] for line in log.read_text().splitlines()]


def test_multi_hot_fit_is_scikit_learns_within_the_default_iteration_budget(tmp_path):
    """Tags mean-pooled, topics summed: the design the fit builds is the one scikit-learn is given here
    (bag counts, divided by the bag's length for a mean), and the preconditioned L-BFGS reaches its optimum
    within the default 50 iterations (the path of C values warm-starts each fit from the last)."""
    from scipy import sparse

    from tests.models.test_multi_hot_models import build, write_tag_data

    root = write_tag_data(tmp_path)
    train, validation = split_tail(SplitBinaryDataset(root, "train"), 0.1)
    _, model = build("dlrm", SplitBinaryDataset(root, "train").spec)
    fit = fit_first_order(model, train, validation, cs=(0.03, 0.3))
    tr, va = train.slice(0, len(train)), validation.slice(0, len(validation))

    def design(b, mu, sd):
        n = len(b.labels)
        blocks = [sparse.csr_matrix((np.ones(n), (np.arange(n), b.categorical[:, 0].numpy())), shape=(n, 300))]
        mh = b.multi_hot
        for f, (card, mean) in enumerate(((40, True), (1000, False))):
            lo, hi = f * n, (f + 1) * n
            offsets = mh.offsets[lo : hi + 1].numpy()
            lengths = np.diff(offsets)
            ids = mh.ids[offsets[0] : offsets[-1]].numpy()
            rows = np.repeat(np.arange(n), lengths)
            vals = 1.0 / np.repeat(np.maximum(lengths, 1), lengths) if mean else np.ones(len(ids))
            blocks.append(sparse.csr_matrix((vals, (rows, ids)), shape=(n, card)))
        blocks.append(sparse.csr_matrix((b.numerical.numpy().astype(np.float64) - mu) / sd))
        return sparse.hstack(blocks).tocsr()

    num = tr.numerical.numpy().astype(np.float64)
    mu, sd = num.mean(0), num.std(0, ddof=1)
    reference = LogisticRegression(C=fit["C"], max_iter=5000, tol=1e-10).fit(design(tr, mu, sd), tr.labels.numpy())
    expected = reference.decision_function(design(va, mu, sd))
    with torch.no_grad():
        got = model(va.numerical, va.categorical, va.multi_hot).numpy()
    np.testing.assert_allclose(got, expected, atol=2e-3)


def test_the_design_keeps_the_ids_the_fitted_rows_hold_and_the_products_are_the_full_ones():
    from types import SimpleNamespace

    from ctrkit.train.linear_fit import _Design

    cards = [(5, 4)]  # ids 0-4 and 5-8 as columns; training holds 0, 2, 4 and 6, 7 only
    fitted = SimpleNamespace(labels=torch.zeros(3), categorical=torch.tensor([[0, 1], [2, 2], [4, 1]]), multi_hot=None)
    held = SimpleNamespace(labels=torch.zeros(2), categorical=torch.tensor([[1, 1], [3, 0]]), multi_hot=None)
    x_tr = _Design(fitted, cards, (), transpose=True)
    x_va = _Design(held, cards, (), transpose=False, columns=x_tr.columns)
    assert x_tr.shape == (3, 5) and x_va.shape == (2, 5)
    assert x_tr.used.tolist() == [0, 2, 4, 6, 7]
    assert x_va.rows.col_indices().tolist() == [3]  # of the held-out ids only 6 is kept (its place: 3)
    assert x_tr.rows.col_indices().dtype == torch.int32 and x_tr.cols.crow_indices().dtype == torch.int32

    def dense(batch):  # the indicator matrix over every id
        out = torch.zeros(len(batch.labels), 9, dtype=torch.float64)
        for i, row in enumerate(batch.categorical.tolist()):
            out[i, row[0]] += 1
            out[i, 5 + row[1]] += 1
        return out

    w = torch.arange(1.0, 6.0, dtype=torch.float64)  # a weight per kept id
    full = x_tr.expand(w)
    assert full.tolist() == [1, 0, 2, 0, 3, 0, 4, 5, 0]
    torch.testing.assert_close(x_tr @ w, dense(fitted) @ full)
    torch.testing.assert_close(x_va @ w, dense(held) @ full)  # held-out ids outside training count 0
    r = torch.tensor([0.5, -1.0, 2.0], dtype=torch.float64)
    torch.testing.assert_close(x_tr.expand(x_tr.rmatvec(r)), dense(fitted).T @ r)


def test_a_design_with_bags_and_buckets_is_the_dense_indicator_matrix():
    from types import SimpleNamespace

    from ctrkit.train.linear_fit import _Design

    cards = [(3, 2), (4, 5)]  # one-hot ids 0-2 and 3-4; bags of ids 5-8 (summed) and 9-13 (averaged)

    def batch(categorical, bags):  # bags: per multi-hot feature, each row's ids
        n = len(categorical)
        flat = [ids for feature in bags for ids in feature]
        offsets = torch.tensor([0, *np.cumsum([len(b) for b in flat])], dtype=torch.int64)
        multi_hot = SimpleNamespace(offsets=offsets, ids=torch.tensor([i for b in flat for i in b], dtype=torch.int64))
        return SimpleNamespace(labels=torch.zeros(n), categorical=torch.tensor(categorical), multi_hot=multi_hot)

    fitted = batch([[0, 1], [2, 0], [0, 0]], [[[1, 1], [], [3]], [[0], [2, 4, 4], []]])
    held = batch([[1, 1], [2, 0]], [[[0, 3], [2]], [[1], [4]]])
    buckets = (torch.tensor([[0, 3], [1, 3], [0, 2]]), torch.tensor([[2, 3], [1, 2]]))  # 4 more columns

    def dense(b, extra):  # every row's indicators over all 18 columns
        out = torch.zeros(len(b.labels), 18, dtype=torch.float64)
        n, offsets = len(b.labels), b.multi_hot.offsets.tolist()
        for i, row in enumerate(b.categorical.tolist()):
            out[i, row[0]] += 1
            out[i, 3 + row[1]] += 1
            for f, (base, mean) in enumerate(((5, False), (9, True))):
                ids = b.multi_hot.ids[offsets[f * n + i] : offsets[f * n + i + 1]].tolist()
                for j in ids:
                    out[i, base + j] += 1 / len(ids) if mean else 1
            for j in extra[i].tolist():
                out[i, 14 + j] += 1
        return out

    x_tr = _Design(fitted, cards, (False, True), True, buckets[0], 4)
    x_va = _Design(held, cards, (False, True), False, buckets[1], 4, columns=x_tr.columns)
    full_tr, full_va = dense(fitted, buckets[0]), dense(held, buckets[1])
    assert x_tr.used.tolist() == torch.nonzero(full_tr.abs().sum(0)).squeeze(1).tolist()
    w = torch.arange(1.0, len(x_tr.used) + 1, dtype=torch.float64)
    torch.testing.assert_close(x_tr @ w, full_tr @ x_tr.expand(w))
    torch.testing.assert_close(x_va @ w, full_va @ x_va.expand(w))  # held-out ids outside training count 0
    r = torch.tensor([0.5, -1.0, 2.0], dtype=torch.float64)
    torch.testing.assert_close(x_tr.expand(x_tr.rmatvec(r)), full_tr.T @ r)


def test_on_a_shop_log_the_fit_scores_at_least_scikit_learns_tuned_regression_on_the_same_design(tmp_path):
    """An additive click log with multi-valued tags (``synthetic_shop``), a model that sums its tags: the first-order
    fit scores the test rows at least as well as scikit-learn's logistic regression on the same design matrix with
    its C tuned on the validation rows (as ``eval.baselines`` tunes it); and the solver runs on one intra-op thread,
    leaving the process's count as it found it."""
    from scipy import sparse

    from ctrkit.data.synthetic_shop import shop_log
    from ctrkit.eval.baselines import LOGISTIC_C
    from ctrkit.metrics import roc_auc
    from ctrkit.models.registry import create_model, make_config
    from ctrkit.train import linear_fit
    from ctrkit.train.warm_start import fit_normalizer
    from tests.conftest import run_cli

    frame, _ = shop_log(20_000, seed=3, tags="sum")
    frame.write_csv(tmp_path / "log.csv")
    out = tmp_path / "ds"
    assert run_cli("preprocess", "table", tmp_path / "log.csv", "--out", out, "--label", "clicked", "--multi-hot",
                   "tags", "--order-by", "ts", "--integers", "numerical", "--no-progress")[0] == 0  # fmt: skip
    full = SplitBinaryDataset(out, "train")
    train, validation = split_tail(full, 0.1)
    test = SplitBinaryDataset(out, "test").slice(0, len(SplitBinaryDataset(out, "test")))
    spec = full.spec
    shape = {"num_numerical": len(spec.numerical_features), "cardinalities": spec.cardinalities,
             "multi_hot_cardinalities": spec.multi_hot_cardinalities, "multi_hot_combiners": ("sum",)}  # fmt: skip
    torch.manual_seed(0)
    model = create_model("dlrm", make_config("dlrm", shape)).eval()
    fit_normalizer(model, train)
    # the design the fit builds, as scipy matrices: ids and tag counts, then the standardised numbers
    problem = linear_fit._Regression(model, train, validation, linear_fit.WARM_START_ROWS, 50)

    def matrix(design, z):
        r = design.rows
        ids = sparse.csr_matrix((r.values().numpy(), r.col_indices().numpy(), r.crow_indices().numpy()),
                                shape=design.shape)  # fmt: skip
        return sparse.hstack([ids, sparse.csr_matrix(z.numpy())]).tocsr()

    x_test = problem._design(test, transpose=False, columns=problem.x_tr.columns)
    z_test = (model.numerical_norm(test.numerical).double() - problem.mu) / problem.sd
    x_tr, x_va, x_te = matrix(problem.x_tr, problem.z_tr), matrix(problem.x_va, problem.z_va), matrix(x_test, z_test)
    fits = [LogisticRegression(C=c, max_iter=2000).fit(x_tr, problem.y_tr.numpy()) for c in LOGISTIC_C]
    tuned = max(fits, key=lambda m: roc_auc(problem.y_va, m.decision_function(x_va)))
    reference = roc_auc(test.labels.numpy(), tuned.decision_function(x_te))
    seen = []
    solve = linear_fit._Regression.solve

    def counted(self, *args):
        seen.append(torch.get_num_threads())
        return solve(self, *args)

    before = torch.get_num_threads()
    linear_fit._Regression.solve = counted
    try:
        fit_first_order(model, train, validation)
    finally:
        linear_fit._Regression.solve = solve
    assert set(seen) == {1} and torch.get_num_threads() == before
    with torch.no_grad():
        ours = roc_auc(test.labels.numpy(), model(test.numerical, test.categorical, test.multi_hot).numpy())
    assert ours >= reference - 0.001, (ours, reference)
