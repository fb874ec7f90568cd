"""The snapshot ensemble (``snapshot_ensemble``): the best evaluation of each of the best epochs kept, and the mean
of their logits kept as the model where the best-model rule prefers it to the selected model."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ctrkit.checkpoint import snapshot_states
from ctrkit.eval.evaluator import metrics_of
from ctrkit.train.scoring import Scorer
from ctrkit.train.selection import Selection, score


class SnapshotPool:
    """The pool: at most ``size`` snapshots (the best evaluation of each of the best epochs, best first, each in
    host memory), and the ensemble formed from it at the end of training.

    Attributes:
        snapshots: the pool, as checkpoints store it (``epoch``, ``step``, ``score``, ``model``).
        ensemble: the steps of the snapshots forming the kept ensemble, or None.
        ensemble_metrics: its validation metrics, or None.
    """

    def __init__(self, size: int, steps_per_epoch: int):
        self.size, self.steps_per_epoch = size, steps_per_epoch
        self.snapshots: list[dict[str, Any]] = []
        self.ensemble: list[int] | None = None
        self.ensemble_metrics: dict[str, Any] | None = None

    def keep(self, step: int, metrics: dict[str, Any], weights) -> None:
        """Puts the evaluation at ``step`` into the pool when it is its epoch's best so far and among the ``size``
        best epochs. ``weights()``: a copy of the weights evaluated (taken only when they enter the pool)."""
        if self.size < 2 or step == 0:
            return
        value = score(metrics)
        epoch = (step - 1) // self.steps_per_epoch
        same = [s for s in self.snapshots if s["epoch"] == epoch]
        if same and not value > same[0]["score"]:
            return
        pool = [s for s in self.snapshots if s["epoch"] != epoch]
        pool.append({"epoch": epoch, "step": step, "score": value, "model": None})
        pool.sort(key=lambda s: (-s["score"], s["step"]))
        pool = pool[: self.size]
        for snap in pool:
            if snap["model"] is None:  # held in host memory, not an accelerator's
                snap["model"] = {k: v.cpu() for k, v in weights().items()}
        self.snapshots = pool

    def form_ensemble(
        self, step: int, scorer: Scorer, validation_set, selection: Selection, baseline_z
    ) -> tuple[dict[str, Any] | None, np.ndarray | None]:
        """At the end of training: the mean of the logits of the pool's best 2..N snapshots, the one with the best
        validation score, becomes the kept model at ``step`` where the best-model rule takes it over the selected model
        (``baseline_z(logits)``: its gain over a guarded warm start). Returns the ensemble's log record (None
        without two snapshots) and its validation logits when it is kept (else None)."""
        self.ensemble = self.ensemble_metrics = None
        if len(self.snapshots) < 2:
            return None, None
        logits = scorer.logits_of([snap["model"] for snap in self.snapshots], validation_set)
        best: tuple[int, dict[str, Any], np.ndarray] | None = None
        for k in range(2, len(self.snapshots) + 1):
            mean = np.mean(logits[:k], axis=0).astype(np.float32)
            metrics = metrics_of(validation_set, mean)
            if best is None or score(metrics) > score(best[1]):
                best = (k, metrics, mean)
        assert best is not None  # two snapshots or more: the loop ran
        k, metrics, mean = best
        if selection.guarding_baseline:
            metrics["baseline_z"] = baseline_z(mean)
        steps = [int(s["step"]) for s in self.snapshots[:k]]
        taken = selection.accepts(metrics)
        record = {"event": "ensemble", "step": step, "members": steps, "selected": taken, **metrics}
        if not taken:
            return record, None
        self.ensemble, self.ensemble_metrics = steps, metrics
        return record, mean

    def states(self) -> list[dict[str, torch.Tensor]]:
        """The kept ensemble's members' weights."""
        if self.ensemble is None:
            raise ValueError("no snapshot ensemble is kept")
        return snapshot_states(self.snapshots, self.ensemble)

    def ensemble_logits(self, scorer: Scorer, dataset) -> np.ndarray:
        """The kept ensemble's logits on ``dataset``: its members' logits averaged (not calibrated)."""
        return np.mean(scorer.logits_of(self.states(), dataset), axis=0).astype(np.float32)
