"""How each multi-valued column's values combine their effects: a held-out test that chooses each multi-hot feature's
pooling, sum or mean (``preprocess table --combiner auto``), written to the feature spec that the models read.

A row's tags may each move the odds by their own amount however many there are (the clicks add their effects: pool by
sum), or describe the item together, so that a long list does not add up (the clicks average them: pool by mean).
Pooled the other way, every model of the panel lost about 0.012 test AUC (docs/decisions/multi-hot-pooling.md). So
``auto`` asks the training rows:

* model A, ``value_ids.additive_logits``: an additive logistic regression of the table's categorical ids and 16
  quantile buckets of each numerical column, fitted on the fit rows;
* per multi-hot feature and pooling, one weight per id on top of A's logits (A fixed): the row's logit is A's plus
  the sum of its ids' weights, or their mean, fitted by a majorise-minimise Newton iteration (each id's step its
  gradient over a bound of the Hessian's diagonal, so every step lowers the penalised loss);

scored by log loss on the held-out rows (the tail the trainer holds out for validation, or the validation mapping).
The pooling with the lower mean held-out log loss is chosen; with fewer than ``value_ids.MIN_HELD_OUT`` held-out rows
the test has no power and the feature keeps ``DEFAULT``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ctrkit.preprocess.value_ids import MIN_HELD_OUT, RIDGE, additive_logits, bucket_index, row_log_loss

COMBINERS = ("sum", "mean")
DEFAULT = "mean"  # where the test has no power
STEPS = 100  # majorise-minimise steps at most per feature and pooling
TOLERANCE = 1e-6  # ... until no weight moves by more


@dataclass(frozen=True)
class PoolingTest:
    """One multi-hot feature's result: the mean held-out log loss under each pooling (nats per row), its standard
    error of the per-row differences, the pooling chosen and the held-out rows it was tested on (fewer than
    ``MIN_HELD_OUT``: not tested, ``DEFAULT`` kept, no losses)."""

    sum: float
    mean: float
    stderr: float
    chosen: str
    held_out: int

    @property
    def tested(self) -> bool:
        return self.held_out >= MIN_HELD_OUT

    def as_dict(self) -> dict:
        return {"sum": round(self.sum, 6), "mean": round(self.mean, 6), "stderr": round(self.stderr, 6),
                "chosen": self.chosen, "held_out": self.held_out, "tested": self.tested}  # fmt: skip


@dataclass(frozen=True)
class Bags:
    """One multi-hot feature's rows: each row's ids, flat, and how many a row holds."""

    ids: np.ndarray
    lengths: np.ndarray

    def rows(self) -> np.ndarray:
        return np.repeat(np.arange(len(self.lengths)), self.lengths)

    def values(self, pooling: str) -> np.ndarray:
        """Each id's value in its row's pooled logit: 1 (sum) or one over the row's length (mean)."""
        if pooling == "sum":
            return np.ones(len(self.ids))
        return 1.0 / np.repeat(np.maximum(self.lengths, 1), self.lengths).astype(np.float64)


def fit_bag_weights(z: np.ndarray, bags: Bags, y: np.ndarray, k: int, pooling: str) -> np.ndarray:
    """(k,) the weights ``w`` minimising sum_i logloss(z_i + sum_j v_ij w_ids_ij, y_i) + RIDGE / 2 * |w|^2, v the
    ``pooling``'s values: each step moves every weight by its gradient over a bound of its Hessian diagonal (by
    Cauchy-Schwarz, a row of m ids counts m times), so the loss never rises."""
    rows, values = bags.rows(), bags.values(pooling)
    weight = np.repeat(bags.lengths, bags.lengths) * values**2  # m_i * v_ij^2 per entry
    w = np.zeros(k)
    for _ in range(STEPS):
        logit = z + np.bincount(rows, values * w[bags.ids], len(z))
        p = 1.0 / (1.0 + np.exp(-logit))
        grad = np.bincount(bags.ids, values * (y - p)[rows], k) - RIDGE * w
        bound = np.bincount(bags.ids, weight * (p * (1 - p))[rows], k) + RIDGE
        step = grad / bound
        w += step
        if np.abs(step).max() < TOLERANCE:
            break
    return w


def pooling_tests(
    categorical: Sequence[tuple[np.ndarray, np.ndarray, int]], numerical: Sequence[tuple[np.ndarray, np.ndarray]],
    multi_hot: dict[str, tuple[Bags, Bags, int]], y_fit: np.ndarray, y_held: np.ndarray,
) -> dict[str, PoolingTest]:  # fmt: skip
    """Tests each feature of ``multi_hot`` (name -> its fit rows' and held-out rows' bags, cardinality) on top of
    model A of ``categorical`` (ids of the fit and held-out rows, cardinality) and ``numerical`` (values of the fit
    and held-out rows); see the module's docstring."""
    if not multi_hot:  # nothing to decide: model A is not fitted
        return {}
    y_fit, y_held = np.asarray(y_fit, np.float64), np.asarray(y_held, np.float64)
    if len(y_held) < MIN_HELD_OUT or len(y_fit) == 0:
        return {f: PoolingTest(0.0, 0.0, 0.0, DEFAULT, len(y_held)) for f in multi_hot}
    blocks = [(np.asarray(f, np.int64), np.asarray(h, np.int64), k) for f, h, k in categorical]
    blocks += [bucket_index(np.asarray(x, np.float64), np.asarray(h, np.float64)) for x, h in numerical]
    z_fit, z_held = additive_logits(blocks, y_fit)
    out = {}
    for name, (fit, held, k) in multi_hot.items():
        losses = {}
        for pooling in COMBINERS:
            w = fit_bag_weights(z_fit, fit, y_fit, k, pooling)
            logit = z_held + np.bincount(held.rows(), held.values(pooling) * w[held.ids], len(z_held))
            losses[pooling] = row_log_loss(logit, y_held)
        diff = losses["mean"] - losses["sum"]  # > 0: the sum predicts the held-out rows better
        chosen = "sum" if diff.mean() > 0 else "mean"
        out[name] = PoolingTest(float(losses["sum"].mean()), float(losses["mean"].mean()),
                                float(diff.std() / np.sqrt(len(diff))), chosen, len(y_held))  # fmt: skip
    return out
