import numpy as np
import pytest
from sklearn.metrics import log_loss, roc_auc_score

from ctrkit.metrics import auc_difference, log_loss_from_logits, roc_auc, sigmoid


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


@pytest.mark.parametrize("seed", range(3))
def test_auc_difference_against_the_pairwise_definition(seed):
    """DeLong's paired variance from its definition: every positive-negative pair compared, O(m n)."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, 400)
    a = np.round(rng.normal(labels * 0.6, 1.0), 1)  # ties within and across classes
    b = np.round(a + rng.normal(0, 0.7, 400), 1)  # correlated with a, as two models of one run are
    pos, neg = labels == 1, labels == 0
    components = []
    for s in (a, b):
        psi = (s[pos][:, None] > s[neg][None, :]) + 0.5 * (s[pos][:, None] == s[neg][None, :])
        components.append((psi.mean(1), psi.mean(0)))  # per positive, per negative
    d10, d01 = components[0][0] - components[1][0], components[0][1] - components[1][1]
    want_se = np.sqrt(d10.var(ddof=1) / pos.sum() + d01.var(ddof=1) / neg.sum())
    diff, se = auc_difference(labels, a, b)
    assert diff == pytest.approx(roc_auc_score(labels, a) - roc_auc_score(labels, b), abs=1e-12)
    assert se == pytest.approx(want_se, rel=1e-9) and se > 0
    assert auc_difference(labels, a, a) == (0.0, 0.0)
    assert all(np.isnan(auc_difference([1, 1], [0.1, 0.2], [0.3, 0.4])))


def test_log_loss_matches_sklearn():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 3000)
    logits = rng.normal(0, 3, 3000)
    expected = log_loss(labels, sigmoid(logits))
    assert log_loss_from_logits(labels, logits) == pytest.approx(expected, rel=1e-9)


def test_log_loss_is_finite_for_extreme_logits():
    assert log_loss_from_logits([1, 0], [800.0, -800.0]) == pytest.approx(0.0, abs=1e-12)
    assert log_loss_from_logits([0], [800.0]) == pytest.approx(800.0)


def test_map_at_k_hand_computed_with_ties():
    from ctrkit.metrics import mean_average_precision

    groups = [7, 7, 7, 3, 3, 3, 3, 9, 9]
    labels = [0, 1, 0, 1, 0, 0, 0, 0, 0]
    scores = [0.9, 0.5, 0.5, 0.2, 0.2, 0.2, 0.8, 0.4, 0.1]
    # group 7: order 0.9 (row 0), then the tie 0.5/0.5 kept in row order (row 1 clicked, row 2): click at
    # rank 2 -> AP 1/2. group 3: 0.8 (row 6), then the three tied 0.2 in row order: click (row 3) at
    # rank 2 -> 1/2... unless k cuts it: with k=1 it is 0. group 9: no click, left out.
    m, n = mean_average_precision(groups, labels, scores, k=12)
    assert (m, n) == (0.5, 2)
    m1, _ = mean_average_precision(groups, labels, scores, k=1)
    assert m1 == 0.0
    # two clicks in one group: ranks 1 and 3 -> (1/1 + 2/3) / 2
    m2, n2 = mean_average_precision([1, 1, 1], [1, 0, 1], [0.9, 0.8, 0.7])
    assert n2 == 1 and m2 == pytest.approx((1 + 2 / 3) / 2)


def test_map_against_a_loop_on_random_displays():
    from ctrkit.metrics import mean_average_precision

    rng = np.random.default_rng(3)
    groups = rng.integers(0, 200, 3000)
    labels = rng.random(3000) < 0.2
    scores = np.round(rng.random(3000), 2)  # ties
    aps = []
    for g in np.unique(groups):
        rows = np.flatnonzero(groups == g)  # dataset order
        ranked = rows[np.argsort(-scores[rows], kind="stable")]
        hits, total = 0, 0.0
        for r, row in enumerate(ranked[:12], start=1):
            if labels[row]:
                hits += 1
                total += hits / r
        if labels[rows].any():
            aps.append(total / min(labels[rows].sum(), 12))
    m, n = mean_average_precision(groups, labels, scores)
    assert n == len(aps) and m == pytest.approx(np.mean(aps), abs=1e-12)
