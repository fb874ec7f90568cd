"""Model selection on validation data: keep the best evaluation, decay the learning rate on a plateau,
stop early after a patience.

Measured on independent data, embedding models lose AUC from their second epoch on (one-epoch
overfitting), so the model a run keeps is the best one seen on validation, never simply the last.

When training starts from a fitted baseline (the linear warm start), a trained model replaces it only when
its validation AUC is higher by more than ``baseline_z`` standard errors of the paired difference (the
one-standard-error rule of model selection): on small validation sets a gain of a few ten-thousandths is
noise, and keeping a model for it was measured to lose to the baseline on the test set. With
``baseline_logloss`` (the default) every model kept in the baseline's place must also have a lower
validation log loss than the baseline: a model that ranks a little better but predicts worse
probabilities than the calibrated regression it started from has not shown that it learned something the
regression lacks; on a small or rare-click validation set its AUC gain is mostly noise (docs/decisions/warm-start.md).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any


def score(metrics: dict[str, Any]) -> float:
    """What selection maximises: validation AUC, or minus the log loss where AUC is undefined (one class)."""
    auc = metrics.get("auc", float("nan"))
    return auc if math.isfinite(auc) else -metrics.get("logloss", float("inf"))


@dataclass
class Selection:
    """The state of model selection over a run's evaluations.

    Args:
        patience: evaluations without improvement after which training stops (0: never early).
        plateau_patience: evaluations without improvement after which the learning rate is multiplied
            by ``plateau_factor`` (0: never); the count restarts after each decay.
        plateau_factor: the multiplier, in (0, 1].
        min_delta: how much a score must beat the best to count as an improvement.
        baseline_z: while the selected model is the baseline (the evaluation taken with ``baseline=True``),
            a later one replaces it only when its ``baseline_z`` metric (AUC gain over the baseline in
            standard errors) is at least this; 0 for any gain.
        baseline_logloss: a later evaluation is selected only when its validation log loss is also lower
            than the baseline's (not only while the baseline is the selected model: any model kept must be
            better calibrated than the regression it started from).

    Attributes:
        best_step, best_metrics, best_score: the selected evaluation so far (None/-inf before the first).
        baseline_step: the baseline's step, when there is one.
        baseline_loss: the baseline's validation log loss, when there is one.
        baseline_auc: the baseline's validation AUC, when there is one (reported beside the selected model's).
        peak_score: the best score seen, selected or not: improvements on it are what the patience and the
            plateau count.
        since_best: evaluations since the peak.
        since_decay: evaluations without improvement since the last decay (or the peak).
        lr_scale: the product of the decays so far, applied on top of the LR schedule.
        stopped: the patience ran out.
        reinit: the run redraws its embedding tables at each epoch (``reinit_embeddings`` on, or auto after
            the validation AUC fell).
    """

    patience: int = 0
    plateau_patience: int = 0
    plateau_factor: float = 0.5
    min_delta: float = 0.0
    baseline_z: float = 0.0
    baseline_logloss: bool = False
    best_step: int | None = None
    best_metrics: dict[str, Any] | None = None
    best_score: float = -math.inf
    baseline_step: int | None = None
    baseline_loss: float | None = None
    baseline_auc: float | None = None
    peak_score: float = -math.inf
    since_best: int = 0
    since_decay: int = 0
    lr_scale: float = 1.0
    stopped: bool = False
    reinit: bool = False

    def update(self, step: int, metrics: dict[str, Any], baseline: bool = False) -> bool:
        """Takes the evaluation at ``step`` (``baseline``: of the baseline); returns whether it is the new
        selected one."""
        value = score(metrics)
        if baseline:
            self.baseline_step = step
            self.baseline_loss = metrics.get("logloss")
            self.baseline_auc = metrics.get("auc")
        if value > self.peak_score + self.min_delta:
            self.peak_score = value
            self.since_best = self.since_decay = 0
        else:
            self.since_best += 1
            self.since_decay += 1
            if self.plateau_patience and self.since_decay >= self.plateau_patience:
                self.lr_scale *= self.plateau_factor
                self.since_decay = 0
            if self.patience and self.since_best >= self.patience:
                self.stopped = True
        if self.best_step is None or self.accepts(metrics):
            self.best_step, self.best_metrics, self.best_score = step, dict(metrics), value
            return True
        return False

    def accepts(self, metrics: dict[str, Any]) -> bool:
        """Whether an evaluation with ``metrics`` would replace the selected one (``update``'s rule, without
        changing the state)."""
        return score(metrics) > self.best_score + self.min_delta and self._beats_baseline(metrics)

    def baseline_metrics(self) -> dict[str, Any] | None:
        """The baseline's step and validation AUC and log loss (None: no baseline, or a state from before
        its AUC was kept)."""
        if self.baseline_step is None or self.baseline_auc is None:
            return None
        return {"step": self.baseline_step, "auc": self.baseline_auc, "logloss": self.baseline_loss}

    @property
    def guarding_baseline(self) -> bool:
        """Whether the selected model is the baseline and ``baseline_z`` guards it (a later evaluation then
        needs its ``baseline_z`` metric)."""
        return bool(self.baseline_z) and self._selected_baseline

    @property
    def _selected_baseline(self) -> bool:
        return self.baseline_step is not None and self.best_step == self.baseline_step

    def _beats_baseline(self, metrics: dict[str, Any]) -> bool:
        reference = self.baseline_loss
        if reference is None and self._selected_baseline:  # a state written before baseline_loss was kept
            reference = self.best_metrics.get("logloss", math.inf)
        if self.baseline_logloss and reference is not None and not metrics.get("logloss", -math.inf) < reference:
            return False
        if not self.guarding_baseline:
            return True
        z = metrics.get("baseline_z")
        return z is None or math.isnan(z) or z >= self.baseline_z

    def state(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Selection:
        if "peak_score" not in state:  # written before the baseline rule: the peak was the selected score
            state = {**state, "peak_score": state.get("best_score", -math.inf)}
        return cls(**state)
