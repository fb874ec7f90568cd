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
    fit = fit_first_order(model, train, validation, cs=(0.1,), max_iter=500)
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


def test_training_starts_from_the_fit_and_selection_may_keep_it(tiny_dataset, tmp_path):
    from ctrkit.train.trainer import RunInfo, Trainer

    torch.manual_seed(0)
    model = tiny_model(tiny_dataset, "wide_deep")
    spec = SplitBinaryDataset(tiny_dataset, "train").spec
    cfg = TrainConfig(epochs=1, batch_size=512, evals_per_epoch=2)
    trainer = Trainer(model, RunInfo("wide_deep", model.config, spec.summary()), SplitBinaryDataset(tiny_dataset),
                      None, cfg, torch.device("cpu"), log_path=tmp_path / "log.jsonl", progress=False)  # fmt: skip
    result = trainer.fit()
    events = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    kinds = [e["event"] for e in events]
    assert kinds[1:3] == ["warm_start", "eval"] and events[2]["step"] == 0  # the fit, scored at step 0
    assert events[1]["validation_auc"] == events[2]["auc"]  # the model at step 0 is exactly the regression
    assert result["best_step"] is not None


def test_no_warm_start_without_validation_or_when_off(tiny_dataset, tmp_path):
    from ctrkit.train.trainer import RunInfo, Trainer

    spec = SplitBinaryDataset(tiny_dataset, "train").spec
    for cfg in (TrainConfig(max_steps=3, validation_fraction=0.0), TrainConfig(max_steps=3, linear_warm_start=False)):
        model = tiny_model(tiny_dataset)
        log = tmp_path / f"{cfg.validation_fraction}.jsonl"
        Trainer(model, RunInfo("dlrm", model.config, spec.summary()), SplitBinaryDataset(tiny_dataset), None, cfg,
                torch.device("cpu"), log_path=log, progress=False).fit()  # fmt: skip
        assert "warm_start" not in [json.loads(line)["event"] for line in log.read_text().splitlines()]
