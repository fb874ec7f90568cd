"""The logit scale fitted on validation (``calibration.py``): against scikit-learn's logistic regression of
the labels on the logit, on planted over- and underconfidence, on separable data, and the auto rule."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import log_loss, roc_auc_score

from ctrkit.calibration import LR_TEST_THRESHOLD, calibrated, check_scale, choose_calibration, fit_scale


def planted(n: int, confidence: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Labels drawn from sigmoid(t) and the logits ``confidence * t`` of a model over- (> 1) or underconfident
    (< 1) by that factor."""
    rng = np.random.default_rng(seed)
    t = rng.normal(0.0, 1.5, n) - 1.0
    y = (rng.random(n) < 1 / (1 + np.exp(-t))).astype(np.float32)
    return (confidence * t).astype(np.float32), y


@pytest.mark.parametrize("confidence", [0.5, 1.0, 3.0])
def test_the_scale_is_scikit_learns_regression_coefficient(confidence):
    z, y = planted(20_000, confidence)
    scale, before, after = fit_scale(z, y)
    reference = LogisticRegression(fit_intercept=False, C=1e6, tol=1e-10, max_iter=1000).fit(z[:, None], y)
    assert scale == pytest.approx(reference.coef_[0, 0], rel=1e-3)
    assert scale == pytest.approx(1 / confidence, rel=0.05)  # the planted factor undone
    p = 1 / (1 + np.exp(-z.astype(np.float64)))
    assert before == pytest.approx(log_loss(y, p), rel=1e-6)
    assert after == pytest.approx(log_loss(y, 1 / (1 + np.exp(-scale * z.astype(np.float64)))), rel=1e-6)
    assert after <= before


def test_calibrated_logits_keep_the_ranking():
    z, y = planted(5_000, 3.0)
    scale, _, _ = fit_scale(z, y)
    out = calibrated(z, scale)
    assert out.dtype == np.float32 and roc_auc_score(y, out) == roc_auc_score(y, z)
    assert calibrated(z, None) is z


def test_separable_validation_gives_a_finite_scale():
    z = np.array([-3.0, -2.0, -1.0, 1.0, 2.0, 3.0], np.float32)
    y = (z > 0).astype(np.float32)
    scale, before, after = fit_scale(z, y)
    assert np.isfinite(scale) and scale > 1 and after < before  # sharper, held back by the prior


def test_auto_keeps_a_scale_only_where_validation_says_it_helps():
    over, y = planted(3_000, 3.0)
    scale, record = choose_calibration(over, y, "auto")
    assert record["applied"] and scale == record["scale"] and record["lr_statistic"] > LR_TEST_THRESHOLD
    assert record["lr_statistic"] == pytest.approx(2 * len(y) * (record["logloss_before"] - record["logloss_after"]))
    right, y = planted(3_000, 1.0, seed=1)
    scale, record = choose_calibration(right, y, "auto")
    assert scale is None and not record["applied"] and record["lr_statistic"] < LR_TEST_THRESHOLD
    scale, record = choose_calibration(right, y, "on")
    assert scale == record["scale"] and record["applied"]
    assert choose_calibration(over, y, "off") == (None, {})


def test_a_stored_scale_is_checked():
    assert check_scale(None, "x") is None and check_scale(2, "x") == 2.0
    for bad in (0.0, -1.0, float("nan"), float("inf"), True, "1"):
        with pytest.raises(ValueError, match="x: the calibration scale must be a positive finite number"):
            check_scale(bad, "x")
