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
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np
import torch

from ctrkit.eval.evaluator import metrics_of
from ctrkit.metrics import auc_difference
from ctrkit.train.best_weights import release
from ctrkit.train.scoring import Scorer

CopyWeights = Callable[[dict[str, torch.Tensor] | None, bool], dict[str, torch.Tensor]]


def score(metrics: dict[str, Any]) -> float:
    """What selection maximises: validation AUC, or minus the log loss where AUC is undefined (one class)."""
    auc = metrics.get("auc", float("nan"))
    return auc if math.isfinite(auc) else -metrics.get("logloss", float("inf"))


def prefers(
    candidate: dict[str, Any],
    incumbent_score: float,
    min_delta: float,
    baseline_loss: float | None,
    min_z: float | None,
) -> bool:
    """The best-model rule: whether a model with validation ``candidate`` metrics replaces the one kept (scored
    ``incumbent_score``). Its score must be higher by more than ``min_delta``; with ``baseline_loss`` (the warm
    start's validation log loss, under ``warm_start_logloss``) its log loss must be lower; with ``min_z`` (the
    kept model is the warm start and ``warm_start_z`` guards it) its ``baseline_z`` metric, where it has one, must
    be at least that. Evaluations, the snapshot ensemble and the seed ensemble all keep a model by this rule."""
    if not score(candidate) > incumbent_score + min_delta:
        return False
    if baseline_loss is not None and not candidate.get("logloss", -math.inf) < baseline_loss:
        return False
    z = candidate.get("baseline_z") if min_z is not None else None
    return z is None or math.isnan(z) or z >= min_z


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
        """Whether an evaluation with ``metrics`` would replace the selected one (``prefers``, without changing
        the state)."""
        return prefers(
            metrics,
            self.best_score,
            self.min_delta,
            self.loss_to_beat,
            self.baseline_z if self.guarding_baseline else None,
        )

    @property
    def loss_to_beat(self) -> float | None:
        """The validation log loss a kept model must be below (``baseline_logloss``), or None."""
        reference = self.baseline_loss
        if reference is None and self._selected_baseline:  # a state written before baseline_loss was kept
            reference = (self.best_metrics or {}).get("logloss", math.inf)
        return reference if self.baseline_logloss else None

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

    def state(self) -> dict[str, Any]:
        return asdict(self)

    def resumed(self, state: dict[str, Any]) -> Selection:
        """A checkpoint's selection ``state`` under this run's rule: the settings (``SETTINGS``) stay this run's, so
        a resume applies the patience, plateau and ``min_delta`` it is given from its step on."""
        return replace(Selection.from_state(state), **{k: getattr(self, k) for k in SETTINGS})

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Selection:
        if "peak_score" not in state:  # written before the baseline rule: the peak was the selected score
            state = {**state, "peak_score": state.get("best_score", -math.inf)}
        return cls(**state)


# the rule's settings (a run's flags); the other fields are the state a checkpoint carries over
SETTINGS = ("patience", "plateau_patience", "plateau_factor", "min_delta", "baseline_z", "baseline_logloss")


class Selector:
    """The selected model of a run: the selection's state (``Selection``), the weights it keeps, and their
    validation logits while they are at hand.

    Args:
        selection: the rule's settings and state.
        validation_set: the mapping evaluations score (None or empty: nothing is selected).
        scorer: scores the model being trained.
        copy_weights: ``copy_weights(into, on_disk)``: a copy of the weights this process holds (``into``'s
            tensors reused; ``on_disk``: tables copied to ``best_dir`` where the run keeps them there).
        best_dir: where the kept weights' tables live on disk (``best_weights disk``), or None.
    """

    def __init__(self, selection: Selection, validation_set, scorer: Scorer, copy_weights: CopyWeights, best_dir=None):
        self.selection, self.validation_set, self.scorer = selection, validation_set, scorer
        self.copy_weights, self.best_dir = copy_weights, best_dir
        self.best_state: dict[str, torch.Tensor] | None = None  # the best weights this process holds
        self.owned = False  # best_state is this run's own copy (not a checkpoint's tensors)
        self.best_logits = None  # the selected weights' validation logits (None after a resume)
        self.baseline_logits: np.ndarray | None = None  # the warm start's validation logits while it is selected

    @property
    def active(self) -> bool:
        """Whether there is validation data to select on."""
        return self.validation_set is not None and len(self.validation_set) > 0

    def score_validation(self) -> tuple[dict[str, Any], Any]:
        """The validation metrics and logits of the current weights (tests plant a curve here, with no logits)."""
        logits = self.scorer.logits(self.validation_set)
        return metrics_of(self.validation_set, logits), logits

    def evaluate(self, step: int, baseline: bool, reuse: bool) -> tuple[dict[str, Any], bool, float]:
        """Scores the validation data at ``step`` and updates the selection; a selected evaluation's weights are
        copied (into the previous copy's tensors when ``reuse``: nothing else holds them). ``baseline``: this
        evaluation is of the warm start. Returns the metrics, whether they were selected and the seconds spent
        scoring."""
        sel = self.selection
        started = time.perf_counter()
        metrics, logits = self.score_validation()
        seconds = time.perf_counter() - started
        if sel.guarding_baseline and logits is not None:
            metrics["baseline_z"] = self.baseline_z(logits)
        selected = sel.update(step, metrics, baseline=baseline)
        if selected:
            self.best_state = self.copy_weights(self.best_state if self.owned and reuse else None, True)
            self.owned = True
            self.baseline_logits = logits if baseline else None
            self.best_logits = logits  # calibration fits on them (no second scoring of the same weights)
        return metrics, selected, seconds

    def baseline_z(self, logits) -> float:
        """The validation AUC gain of ``logits`` over the (selected) baseline's, in standard errors of the paired
        difference (DeLong)."""
        diff, se = auc_difference(self.validation_set.labels(), logits, self._baseline_validation_logits())
        return diff / se if se > 0 else math.copysign(math.inf, diff) if diff else 0.0

    def _baseline_validation_logits(self) -> Any:
        """The selected (baseline) weights' validation logits; after a resume, recomputed from them."""
        if self.baseline_logits is None:
            inner = self.scorer.inner
            current = self.copy_weights(None, False)
            if self.best_state is None:
                raise ValueError("no selected weights to score the baseline of")
            inner.load_state_dict(self.best_state)
            self.baseline_logits = self.scorer.logits(self.validation_set)
            inner.load_state_dict(current)
        return self.baseline_logits

    def calibration_logits(self) -> np.ndarray:
        """The kept weights' validation logits, for fitting their logit scale (scored again after a resume)."""
        if self.best_state is None:  # nothing was selected: a checkpoint without selection state, resumed at its end
            return self.scorer.logits(self.validation_set)
        logits = self.best_logits
        if logits is None:
            logits = self.scorer.logits_of([self.best_state], self.validation_set)[0].astype(np.float32)
        release(self.best_state, self.best_dir)
        return logits

    def keep_best(self, step: int) -> None:
        """Puts the selected weights into the model (the last ones, at ``step``, when nothing was selected)."""
        if self.best_state is None or self.selection.best_step == step:
            return
        self.scorer.inner.load_state_dict(self.best_state)
        release(self.best_state, self.best_dir)

    def release(self) -> None:
        """Drops the kept tables' pages read in since (a save) from memory, where they live on disk."""
        release(self.best_state, self.best_dir)

    def restore(self, state: dict[str, Any] | None, best: Callable[[], dict[str, torch.Tensor]], owned: bool) -> None:
        """Takes a checkpoint's selection ``state`` and, where it selected a model, this process's part of its
        weights (``best()``; ``owned``: a copy of this run's own, not the checkpoint's tensors)."""
        if state is None:
            return
        self.selection = self.selection.resumed(state)
        if self.selection.best_step is not None:
            self.best_state, self.owned = best(), owned
