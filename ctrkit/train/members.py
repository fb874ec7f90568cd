"""The seed ensemble (``seed_ensemble``, and ``small_batch``'s second batch size): members trained one after another,
each a run of its own, and the mean of their logits kept where validation prefers it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ctrkit.train.finish import kept_states


def _mean(logits: list[np.ndarray]) -> np.ndarray:
    """The mean of several models' logits (float64 sum, float32 out), as ``Ensemble`` averages them."""
    return np.mean(np.asarray(logits, np.float64), axis=0).astype(np.float32)


class SeedEnsemble:
    """Trains and forms a seed ensemble: a run's members, each trained by a trainer of its own.

    Args:
        spec: the resolved run (``run.RunSpec``).
        batches: the batch sizes the members take turns over (member m at ``batches[m % len(batches)]``).
        device, eval_dtype: where and in which autocast dtype (None: none) members are scored.
        build_trainer: ``build_trainer(m)``: member m's trainer, its model fresh.
        trainer: the trainer of member ``member``, built already (a resumed one, or the first).
        member: that member's index; ``members_done``: the members trained before it (a checkpoint's).
        member_ensemble: the kept members of a finished ensemble (a checkpoint's), else None.
        test_set: the test mapping, scored once at the end (None: none).
    """

    def __init__(
        self,
        spec: Any,
        batches: list[int],
        device: torch.device,
        eval_dtype: torch.dtype | None,
        build_trainer: Callable[[int], Any],
        trainer: Any,
        member: int,
        members_done: list[dict[str, Any]],
        member_ensemble: list[int] | None,
        test_set,
    ) -> None:
        self.spec, self.batches, self.device, self.eval_amp_dtype = spec, batches, device, eval_dtype
        self.build_trainer, self.trainer, self.member = build_trainer, trainer, member
        self.members_done, self.member_ensemble, self.test_set = members_done, member_ensemble, test_set

    def fit(self, count: int) -> dict[str, Any]:
        """A seed ensemble: members ``self.member``.. trained one after another, each as its own run (its
        selection, snapshot ensemble and checkpoints; the checkpoint also holds the members done), then the
        mean of their logits kept where validation prefers it to the first member (``_form_members``), and the
        test scored once.
        """
        test_set = self.test_set
        trainer = self.trainer
        if self.member_ensemble is not None and not trainer.selection.stopped and trainer.step < trainer.total_steps:
            raise ValueError(
                f"the checkpoint holds a finished seed ensemble whose members trained {trainer.step} steps, and this "
                f"run would train up to {trainer.total_steps}: a seed ensemble is not trained further; retrain it, or "
                "resume with the settings it was trained with"
            )
        while len(self.members_done) < count:
            if self.member != len(self.members_done):  # the next member: a fresh model and run
                self.member = len(self.members_done)
                self.trainer = self.build_trainer(self.member)
            trainer = self.trainer
            trainer.log.member, trainer.members_done, trainer.test_set = self.member, self.members_done, None
            batch = trainer.cfg.batch_size
            self._member_board(
                trainer, f"seed{trainer.cfg.seed}" + (f"-batch{batch}" if self.member % len(self.batches) else "")
            )
            result = trainer.fit()
            self.members_done = [
                *self.members_done,
                {
                    "seed": trainer.cfg.seed,
                    "batch_size": batch,
                    "best_step": result["best_step"],
                    "steps": trainer.step,
                    "stopped_early": result["stopped_early"],
                    "validation": result.get("validation"),
                    "models": kept_states(trainer),
                },
            ]
        return self._form_members(test_set)

    def _member_logits(self, members: list[dict[str, Any]], dataset) -> np.ndarray:
        """``dataset``'s logits under the model of ``members`` (``checkpoint.member_model``)."""
        from ctrkit.checkpoint import member_model
        from ctrkit.eval.evaluator import predict_logits
        from ctrkit.models.registry import create_model

        def build(state):
            model = create_model(self.spec.model, self.spec.model_config)
            model.load_state_dict(state)
            return model.to(self.device)

        model = member_model(members, build)
        return predict_logits(model, dataset, self.device, self.spec.train.eval_batch_size, self.eval_amp_dtype)

    def _group_model(self, indices: list[int], validation) -> dict[str, Any]:
        """The kept model of the members ``indices`` (one batch size's, in seed order): the mean of the logits
        of its distinct members (those whose validation logits differ: members that all kept the warm-start
        regression are one model) when that scores higher on validation than the first member, the model a
        run of one would keep, by ``min_delta`` and its log loss is below the warm start's (under
        ``warm_start_logloss``); else the first member. Returns ``kept`` (member indices), ``mean`` (the
        mean's validation metrics), ``taken`` (the mean kept), ``validation`` (the kept model's metrics) and
        ``logits`` (its validation logits)."""
        from ctrkit.eval.evaluator import metrics_of
        from ctrkit.train.selection import prefers, score

        trainer, members, cfg = self.trainer, self.members_done, self.spec.train
        first = members[indices[0]]
        distinct: list[int] = []  # the first member is always distinct, so always kept
        seen: list[np.ndarray] = []
        for i in indices:
            logits = self._member_logits([members[i]], validation)
            if not any(np.array_equal(logits, other) for other in seen):
                distinct.append(i)
                seen.append(logits)
        mean = _mean(seen)
        metrics = metrics_of(validation, mean)
        # the best-model rule against the first member (without its z part: no mean is scored against the warm
        # start's logits)
        taken = len(distinct) > 1 and prefers(
            metrics, score(first["validation"]), cfg.min_delta, trainer.selection.loss_to_beat, None
        )
        return {
            "kept": distinct if taken else [indices[0]],
            "mean": metrics,
            "taken": taken,
            "validation": metrics if taken else first["validation"],
            "logits": mean if taken else seen[0],
        }

    def _form_members(self, test_set) -> dict[str, Any]:
        """The kept model of a seed ensemble: each batch size's kept model (``_group_model``), and of those the
        one with the higher validation AUC (the run's batch's on a tie), and its logit scale (``calibrate``).
        Saved (``member_ensemble``, ``calibration``), then the test scored once: each kept member's logits,
        averaged and scaled as on validation."""
        from ctrkit.calibration import choose_calibration
        from ctrkit.checkpoint import kept_model, save_checkpoint
        from ctrkit.train.selection import score

        trainer, members, batches = self.trainer, self.members_done, self.batches
        validation = trainer.validation_set
        groups = [list(range(g, len(members), len(batches))) for g in range(len(batches))]
        formed = [self._group_model(indices, validation) for indices in groups]
        chosen = max(range(len(formed)), key=lambda g: (score(formed[g]["validation"]), -g))
        kept, first = formed[chosen]["kept"], members[groups[chosen][0]]
        trainer.log.member = None  # the run's own records from here on
        self._member_board(trainer, None)
        trainer.log.write(self._ensemble_record(formed, chosen))
        self.member_ensemble = kept
        scale: float | None = None
        fit: dict[str, Any] = {}
        if self.spec.train.calibrate != "off":  # the kept model's logit scale, fitted on its validation logits
            logits = formed[chosen]["logits"]
            scale, fit = choose_calibration(logits, validation.labels(), self.spec.train.calibrate)
            trainer.log.write({"event": "calibration", "step": trainer.step, **fit})
        if trainer.checkpoints.save_path is not None and trainer.main:  # ``model``: the kept batch's first weights
            final = replace(
                trainer.store.checkpoint().resuming(member=len(members) - 1),
                model=first["models"][0],
                members=members,
                kept=kept_model(members=kept),
                calibration=scale,
            )
            save_checkpoint(trainer.checkpoints.save_path, final)
        result = self._members_result(formed[chosen], first, batches[chosen], fit)
        if test_set is not None and len(test_set):
            result.update(self._members_test(test_set, formed[chosen], scale, result, batches[chosen]))
        trainer.log.close()
        return result

    def _ensemble_record(self, formed: list[dict[str, Any]], chosen: int) -> dict[str, Any]:
        """The log record of a seed ensemble's choice (each batch size's, with several)."""
        members, batches = self.members_done, self.batches
        seeds = [m["seed"] for m in members]
        record = {
            "event": "seed_ensemble",
            "step": self.trainer.step,
            "seeds": seeds[:: len(batches)],
            "selected": formed[chosen]["taken"],
            **formed[chosen]["mean"],
        }
        if len(batches) > 1:
            record["batch_size"] = batches[chosen]
            record["batches"] = [
                {
                    "batch_size": b,
                    "kept": [seeds[i] for i in f["kept"]],
                    "selected": f["taken"],
                    "auc": f["validation"]["auc"],
                    "logloss": f["validation"]["logloss"],
                }
                for b, f in zip(batches, formed)
            ]
        return record

    def _members_result(
        self, chosen: dict[str, Any], first: dict[str, Any], batch: int, fit: dict[str, Any]
    ) -> dict[str, Any]:
        """A seed ensemble's result (before the test): the kept model's validation, each member's."""
        members, kept, selection = self.members_done, chosen["kept"], self.trainer.selection
        result: dict[str, Any] = {
            "step": self.trainer.step,
            "best_step": first["best_step"],
            "stopped_early": first["stopped_early"],
            "validation": chosen["validation"],
            "batch_size": batch,
            "members": [
                {
                    "seed": m["seed"],
                    "batch_size": m.get("batch_size"),
                    "best_step": m["best_step"],
                    "steps": m["steps"],
                    "validation_auc": (m["validation"] or {}).get("auc"),
                }
                for m in members
            ],
            "member_ensemble": [members[i]["seed"] for i in kept],
            "models_per_request": sum(len(members[i]["models"]) for i in kept),
        }
        if chosen["taken"]:
            result["single_validation"] = first["validation"]  # what the ensemble is set beside
        if selection.baseline_metrics() is not None:
            result["baseline"] = selection.baseline_metrics()
        if fit:
            result["calibration"] = fit
        return result

    def _members_test(
        self, test_set, chosen: dict[str, Any], scale: float | None, result: dict[str, Any], batch: int
    ) -> dict[str, Any]:
        """The test scored once under a seed ensemble's kept model: each kept member's logits, averaged and scaled
        as on validation."""
        from ctrkit.train.scoring import scored_with_parts

        logits = [self._member_logits([self.members_done[i]], test_set) for i in chosen["kept"]]
        test = scored_with_parts(test_set, _mean(logits), scale, logits[0] if chosen["taken"] else None)
        self.trainer.log.write(
            {
                "event": "test",
                "mapping": "test",
                "step": self.trainer.step,
                "best_step": result["best_step"],
                "seed_ensemble": result["member_ensemble"],
                "batch_size": batch,
                **test,
            }
        )
        return test

    def _member_board(self, trainer, name: str | None) -> None:
        """``--tensorboard DIR`` in a seed ensemble: each member's scalars in ``DIR/<name>`` (``seed<N>``, a run
        of its own in TensorBoard, its steps its own), the run's final ones (None) in ``DIR``."""
        if self.spec.tensorboard is None:
            return
        directory = Path(self.spec.tensorboard)
        trainer.log.use_board(directory / name if name is not None else directory)
