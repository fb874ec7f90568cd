"""Before the first step: the numerical inputs' normaliser and buckets fitted, and the first-order term
fitted as a logistic regression that the run starts from (``linear_warm_start``)."""

from __future__ import annotations

import numpy as np
from tqdm.auto import tqdm

from ctrkit.models.embeddings import fill_pending_tables


class WarmStart:
    """Fits the input normaliser and the warm start (a mixin of ``Trainer``)."""

    def _fit_normalizer(self) -> None:
        """Before the first step: the model's numerical inputs standardised (and raw amounts logged) with
        statistics of the training data (``models.inputs.NumericalNormalizer``), and the first-order term's
        bucket cut points set at their quantiles (``models.inputs.NumericalBuckets``)."""
        from ctrkit.models.numerical import normalizer_sample

        inner = getattr(self.model, "model", self.model)
        norm = getattr(inner, "numerical_norm", None)
        if norm is None or norm.log_mask.numel() == 0:
            return
        drawn = normalizer_sample(self.train_set, labels=True)
        if drawn is None:
            return
        sample, labels = drawn
        fitted = norm.fit(sample)
        buckets = getattr(inner, "wide_buckets", None)
        if buckets is not None:  # the first-order term's cut points, fewer where clicks (or non-clicks) are few
            clicks = int(np.count_nonzero(self.train_set.labels()))  # reads the memory-mapped labels through
            seen = norm(sample.to(norm.shift.device)).cpu()
            rarer = min(clicks, len(self.train_set) - clicks)
            fitted.update(buckets.fit(sample, rarer_label_rows=rarer, labels=labels, seen=seen))
        self._log({"event": "numerical_normalizer", "step": 0, "rows": int(sample.shape[0]), **fitted})

    def _warm_start(self) -> None:
        """``linear_warm_start``: the first-order term fitted as a logistic regression, the deep output
        zeroed, and the result evaluated on validation at step 0 (so selection can keep it)."""
        inner = getattr(self.model, "model", self.model)
        if not (self.cfg.linear_warm_start and getattr(inner, "wide_embeddings", None) is not None):
            return
        if self.validation_set is None or len(self.validation_set) == 0:
            return
        from ctrkit.train.linear_fit import FIRST_ORDER_MODULES, fit_first_order

        cache = self.warm_start_cache
        names = (*FIRST_ORDER_MODULES, "dynamic_ids")  # the dynamic tables' ids the fit admitted, with its weights
        modules = {name: getattr(inner, name) for name in names if getattr(inner, name, None) is not None}
        if cache:  # a later member of a seed ensemble: the first member's fit, which is deterministic in the data
            for name, module in modules.items():
                module.load_state_dict(cache["states"][name])
            fit = {**cache["fit"], "reused": True}
        else:
            fit = fit_first_order(self.model, self.train_set, self.validation_set)
            if cache is not None:
                cache["fit"] = fit
                cache["states"] = {name: {k: v.detach().clone() for k, v in module.state_dict().items()}
                                   for name, module in modules.items()}  # fmt: skip
        self._log({"event": "warm_start", "step": 0, **fit})
        if self.progress:
            how = "reused from the seed ensemble's first member" if fit.get("reused") else f"{fit['seconds']:.1f} s"
            tqdm.write(f"first-order term fitted as a logistic regression on {fit['rows']:,} rows (C {fit['C']:g}, "
                       f"validation AUC {fit['validation_auc']:.4f}, {how})")  # fmt: skip
        fill_pending_tables(self.model)  # the deep tables drawn only now: the fit's memory is freed
        self.validate(baseline=True)
