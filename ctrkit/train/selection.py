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
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ctrkit.calibration import choose_calibration
from ctrkit.eval.evaluator import metrics_of, predict_logits
from ctrkit.metrics import auc_difference
from ctrkit.train.best_weights import release


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


class ModelSelection:
    """Validation, the selected weights, table redraws and calibration (a mixin of ``Trainer``)."""

    def _calibrate(self, ensemble_logits: np.ndarray | None) -> None:
        """Fits the kept model's logit scale on validation (``calibrate``; ``calibration.py``) and logs
        the fit; the checkpoint saved next stores it. ``ensemble_logits``: a kept snapshot ensemble's
        validation logits (``_form_ensemble``'s); None: the selected weights are scored here."""
        self.calibration, self.calibration_record = None, {}
        if self.validation_set is None or len(self.validation_set) == 0 or self.cfg.calibrate == "off":
            return
        if ensemble_logits is not None:
            logits = ensemble_logits
        elif self.best_state is not None:
            logits = self._best_logits
            if logits is None:  # a resumed run: its selected weights scored again
                logits = self._logits_of([self.best_state], self.validation_set)[0].astype(np.float32)
            release(self.best_state, self.best_dir)
        else:  # nothing was selected: a checkpoint without selection state, resumed at its end
            logits = self._logits(self.validation_set)
        self.calibration, self.calibration_record = choose_calibration(
            logits, self.validation_set.labels(), self.cfg.calibrate
        )
        self._log({"event": "calibration", "step": self.step, **self.calibration_record})
        if self.calibration is not None:
            self._saved_step = None  # the final checkpoint records it

    def validate(self, baseline: bool = False) -> dict[str, Any] | None:
        """Scores the validation data, updates the selection (best weights, plateau, patience), logs it.
        ``baseline``: this evaluation is of the warm start, which a later model must beat by
        ``warm_start_z`` standard errors to replace."""
        if self.validation_set is None or len(self.validation_set) == 0:
            return None
        sel = self.selection
        started = time.perf_counter()
        metrics, logits = self._score_validation()
        seconds = time.perf_counter() - started
        if sel.guarding_baseline and logits is not None:
            metrics["baseline_z"] = self._baseline_z(logits)
        selected = sel.update(self.step, metrics, baseline=baseline)
        if selected:  # in place where nothing else holds the old copy (a snapshot pool may)
            reuse = self.best_state if self._best_owned and self.pool_size < 2 else None
            self.best_state = self._local_state(reuse, on_disk=True)
            self._best_owned = True
            self._baseline_logits = logits if baseline else None
            self._best_logits = logits  # calibration fits on them (no second scoring of the same weights)
        if not baseline:
            self._keep_snapshot(metrics, self.best_state if selected else None)
        # auto reinit_embeddings: from the best weights, with fresh tables
        if not selected and self._overfitting(metrics):
            sel.reinit = True
            self._inner.load_state_dict(self.best_state)
            epoch, into = divmod(self.step, self.steps_per_epoch)
            if into:  # at an epoch's end the next epoch's start redraws them
                self._reinit_embeddings(epoch)
        record = {"event": "eval", "mapping": "validation", "step": self.step, **metrics,
                  "best_step": sel.best_step, "lr_scale": sel.lr_scale, "seconds": round(seconds, 3)}  # fmt: skip
        self._log(record)
        return record

    def _baseline_z(self, logits) -> float:
        """The validation AUC gain of ``logits`` over the (selected) baseline's, in standard errors of the paired
        difference (DeLong)."""
        diff, se = auc_difference(self.validation_set.labels(), logits, self._baseline_validation_logits())
        return diff / se if se > 0 else math.copysign(math.inf, diff) if diff else 0.0

    def _score_validation(self) -> tuple[dict[str, Any], Any]:
        """The validation metrics and logits (tests replace this with a planted curve and no logits)."""
        logits = self._logits(self.validation_set)
        return metrics_of(self.validation_set, logits), logits

    def _logits(self, dataset) -> Any:
        return predict_logits(
            self.model, dataset, self.device, self.cfg.eval_batch_size, self.eval_amp_dtype, env=self.env
        )

    def _baseline_validation_logits(self) -> Any:
        """The selected (baseline) weights' validation logits; after a resume, recomputed from them."""
        if self._baseline_logits is None:
            current = self._local_state()
            self._inner.load_state_dict(self.best_state)
            self._baseline_logits = self._logits(self.validation_set)
            self._inner.load_state_dict(current)
        return self._baseline_logits

    def _keep_best(self) -> None:
        """Puts the selected weights into the model (the last ones when nothing was selected)."""
        if self.best_state is None or self.selection.best_step == self.step:
            return
        self._inner.load_state_dict(self.best_state)
        release(self.best_state, self.best_dir)

    def _overfitting(self, metrics: dict[str, Any]) -> bool:
        """Auto ``reinit_embeddings``: past the first epoch, the validation AUC fell more than
        ``reinit_drop`` below the best seen (a second pass over the same rows made the model worse)."""
        cfg = self.cfg
        if cfg.reinit_embeddings != "auto" or self.selection.reinit or self.selection.best_step is None:
            return False
        if self.step <= self.steps_per_epoch:  # the first pass: nothing seen twice yet
            return False
        return metrics.get("auc", math.inf) < self.selection.peak_score - cfg.reinit_drop

    def _reinit_embeddings(self, epoch: int) -> None:
        """``reinit_embeddings``: the deep tables redrawn (draw ``epoch``: the same values at any world size
        and on resuming) and their optimizer state cleared; the first-order tables and the rest kept."""
        tables = getattr(self._inner, "embeddings", None)
        if tables is None:
            return
        params = []
        for collection in tables.modules():  # one-hot and multi-hot collections (of each width), plain or sharded
            if hasattr(collection, "reset_tables") and hasattr(collection, "table_parameters"):
                collection.reset_tables(draw=epoch)
                params += collection.table_parameters()
        for opt in self.optimizers:
            for p in params:
                opt.state.pop(p, None)
        self._log({"event": "reinit_embeddings", "step": self.step, "epoch": epoch})
