"""Post-hoc calibration of the kept model: its logit multiplied by one number fitted on validation data
(temperature scaling).

Why: model selection keeps the weights with the best validation AUC, which says nothing of how confident
the probabilities are; a model kept past the point where its log loss was best is overconfident
(docs/decisions/calibration.md).
``a * logit`` with ``a > 0`` leaves every ranking, so AUC and MAP, as they were, and moves only the
probabilities. The scale is applied where the validation data say it helps: a likelihood-ratio test against
no scaling (``TrainConfig.calibrate``). A shift of the logit as well (Platt scaling) was measured and not
kept: on time-ordered splits it chased validation's click rate, which the test's did not share
(docs/decisions/calibration.md).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

# chi-square with 1 degree of freedom at 99%: the validation log-likelihood gain (x2) a fitted scale must
# reach to be applied under ``calibrate="auto"``
LR_TEST_THRESHOLD = 6.63
_MIN_SCALE = 1e-3  # a scale the fit never goes below (a positive scale keeps the ranking)


def _loss(z: np.ndarray, y: np.ndarray, a: float, prior: float = 0.0) -> float:
    s = a * z
    return float(np.mean(np.logaddexp(0.0, s) - y * s) + 0.5 * prior * (a - 1.0) ** 2)


def fit_scale(logits: np.ndarray, labels: np.ndarray, max_iter: int = 100) -> tuple[float, float, float]:
    """The scale ``a`` minimising the mean log loss of ``sigmoid(a * logits)`` against ``labels`` (Newton's
    method with a backtracking line search, float64), with a prior of one observation's weight pulling it
    toward 1 (so the optimum is finite even where validation is separable).

    Returns ``(a, log loss before, log loss after)``: mean log losses on the data, without the prior.
    """
    z, y = np.asarray(logits, np.float64), np.asarray(labels, np.float64)
    if len(z) == 0:
        return 1.0, float("nan"), float("nan")
    prior = 1.0 / len(z)
    a, current = 1.0, _loss(z, y, 1.0, prior)
    for _ in range(max_iter):
        p = 0.5 * (1.0 + np.tanh(0.5 * a * z))  # sigmoid without overflow
        grad = float(np.mean((p - y) * z)) + prior * (a - 1.0)
        hess = float(np.mean(p * (1.0 - p) * z * z)) + prior
        step, t = grad / hess, 1.0
        while t > 1e-8:
            trial = max(a - t * step, _MIN_SCALE)
            value = _loss(z, y, trial, prior)
            if value <= current - 1e-4 * t * grad * step:
                break
            t *= 0.5
        else:
            break
        done = abs(current - value) < 1e-13
        a, current = trial, value
        if done:
            break
    return a, _loss(z, y, 1.0), _loss(z, y, a)


def choose_calibration(logits: np.ndarray, labels: np.ndarray, mode: str) -> tuple[float | None, dict[str, Any]]:
    """The logit scale a run keeps under ``mode`` ("auto": where the fit passes a likelihood-ratio test
    against no scaling at 99%, "on": always, "off": never; None: none) and the log's record of the fit."""
    if mode == "off" or len(logits) == 0:
        return None, {}
    scale, before, after = fit_scale(logits, labels)
    statistic = 2.0 * len(logits) * (before - after)  # the likelihood-ratio statistic, 1 degree of freedom
    applied = mode == "on" or statistic > LR_TEST_THRESHOLD
    record = {"scale": scale, "applied": bool(applied), "logloss_before": before, "logloss_after": after,
              "lr_statistic": statistic}  # fmt: skip
    return (scale if applied else None), record


def calibrated(logits: np.ndarray, scale: float | None) -> np.ndarray:
    """``logits`` (N,) times ``scale`` (computed in float64, float32 out); as they are for None."""
    if scale is None:
        return logits
    return (float(scale) * np.asarray(logits, np.float64)).astype(np.float32)


def check_scale(scale: Any, where: str) -> float | None:
    """A stored calibration scale, checked: None, or a positive finite number."""
    if scale is None:
        return None
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"{where}: the calibration scale must be a positive finite number, got {scale!r}")
    return float(scale)
