"""The gate: a candidate and the served model scored on the same held-out rows (TFX's Evaluator against the last
blessed model), each difference with a paired bootstrap interval, and the blessing: published unless the candidate
is worse beyond a tolerance with confidence."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ctrkit.metrics import roc_auc

EPS = 1e-7


def log_loss(labels: np.ndarray, p: np.ndarray) -> float:
    """Mean binary cross-entropy of probabilities ``p`` (clipped to [EPS, 1 - EPS])."""
    q = np.clip(np.asarray(p, np.float64), EPS, 1 - EPS)
    y = np.asarray(labels, np.float64)
    return float(-np.mean(y * np.log(q) + (1 - y) * np.log1p(-q)))


def calibration(labels: np.ndarray, p: np.ndarray) -> float:
    """Mean prediction over click rate (1: calibrated on the whole; NaN without clicks)."""
    rate = float(np.mean(labels))
    return float(np.mean(p)) / rate if rate > 0 else float("nan")


@dataclass(frozen=True)
class Scores:
    """A model's figures on a set of rows: AUC, log loss and calibration (mean prediction / click rate)."""

    auc: float
    logloss: float
    calibration: float

    @classmethod
    def of(cls, labels: np.ndarray, p: np.ndarray) -> Scores:
        return cls(roc_auc(labels, p), log_loss(labels, p), calibration(labels, p))

    def as_dict(self) -> dict[str, float | None]:
        return {k: (round(v, 6) if math.isfinite(v) else None) for k, v in asdict(self).items()}


@dataclass(frozen=True)
class Gate:
    """The candidate against the served model on ``rows`` held-out rows: both models' ``Scores``, the candidate's AUC
    and log loss minus the served model's with 95% paired-bootstrap intervals (``auc_interval``,
    ``logloss_interval``), the tolerances, and the verdict ``blessed`` with its ``reason``."""

    rows: int
    served: Scores
    candidate: Scores
    auc_gain: float
    auc_interval: tuple[float, float]
    logloss_gain: float
    logloss_interval: tuple[float, float]
    auc_tolerance: float
    logloss_tolerance: float
    blessed: bool
    reason: str

    def as_dict(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["served"], doc["candidate"] = self.served.as_dict(), self.candidate.as_dict()
        return doc


def _paired_bootstrap(labels: np.ndarray, served: np.ndarray, candidate: np.ndarray, rounds: int, seed: int
                      ) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """``rounds`` resamples of the rows (with replacement): each one's AUC and log loss differences (candidate minus
    served; a resample of one class left out)."""
    rng = np.random.default_rng(seed)
    n = len(labels)
    auc, loss = [], []
    ll_s = -(labels * np.log(served) + (1 - labels) * np.log1p(-served))
    ll_c = -(labels * np.log(candidate) + (1 - labels) * np.log1p(-candidate))
    for _ in range(rounds):
        idx = rng.integers(0, n, n)
        y = labels[idx]
        if 0 < y.sum() < n:
            auc.append(roc_auc(y, candidate[idx]) - roc_auc(y, served[idx]))
        loss.append(float(ll_c[idx].mean() - ll_s[idx].mean()))
    return np.asarray(auc), np.asarray(loss)


def compare(labels: np.ndarray, served: np.ndarray, candidate: np.ndarray, auc_tolerance: float,
            logloss_tolerance: float, rounds: int = 200, seed: int = 0) -> Gate:  # fmt: skip
    """The gate on held-out rows with 0/1 ``labels``: the ``served`` and ``candidate`` probabilities. The candidate is
    kept out when its AUC is below the served model's by more than ``auc_tolerance`` even at the top of the interval,
    or its log loss above by more than ``logloss_tolerance`` even at the bottom; else blessed."""
    y = np.asarray(labels, np.float64)
    s = np.clip(np.asarray(served, np.float64), EPS, 1 - EPS)
    c = np.clip(np.asarray(candidate, np.float64), EPS, 1 - EPS)
    if not 0 < y.sum() < len(y):
        raise ValueError(f"the held-out rows ({len(y):,}) hold one class only: no AUC to compare models on; hold out "
                         "more rows (--holdout-fraction)")  # fmt: skip
    before, after = Scores.of(y, s), Scores.of(y, c)
    auc_d, loss_d = _paired_bootstrap(y, s, c, rounds, seed)
    auc_iv = (float(np.quantile(auc_d, 0.025)), float(np.quantile(auc_d, 0.975)))
    loss_iv = (float(np.quantile(loss_d, 0.025)), float(np.quantile(loss_d, 0.975)))
    auc_gain, loss_gain = after.auc - before.auc, after.logloss - before.logloss
    worse = []
    if auc_iv[1] < -auc_tolerance:
        worse.append(f"AUC {after.auc:.4f} against the served model's {before.auc:.4f} ({auc_gain:+.4f}, 95% "
                     f"interval {auc_iv[0]:+.4f} to {auc_iv[1]:+.4f}, tolerance {auc_tolerance:g})")  # fmt: skip
    if loss_iv[0] > logloss_tolerance:
        worse.append(f"log loss {after.logloss:.4f} against {before.logloss:.4f} ({loss_gain:+.4f}, 95% interval "
                     f"{loss_iv[0]:+.4f} to {loss_iv[1]:+.4f}, tolerance {logloss_tolerance:g})")  # fmt: skip
    if worse:
        reason = "the candidate is worse on the held-out rows: " + "; ".join(worse)
    else:
        reason = (f"the candidate is not worse on {len(y):,} held-out rows: AUC {after.auc:.4f} against "
                  f"{before.auc:.4f} ({auc_gain:+.4f}, 95% interval {auc_iv[0]:+.4f} to {auc_iv[1]:+.4f}), log loss "
                  f"{after.logloss:.4f} against {before.logloss:.4f}")  # fmt: skip
    return Gate(len(y), before, after, round(auc_gain, 6), (round(auc_iv[0], 6), round(auc_iv[1], 6)),
                round(loss_gain, 6), (round(loss_iv[0], 6), round(loss_iv[1], 6)), auc_tolerance, logloss_tolerance,
                not worse, reason)  # fmt: skip
