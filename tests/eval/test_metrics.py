import numpy as np
import pytest
from sklearn.metrics import log_loss, roc_auc_score

from ctrkit.eval.metrics import log_loss_from_logits, roc_auc, sigmoid


@pytest.mark.parametrize("seed", range(5))
def test_auc_matches_sklearn_with_many_ties(seed):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, 5000)
    scores = np.round(rng.normal(labels * 0.5, 1.0), 1)  # coarse rounding: lots of ties
    assert roc_auc(labels, scores) == pytest.approx(roc_auc_score(labels, scores), abs=1e-12)


def test_auc_hand_computed_with_ties():
    # positives at 0.8 and 0.5, negatives at 0.5 and 0.1: pairs (0.8>0.5)=1, (0.8>0.1)=1, (0.5=0.5)=0.5,
    # (0.5>0.1)=1 -> 3.5 / 4
    assert roc_auc([1, 1, 0, 0], [0.8, 0.5, 0.5, 0.1]) == 0.875
    assert np.isnan(roc_auc([1, 1], [0.3, 0.4]))


def test_log_loss_matches_sklearn():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 3000)
    logits = rng.normal(0, 3, 3000)
    expected = log_loss(labels, sigmoid(logits))
    assert log_loss_from_logits(labels, logits) == pytest.approx(expected, rel=1e-9)


def test_log_loss_is_finite_for_extreme_logits():
    assert log_loss_from_logits([1, 0], [800.0, -800.0]) == pytest.approx(0.0, abs=1e-12)
    assert log_loss_from_logits([0], [800.0]) == pytest.approx(800.0)
