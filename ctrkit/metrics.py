"""Ranking and calibration metrics, computed exactly over a whole mapping."""

from __future__ import annotations

import numpy as np


def roc_auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Exact area under the ROC curve, with tied scores counted as half (Mann-Whitney U).

    Args:
        labels: (N,) zeros and ones.
        scores: (N,) any monotone score (logits or probabilities).

    Returns:
        AUC in [0, 1]; NaN when only one class is present.
    """
    y = np.asarray(labels).astype(bool).ravel()
    s = np.asarray(scores, dtype=np.float64).ravel()
    if y.shape != s.shape:
        raise ValueError(f"labels and scores differ in length: {y.shape[0]} vs {s.shape[0]}")
    pos = int(y.sum())
    neg = y.size - pos
    if pos == 0 or neg == 0:
        return float("nan")
    rank_sum_pos = _midranks(s)[y].sum()
    return float((rank_sum_pos - pos * (pos + 1) / 2.0) / (pos * neg))


def _midranks(s: np.ndarray) -> np.ndarray:
    """1-based ranks of ``s``, each run of equal values given its average rank."""
    order = np.argsort(s, kind="mergesort")
    s_sorted = s[order]
    starts = np.flatnonzero(np.r_[True, s_sorted[1:] != s_sorted[:-1]])
    ends = np.r_[starts[1:], s_sorted.size]
    ranks = np.empty(s.size, dtype=np.float64)
    ranks[order] = np.repeat((starts + ends + 1) / 2.0, ends - starts)
    return ranks


def auc_difference(labels: np.ndarray, scores_a: np.ndarray, scores_b: np.ndarray) -> tuple[float, float]:
    """AUC(a) - AUC(b) of two scorings of the same rows, and the standard error of that difference
    (DeLong, DeLong and Clarke-Pearson 1988, paired: it accounts for the two scorings' correlation), computed
    from midranks in O(N log N) (Sun and Xu 2014).

    Returns:
        ``(difference, standard_error)``; NaN for both when only one class is present.
    """
    y = np.asarray(labels).astype(bool).ravel()
    a = np.asarray(scores_a, dtype=np.float64).ravel()
    b = np.asarray(scores_b, dtype=np.float64).ravel()
    if not (y.shape == a.shape == b.shape):
        raise ValueError(f"labels and scores differ in length: {y.shape[0]}, {a.shape[0]}, {b.shape[0]}")
    m, n = int(y.sum()), int((~y).sum())
    if m == 0 or n == 0:
        return float("nan"), float("nan")
    pos_parts, neg_parts = [], []
    for s in (a, b):
        overall, within_pos, within_neg = _midranks(s), _midranks(s[y]), _midranks(s[~y])
        pos_parts.append((overall[y] - within_pos) / n)  # each positive: the share of negatives it outranks
        neg_parts.append(1.0 - (overall[~y] - within_neg) / m)  # each negative: the share of positives above it
    auc_a, auc_b = pos_parts[0].mean(), pos_parts[1].mean()
    ddof = 1 if min(m, n) > 1 else 0
    var = 0.0
    for parts, count in ((pos_parts, m), (neg_parts, n)):
        diff = parts[0] - parts[1]
        var += float(np.var(diff, ddof=ddof)) / count if count > 1 else 0.0
    return float(auc_a - auc_b), float(np.sqrt(max(var, 0.0)))


def log_loss_from_logits(labels: np.ndarray, logits: np.ndarray) -> float:
    """Mean binary cross-entropy, computed from logits in float64 (stable, no clipping needed)."""
    y = np.asarray(labels, dtype=np.float64).ravel()
    z = np.asarray(logits, dtype=np.float64).ravel()
    # -[y log s(z) + (1-y) log(1-s(z))] = softplus(z) - y z
    return float(np.mean(np.logaddexp(0.0, z) - y * z))


def sigmoid(logits: np.ndarray) -> np.ndarray:
    """Numerically stable logistic function."""
    z = np.asarray(logits, dtype=np.float64)
    return np.exp(-np.logaddexp(0.0, -z))


def mean_average_precision(
    groups: np.ndarray, labels: np.ndarray, scores: np.ndarray, k: int = 12
) -> tuple[float, int]:
    """MAP@k over groups of rows ranked together (Outbrain's displays: MAP@12).

    Within each group rows are ranked by descending score; tied scores keep dataset order (a
    stable sort), so the result is deterministic. For a group with P clicks,
    AP@k = sum over clicked rows at rank r <= k of precision@r, divided by min(P, k); with exactly
    one click (Outbrain) that is 1 / rank of the click, or 0 beyond rank k. Groups without a click
    have no AP and are left out.

    Args:
        groups: (N,) group id of each row (e.g. the display id); rows need not be contiguous.
        labels: (N,) zeros and ones.
        scores: (N,) model scores.
        k: cut-off rank.

    Returns:
        (MAP@k, number of groups with at least one click); MAP is NaN when there are none.
    """
    g = np.asarray(groups).ravel()
    y = np.asarray(labels).astype(np.float64).ravel()
    s = np.asarray(scores, dtype=np.float64).ravel()
    if not (g.shape == y.shape == s.shape):
        raise ValueError(f"groups, labels and scores differ in length: {g.size}, {y.size}, {s.size}")
    if g.size == 0:
        return float("nan"), 0
    order = np.lexsort((np.arange(g.size), -s, g))  # by group, then score descending, then row
    g, y = g[order], y[order]
    starts = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
    sizes = np.diff(np.r_[starts, g.size])
    rank = np.arange(g.size) - np.repeat(starts, sizes) + 1  # 1-based rank within the group
    cum = np.cumsum(y)
    clicks_before_group = np.repeat(cum[starts] - y[starts], sizes)
    precision = (cum - clicks_before_group) / rank
    hits = np.add.reduceat(y * precision * (rank <= k), starts)
    positives = np.add.reduceat(y, starts)
    has_click = positives > 0
    if not has_click.any():
        return float("nan"), 0
    ap = hits[has_click] / np.minimum(positives[has_click], k)
    return float(ap.mean()), int(has_click.sum())
