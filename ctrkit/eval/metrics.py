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
    order = np.argsort(s, kind="mergesort")
    s_sorted = s[order]
    # average 1-based rank of each run of equal scores
    starts = np.flatnonzero(np.r_[True, s_sorted[1:] != s_sorted[:-1]])
    ends = np.r_[starts[1:], s_sorted.size]
    avg_rank = (starts + ends + 1) / 2.0
    ranks = np.repeat(avg_rank, ends - starts)
    rank_sum_pos = ranks[y[order]].sum()
    return float((rank_sum_pos - pos * (pos + 1) / 2.0) / (pos * neg))


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
