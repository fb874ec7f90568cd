"""The snapshot ensemble: the best evaluations of the best epochs kept, and their mean kept as the model
where validation prefers it (``snapshot_ensemble``); the test scores of the kept model and its parts."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from ctrkit.calibration import calibrated
from ctrkit.checkpoint import (
    snapshot_states,
)
from ctrkit.eval.evaluator import metrics_of
from ctrkit.train.selection import score


def scored_with_parts(dataset, logits: np.ndarray, scale: float | None, single: np.ndarray | None) -> dict[str, Any]:
    """``dataset``'s metrics under the kept model: ``logits`` (an ensemble's mean, or one model's) with the logit
    ``scale`` applied; beside them, the AUC and log loss of the logits unscaled (``uncalibrated``, when scaled) and
    of the ensemble's best single model (``single``: its logits, unscaled), so a run says what each part earned."""
    test = metrics_of(dataset, calibrated(logits, scale))
    if scale is not None:
        test["uncalibrated"] = _auc_logloss(metrics_of(dataset, logits))
    if single is not None:
        test["single"] = _auc_logloss(metrics_of(dataset, single))
    return test


def _auc_logloss(metrics: dict[str, Any]) -> dict[str, float]:
    return {k: metrics[k] for k in ("auc", "logloss")}


def _exchange(attr: str, store: dict, key: str, state: dict[str, torch.Tensor], full: str) -> None:
    """Exchanges the data of module tensor ``store[key]`` with ``state[full]`` (a parameter keeps its object)."""
    if attr == "tier":  # tables on disk: reads go to ``state``'s table instead (``DiskTier.override``)
        store.override, state[full] = state[full], store.override
    elif attr == "param":
        ours = store[key].data
        store[key].data = state[full]
        state[full] = ours
    else:
        store[key], state[full] = state[full], store[key]


class SnapshotPool:
    """The snapshot pool and the ensemble formed from it (a mixin of ``Trainer``)."""

    def _logits_of(self, states: list[dict[str, torch.Tensor]], dataset) -> list[np.ndarray]:
        """``dataset``'s logits (float64) under each of ``states`` in turn; the model's weights are as before
        afterwards."""
        out = []
        for state in states:
            with self._weights(state):
                out.append(np.asarray(self._logits(dataset), np.float64))
        return out

    @contextlib.contextmanager
    def _weights(self, state: dict[str, torch.Tensor]) -> Iterator[None]:
        """Inside, the model computes with ``state``'s tensors: each parameter's and buffer's data is exchanged
        with ``state``'s (no copy of the tables) and exchanged back on the way out."""
        slots = []
        with torch.no_grad():
            for name, module in self._inner.named_modules():
                prefix = f"{name}." if name else ""
                if getattr(module, "disk", None) is not None and f"{prefix}weight" in state:
                    slots.append(("tier", module.disk, "weight", f"{prefix}weight"))
                for attr, store in (("param", module._parameters), ("buffer", module._buffers)):
                    for key, t in store.items():
                        full = prefix + key
                        if attr == "param" and key == "weight" and getattr(module, "disk", None) is not None:
                            continue  # its cache: the tier's slot above reads the table
                        if t is None or full not in state or state[full].shape != t.shape:
                            continue
                        slots.append((attr, store, key, full))
            missing = set(state) - {s[3] for s in slots}
            if missing:
                raise ValueError(f"weights {sorted(missing)[:3]} do not fit the model")
            swap = lambda: [_exchange(attr, store, key, state, full) for attr, store, key, full in slots]  # noqa: E731
            swap()
            try:
                yield
            finally:
                swap()

    def _ensemble_logits(self, dataset) -> np.ndarray:
        """The selected ensemble's logits on ``dataset``: its members' logits averaged (not calibrated)."""
        logits = self._logits_of(snapshot_states(self.snapshots, self.ensemble), dataset)
        return np.mean(logits, axis=0).astype(np.float32)

    def kept_states(self) -> list[dict[str, torch.Tensor]]:
        """After ``fit``: the state dicts of the kept model, in host memory (several for an ensemble)."""
        if self.ensemble is not None:
            return [{k: v.cpu() for k, v in state.items()} for state in snapshot_states(self.snapshots, self.ensemble)]
        return [{k: v.cpu() for k, v in self._local_state().items()}]

    def _pool_size(self) -> int:
        """``snapshot_ensemble``; 1 (no pool) where there is nothing to select on (the plan refuses more there)."""
        if self.env is not None or self.validation_set is None or len(self.validation_set) == 0:
            return 1
        return self.cfg.snapshot_ensemble

    def _keep_snapshot(self, metrics: dict[str, Any], state: dict[str, torch.Tensor] | None) -> None:
        """Puts this evaluation into the snapshot pool when it is its epoch's best so far and among the
        ``pool_size`` best epochs (the pool: the best evaluation of each of the best epochs, best first).
        ``state``: these weights when already copied (the selected ones)."""
        if self.pool_size < 2 or self.step == 0:
            return
        value = score(metrics)
        epoch = (self.step - 1) // self.steps_per_epoch
        same = [s for s in self.snapshots if s["epoch"] == epoch]
        if same and not value > same[0]["score"]:
            return
        pool = [s for s in self.snapshots if s["epoch"] != epoch]
        pool.append({"epoch": epoch, "step": self.step, "score": value, "model": None})
        pool.sort(key=lambda s: (-s["score"], s["step"]))
        pool = pool[: self.pool_size]
        for snap in pool:
            if snap["model"] is None:  # held in host memory, not an accelerator's
                snap["model"] = {k: v.cpu() for k, v in (state if state is not None else self._local_state()).items()}
        self.snapshots = pool

    def _form_ensemble(self) -> np.ndarray | None:
        """At the end of training: the mean of the logits of the pool's best 2..N snapshots, the one with the
        best validation score, becomes the kept model when selection would take it over the selected model
        (higher by ``min_delta``; the warm start's log-loss and z rules). Returns its validation logits when
        it is kept, else None."""
        self.ensemble = self.ensemble_metrics = None
        if len(self.snapshots) < 2:
            return None
        logits = self._logits_of([snap["model"] for snap in self.snapshots], self.validation_set)
        best = None
        for k in range(2, len(self.snapshots) + 1):
            mean = np.mean(logits[:k], axis=0).astype(np.float32)
            metrics = metrics_of(self.validation_set, mean)
            if best is None or score(metrics) > score(best[1]):
                best = (k, metrics, mean)
        k, metrics, mean = best
        sel = self.selection
        if sel.guarding_baseline:
            metrics["baseline_z"] = self._baseline_z(mean)
        steps = [int(s["step"]) for s in self.snapshots[:k]]
        taken = sel.accepts(metrics)
        self._log({"event": "ensemble", "step": self.step, "members": steps, "selected": taken, **metrics})
        if not taken:
            return None
        self.ensemble, self.ensemble_metrics = steps, metrics
        self._saved_step = None  # the final checkpoint records it
        return mean
