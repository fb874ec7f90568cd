"""Which numerical columns are also worth an id per exact value: a held-out test, one column at a time.

A number can identify something: a household's income repeated in each of its rows, a code stored as a
number. Trees recognise such a value by splitting on it; an embedding model sees it only as a position on
a scale, unless the value is also a categorical feature (``preprocess table --also-categorical``). Given
to every numerical column blindly, ids hurt (a year the test rows never saw, counts that overfit, a score
that only repeats a person id the table has already: docs/decisions/also-categorical.md). So
``also_categorical="auto"`` asks the training rows:

* model A, additive logistic regression on everything the table already has: one weight per id of each
  categorical feature and one per quantile bucket (16) of each numerical column, fitted by block
  coordinate descent (each feature's weights by Newton's method with the others fixed), with an L2
  penalty (``RIDGE``) on every weight but the bias;
* for each numerical column, model B: A's logits plus one offset per exact value of the column seen at
  least ``frequency_threshold`` times (the id's own rule), fitted the same way with A fixed;

fitted on the fit rows and scored by log loss on the held-out rows (the tail the trainer holds out for
validation, or the validation mapping). A column is chosen when B's mean held-out log loss is lower than
A's by at least ``MIN_GAIN`` nats per row and by ``MIN_Z`` standard errors of the per-row differences: a
material effect, not one of many columns' noise.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

BUCKETS = 16  # quantile buckets per numerical column in model A (the models' first-order term has at most as many)
RIDGE = 1.0  # L2 on every weight but the bias (a prior of standard deviation 1 on the logit scale)
MIN_GAIN = 0.005  # nats per held-out row
MIN_Z = 3.0  # standard errors of the per-row log-loss differences
MIN_HELD_OUT = 200  # fewer held-out rows: no column is chosen (the test has no power)
MAX_FIT_ROWS = 1 << 19  # model A and B are fitted on at most the last this many fit rows
SWEEPS = 6  # block coordinate descent sweeps over model A's features
NEWTON_STEPS = 60  # at most, per offset fit of model B (model A takes 3 per block and sweep, each from the last)
MAX_STEP = 2.0  # largest change of one weight per Newton step (a value whose rows all click starts far off)


@dataclass(frozen=True)
class ValueIdTest:
    """One column's result: mean held-out log-loss gain of B over A (nats per row), its standard error,
    the values B gave an offset, and the fraction of held-out rows holding one of them."""

    gain: float
    stderr: float
    values: int
    covered: float

    @property
    def chosen(self) -> bool:
        return self.gain >= MIN_GAIN and self.gain >= MIN_Z * self.stderr

    def as_dict(self) -> dict:
        return {"gain": round(self.gain, 6), "stderr": round(self.stderr, 6), "values": self.values,
                "covered": round(self.covered, 4), "chosen": self.chosen}  # fmt: skip


def fit_offsets(
    z: np.ndarray, index: np.ndarray, y: np.ndarray, k: int, start: np.ndarray | None = None,
    steps: int = NEWTON_STEPS, ridge: float = RIDGE,
) -> np.ndarray:  # fmt: skip
    """(k,) the offsets ``b`` minimising sum_i logloss(z_i + b[index_i], y_i) + ridge / 2 * |b|^2: Newton's
    method from ``start`` (zeros), exact per value (the Hessian is diagonal: each row has one offset), each
    step at most ``MAX_STEP``."""
    offsets = np.zeros(k) if start is None else start.copy()
    for _ in range(steps):
        p = 1.0 / (1.0 + np.exp(-(z + offsets[index])))
        grad = np.bincount(index, y - p, k) - ridge * offsets
        hess = np.bincount(index, p * (1 - p), k) + ridge
        step = np.clip(grad / hess, -MAX_STEP, MAX_STEP)
        offsets += step
        if np.abs(step).max() < 1e-9:
            break
    return offsets


def row_log_loss(z: np.ndarray, y: np.ndarray) -> np.ndarray:
    return np.logaddexp(0.0, z) - y * z


def _keys(x: np.ndarray) -> np.ndarray:
    return np.nan_to_num(np.asarray(x, np.float64), nan=np.inf)  # missing: a value of its own, above every number


def bucket_index(x_fit: np.ndarray, x_held: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """Each row's quantile bucket (``BUCKETS`` at most, cut at the fit rows' quantiles): fit, held-out, count."""
    key_fit, key_held = _keys(x_fit), _keys(x_held)
    cuts = np.unique(np.quantile(key_fit, np.arange(1, BUCKETS) / BUCKETS, method="lower"))
    return np.searchsorted(cuts, key_fit, "right"), np.searchsorted(cuts, key_held, "right"), len(cuts) + 1


def additive_logits(
    blocks: Sequence[tuple[np.ndarray, np.ndarray, int]], y_fit: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Model A: additive logistic regression with one weight per index of each block (fit index, held-out
    index, count), a bias, and ``RIDGE`` on the block weights; its logits on the fit and held-out rows."""
    mean = float(np.clip(y_fit.mean(), 1e-6, 1 - 1e-6))
    bias = np.log(mean / (1 - mean))
    weights = [np.zeros(k) for _, _, k in blocks]
    z = np.full(len(y_fit), bias)
    for _ in range(SWEEPS):
        for j, (index, _, k) in enumerate(blocks):
            rest = z - weights[j][index]
            weights[j] = fit_offsets(rest, index, y_fit, k, weights[j], steps=3)
            z = rest + weights[j][index]
        zero = np.zeros(len(y_fit), dtype=np.int64)
        shift = fit_offsets(z, zero, y_fit, 1, steps=3, ridge=0.0)[0]  # the bias, unpenalised
        z, bias = z + shift, bias + shift
    n_held = len(blocks[0][1]) if blocks else 0
    z_held = np.full(n_held, bias)
    for (_, held, _), w in zip(blocks, weights):
        z_held = z_held + w[held]
    return z, z_held


def value_id_tests(
    numerical: dict[str, tuple[np.ndarray, np.ndarray]], categorical: Sequence[tuple[np.ndarray, np.ndarray, int]],
    y_fit: np.ndarray, y_held: np.ndarray, frequency_threshold: int,
) -> dict[str, ValueIdTest]:  # fmt: skip
    """Tests every column of ``numerical`` (name -> float64 values of the fit and held-out rows, NaN for
    missing) against model A built from ``categorical`` (the table's ids: fit, held-out, cardinality) and
    the numerical columns' buckets; see the module's docstring."""
    y_fit, y_held = np.asarray(y_fit, np.float64), np.asarray(y_held, np.float64)
    if len(y_held) < MIN_HELD_OUT or len(y_fit) == 0:
        return {c: ValueIdTest(0.0, 0.0, 0, 0.0) for c in numerical}
    start = max(0, len(y_fit) - MAX_FIT_ROWS)
    y_fit = y_fit[start:]
    numerical = {c: (x[start:], h) for c, (x, h) in numerical.items()}
    blocks = [(np.asarray(f[start:], np.int64), np.asarray(h, np.int64), k) for f, h, k in categorical]
    blocks += [bucket_index(x, h) for x, h in numerical.values()]
    z_fit, z_held = additive_logits(blocks, y_fit)
    base = row_log_loss(z_held, y_held)
    out = {}
    for c, (x_fit, x_held) in numerical.items():
        key_fit, key_held = _keys(x_fit), _keys(x_held)
        values, index, counts = np.unique(key_fit, return_inverse=True, return_counts=True)
        kept = counts >= frequency_threshold
        offsets = fit_offsets(z_fit, index, y_fit, len(values))
        offsets[~kept] = 0.0
        place = np.clip(np.searchsorted(values, key_held), 0, len(values) - 1)
        hit = (values[place] == key_held) & kept[place]
        diff = base - row_log_loss(z_held + np.where(hit, offsets[place], 0.0), y_held)
        out[c] = ValueIdTest(float(diff.mean()), float(diff.std() / np.sqrt(len(diff))), int(kept.sum()),
                             float(hit.mean()))  # fmt: skip
    return out
