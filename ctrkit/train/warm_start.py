"""Before the first step: the numerical inputs' normaliser and buckets fitted, and the first-order term fitted as a
logistic regression that the run starts from (``linear_warm_start``)."""

from __future__ import annotations

from typing import Any

import numpy as np
from torch import nn

from ctrkit.models.embeddings import fill_pending_tables


def fit_normalizer(inner: nn.Module, train_set) -> dict[str, Any] | None:
    """The model's numerical inputs standardised (and raw amounts logged) with statistics of the training data
    (``models.inputs.NumericalNormalizer``), and the first-order term's bucket cut points set at their quantiles
    (``models.inputs.NumericalBuckets``). Returns the log record's fields, or None where there is nothing to fit."""
    from ctrkit.models.numerical import normalizer_sample

    norm = inner.numerical_norm
    if norm.log_mask.numel() == 0:
        return None
    drawn = normalizer_sample(train_set, labels=True)
    if drawn is None:
        return None
    sample, labels = drawn
    fitted = norm.fit(sample)
    buckets = inner.wide_buckets
    if buckets is not None:  # the first-order term's cut points, fewer where clicks (or non-clicks) are few
        clicks = int(np.count_nonzero(train_set.labels()))  # reads the memory-mapped labels through
        seen = norm(sample.to(norm.shift.device)).cpu()
        rarer = min(clicks, len(train_set) - clicks)
        fitted.update(buckets.fit(sample, rarer_label_rows=rarer, labels=labels, seen=seen))
    return {"rows": int(sample.shape[0]), **fitted}


def fit_warm_start(
    model: nn.Module, inner: nn.Module, train_set, validation_set, cache: dict[str, Any] | None
) -> dict[str, Any] | None:
    """``linear_warm_start``: the first-order term fitted as a logistic regression and the deep output zeroed
    (``linear_fit.fit_first_order``); the deep tables built undrawn are drawn after it, its memory freed. ``cache``
    (a seed ensemble's, shared by its members): an earlier member's fit, taken instead of fitting again (the same
    data and normaliser give the same fit); an empty dict receives this fit. Returns the fit's record, or None
    where the model has no first-order term or there is no validation data."""
    if inner.wide_embeddings is None or validation_set is None or len(validation_set) == 0:
        return None
    from ctrkit.train.linear_fit import FIRST_ORDER_MODULES, fit_first_order

    names = (*FIRST_ORDER_MODULES, "dynamic_ids")  # the dynamic tables' ids the fit admitted, with its weights
    modules = {name: getattr(inner, name) for name in names if getattr(inner, name) is not None}
    if cache:
        for name, module in modules.items():
            module.load_state_dict(cache["states"][name])
        fit = {**cache["fit"], "reused": True}
    else:
        fit = fit_first_order(model, train_set, validation_set)
        if cache is not None:
            cache["fit"] = fit
            cache["states"] = {
                name: {k: v.detach().clone() for k, v in module.state_dict().items()}
                for name, module in modules.items()
            }
    fill_pending_tables(model)  # the deep tables drawn only now: the fit's memory is freed
    return fit


def describe_fit(fit: dict[str, Any]) -> str:
    """The line a run prints about its warm start."""
    how = "reused from the seed ensemble's first member" if fit.get("reused") else f"{fit['seconds']:.1f} s"
    return (
        f"first-order term fitted as a logistic regression on {fit['rows']:,} rows (C {fit['C']:g}, "
        f"validation AUC {fit['validation_auc']:.4f}, {how})"
    )
