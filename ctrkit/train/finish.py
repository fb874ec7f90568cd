"""The end of a trainer's run, after its last step: the snapshot ensemble formed, the kept model calibrated, saved
and put into the model, the test mapping scored once; and the kept model's weights handed on (``kept_states``)."""

from __future__ import annotations

import time
from typing import Any

import torch

from ctrkit.calibration import choose_calibration
from ctrkit.train.scoring import scored_with_parts


def finish(trainer: Any) -> dict[str, Any]:
    """Ends ``trainer``'s run (a ``Trainer`` past its last step); returns the run's result."""
    t = trainer
    ensemble_logits = _form_ensemble(t)
    if t.log.member is None:  # a seed ensemble's members are calibrated together (train/members.py)
        _calibrate(t, ensemble_logits)
    t.store.save()  # the best weights (or ensemble) as the model, the last ones to resume from
    t.selector.keep_best(t.step)
    sel, pool = t.selection, t.pool
    result: dict[str, Any] = {"step": t.step, "best_step": sel.best_step, "stopped_early": sel.stopped}
    if sel.best_metrics is not None:
        result["validation"] = sel.best_metrics
    if sel.baseline_metrics() is not None:  # the warm start's regression, for comparison
        result["baseline"] = sel.baseline_metrics()
    if pool.ensemble is not None:
        result["ensemble"], result["validation"] = pool.ensemble, pool.ensemble_metrics
        result["single_validation"] = sel.best_metrics  # what the ensemble is set beside
        result["models_per_request"] = len(pool.ensemble)
    if t.calibration_record:
        result["calibration"] = t.calibration_record
    if t.test_set is not None and len(t.test_set):
        result.update(_score_test(t, result["best_step"]))
    t.log.close()
    return result


def _form_ensemble(t: Any):
    """The snapshot ensemble formed (``SnapshotPool.form_ensemble``); its validation logits where it is kept."""
    record, logits = t.pool.form_ensemble(t.step, t.scorer, t.validation_set, t.selection, t.selector.baseline_z)
    if record is not None:
        t.log.write(record)
    if logits is not None:
        t.checkpoints.changed()  # the final checkpoint records it
    return logits


def _calibrate(t: Any, ensemble_logits) -> None:
    """Fits the kept model's logit scale on validation (``calibrate``; ``calibration.py``) and logs the fit; the
    checkpoint saved next stores it. ``ensemble_logits``: a kept snapshot ensemble's validation logits."""
    t.calibration, t.calibration_record = None, {}
    if not t.selector.active or t.cfg.calibrate == "off":
        return
    logits = ensemble_logits if ensemble_logits is not None else t.selector.calibration_logits()
    t.calibration, t.calibration_record = choose_calibration(logits, t.validation_set.labels(), t.cfg.calibrate)
    t.log.write({"event": "calibration", "step": t.step, **t.calibration_record})
    if t.calibration is not None:
        t.checkpoints.changed()  # the final checkpoint records it


def _score_test(t: Any, best_step: int | None) -> dict[str, Any]:
    """The test mapping scored once under the kept model (and its parts)."""
    started = time.perf_counter()
    ensemble = t.pool.ensemble
    logits = t.scorer.logits(t.test_set)
    kept = logits if ensemble is None else t.pool.ensemble_logits(t.scorer, t.test_set)
    test = scored_with_parts(t.test_set, kept, t.calibration, logits if ensemble else None)
    if ensemble is not None:
        test["ensemble"] = ensemble
    t.log.write(
        {
            "event": "test",
            "mapping": "test",
            "step": t.step,
            "best_step": best_step,
            **test,
            "seconds": round(time.perf_counter() - started, 3),
        }
    )
    return test


def kept_states(trainer: Any) -> list[dict[str, torch.Tensor]]:
    """After ``finish``: the state dicts of ``trainer``'s kept model, in host memory (several for an ensemble)."""
    if trainer.pool.ensemble is not None:
        return [{k: v.cpu() for k, v in state.items()} for state in trainer.pool.states()]
    return [{k: v.cpu() for k, v in trainer.local_state().items()}]
