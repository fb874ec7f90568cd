"""The baselines a CTR model must beat, fitted on exactly the model's split and features.

* Logistic regression (scikit-learn): one-hot categorical ids (multi-hot bags as indicator sums), the
  numerical features standardised; the L2 strength C chosen on the validation data.
* Gradient-boosted trees (LightGBM): numerical features as they are, categorical ids as LightGBM
  categorical features (multi-hot bags as per-id indicator columns), early stopping on validation.

Both read the same datasets (``SplitBinaryDataset`` or a held-out ``DatasetRange``) the trainer reads.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import sparse

from ctrkit.metrics import log_loss_from_logits, roc_auc

LOGISTIC_C = (0.003, 0.01, 0.03, 0.1, 0.3, 1.0)


@dataclass
class Table:
    """A dataset as arrays: numerical (N, Fn) float32, one-hot ids (N, F) int64, multi-hot bags as a
    CSR indicator matrix per feature, labels (N,)."""

    numerical: np.ndarray
    categorical: np.ndarray
    multi_hot: list[sparse.csr_matrix]
    labels: np.ndarray


def read_table(dataset) -> Table:
    """The whole of ``dataset`` as arrays."""
    batch = dataset.slice(0, len(dataset))
    n = len(dataset)
    numerical = batch.numerical.numpy() if batch.numerical is not None else np.zeros((n, 0), np.float32)
    bags = []
    if batch.multi_hot is not None:
        mh = batch.multi_hot
        offsets, ids = mh.offsets.numpy(), mh.ids.numpy()
        cards = dataset.spec.multi_hot_cardinalities
        for f in range(mh.num_features):  # feature-major bags: feature f's are bags f*n .. (f+1)*n
            lo, hi = offsets[f * n], offsets[(f + 1) * n]
            indptr = offsets[f * n : (f + 1) * n + 1] - lo
            data = np.ones(hi - lo, np.float32)
            bags.append(sparse.csr_matrix((data, ids[lo:hi], indptr), shape=(n, cards[f])))
    return Table(numerical, batch.categorical.numpy(), bags, batch.labels.numpy())


def _metrics(labels: np.ndarray, logits: np.ndarray) -> dict[str, float]:
    return {"auc": roc_auc(labels, logits), "logloss": log_loss_from_logits(labels, logits)}


def logistic_regression(train, validation, test, cs: tuple[float, ...] = LOGISTIC_C) -> dict[str, Any]:
    """Logistic regression on one-hot ids + standardised numericals; C picked by validation AUC."""
    start = time.perf_counter()
    fitted = fit_logistic(read_table(train), read_table(validation), cs)
    te = read_table(test)
    return {
        **_metrics(te.labels, fitted.logits(te)),
        "validation_auc": fitted.validation_auc,
        "chosen": {"C": fitted.c},
        "seconds": time.perf_counter() - start,
    }


@dataclass
class Logistic:
    """A fitted ``fit_logistic``: the one-hot encoder, the scaler, the model, its C and validation AUC."""

    encoder: Any
    scaler: Any
    model: Any
    c: float
    validation_auc: float

    def design(self, t: Table) -> sparse.csr_matrix:
        """The design matrix of ``t`` (a data set may lack either kind of feature)."""
        parts = [*([self.encoder.transform(t.categorical)] if self.encoder is not None else []), *t.multi_hot]
        if self.scaler is not None:
            parts.append(sparse.csr_matrix(self.scaler.transform(t.numerical)))
        return sparse.hstack(parts, format="csr")

    def logits(self, t: Table) -> np.ndarray:
        return self.model.decision_function(self.design(t))


def fit_logistic(tr: Table, va: Table, cs: tuple[float, ...] = LOGISTIC_C) -> Logistic:
    """``logistic_regression``'s fit on tables: one per C of ``cs`` on ``tr``, the best by AUC on ``va`` kept."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import OneHotEncoder, StandardScaler

    encoder = None
    if tr.categorical.shape[1]:
        encoder = OneHotEncoder(handle_unknown="ignore", min_frequency=None).fit(tr.categorical)
    scaler = StandardScaler().fit(tr.numerical) if tr.numerical.shape[1] else None
    fitted = Logistic(encoder, scaler, None, 0.0, -np.inf)
    x_tr, x_va = fitted.design(tr), fitted.design(va)
    for c in cs:
        model = LogisticRegression(C=c, max_iter=2000, solver="lbfgs").fit(x_tr, tr.labels)
        auc = roc_auc(va.labels, model.decision_function(x_va))
        if auc > fitted.validation_auc:
            fitted.model, fitted.c, fitted.validation_auc = model, c, auc
    return fitted


def gradient_boosted_trees(train, validation, test, seed: int = 0) -> dict[str, Any]:
    """LightGBM with categorical ids, early stopping on validation log loss."""
    import lightgbm as lgb

    start = time.perf_counter()
    tr, va, te = read_table(train), read_table(validation), read_table(test)

    def design(t: Table) -> np.ndarray:
        dense_bags = [b.toarray() for b in t.multi_hot]
        return np.hstack([t.numerical, t.categorical.astype(np.float32), *dense_bags]).astype(np.float32)

    n_num, n_cat = tr.numerical.shape[1], tr.categorical.shape[1]
    categorical = list(range(n_num, n_num + n_cat))
    params = {
        "objective": "binary",
        "learning_rate": 0.05,
        "num_leaves": 31,
        "min_data_in_leaf": 20,
        "feature_fraction": 0.8,
        "bagging_fraction": 0.8,
        "bagging_freq": 1,
        "cat_smooth": 10,
        "cat_l2": 10,
        "max_cat_to_onehot": 8,
        "seed": seed,
        "deterministic": True,
        "num_threads": 2,
        "verbose": -1,
    }
    dtrain = lgb.Dataset(design(tr), tr.labels, categorical_feature=categorical, free_raw_data=False)
    dvalid = lgb.Dataset(design(va), va.labels, reference=dtrain, categorical_feature=categorical)
    booster = lgb.train(params, dtrain, num_boost_round=2000, valid_sets=[dvalid],
                        callbacks=[lgb.early_stopping(50, verbose=False)])  # fmt: skip
    logits = np.asarray(booster.predict(design(te), num_iteration=booster.best_iteration, raw_score=True))
    valid_logits = np.asarray(booster.predict(design(va), num_iteration=booster.best_iteration, raw_score=True))
    return {
        **_metrics(te.labels, logits),
        "validation_auc": roc_auc(va.labels, valid_logits),
        "chosen": {"rounds": int(booster.best_iteration)},
        "seconds": time.perf_counter() - start,
    }
