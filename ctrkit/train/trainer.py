"""The training loop: batches in, optimizer steps, periodic evaluation, logs and checkpoints.

A ``Trainer`` is composed of parts, each in its own module: the step (``step.TrainStep``), the scorer
(``scoring.Scorer``), model selection (``selection.Selector``, the one best-model rule), the snapshot pool
(``snapshots.SnapshotPool``), the checkpoints (``state.Checkpointer``), the warm start (``warm_start``) and the log
(``run_log.RunLog``). The trainer holds the model, its optimizers and the step count, and passes each part what
it needs.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ctrkit.calibration import choose_calibration
from ctrkit.checkpoint import Checkpoint, kept_model, rng_state, set_rng_state
from ctrkit.checkpoint_shards import MappedSource, read_rank_file
from ctrkit.config import TrainConfig
from ctrkit.data.dataset import SplitBinaryDataset, split_tail
from ctrkit.data.device_feed import DeviceFeed, narrow_on
from ctrkit.data.loader import BatchLoader
from ctrkit.device import eval_dtype_for
from ctrkit.distributed.env import DistEnv, all_reduce_sum
from ctrkit.models.contract import redraw_tables, table_parameter_ids
from ctrkit.models.dynamic import DynamicIds
from ctrkit.models.embeddings import fill_pending_tables
from ctrkit.models.registry import config_to_dict
from ctrkit.models.tiered_tables import tiered_keys
from ctrkit.progress import tqdm
from ctrkit.train.best_weights import copy_state, kept_on_disk
from ctrkit.train.memory import tables_directory
from ctrkit.train.optim import LRSchedule, build_optimizers
from ctrkit.train.plan import resolved_train
from ctrkit.train.run_log import RunLog, process_seconds
from ctrkit.train.scoring import Scorer, scored_with_parts
from ctrkit.train.selection import Selection, Selector
from ctrkit.train.snapshots import SnapshotPool
from ctrkit.train.state import (
    NO_OPTIMIZER_STATE,
    Checkpointer,
    check_continuable,
    check_finite,
    check_resumable,
    continued_tables,
    grown_optimizer_states,
    load_optimizer_states,
)
from ctrkit.train.step import TrainStep
from ctrkit.train.warm_start import describe_fit, fit_normalizer, fit_warm_start


def schedule_of(cfg: TrainConfig, total_steps: int) -> LRSchedule:
    """The LR schedule of a config whose schedule fields the plan has set (``plan.resolved_train``)."""
    return LRSchedule(
        cfg.lr,
        cfg.warmup_steps,
        cfg.decay_start_step,
        cfg.decay_steps,
        cfg.decay_power,
        cfg.end_lr,
        cfg.lr_schedule,
        total_steps,
    )


@dataclass
class RunInfo:
    """What a checkpoint needs to know about the run besides the weights."""

    model_name: str
    model_config: Any
    spec_summary: dict[str, Any]
    preprocessing: dict[str, Any] | None = None  # the dataset's raw rows -> inputs (``RowTransform.to_state``)


class Window:
    """The losses and samples since the last log record (the loss summed on the device, read at records only)."""

    def __init__(self, device: torch.device):
        self.loss_sum = torch.zeros((), device=device)
        self.steps = self.samples = 0
        self.started = time.perf_counter()

    def add(self, loss: torch.Tensor, samples: int) -> None:
        self.loss_sum += loss
        self.steps += 1
        self.samples += samples

    def restart(self) -> None:
        self.loss_sum.zero_()
        self.steps = self.samples = 0
        self.started = time.perf_counter()


class Trainer:
    """Trains a model on a split-binary dataset.

    Args:
        model: the model (already on ``device``).
        info: model name/config and the dataset's spec summary, stored in checkpoints.
        train_set: the training mapping.
        test_set: the test mapping, scored once at the end with the selected weights (None: not scored).
        cfg: TrainConfig.
        device: the device to train on.
        amp_dtype: autocast dtype or None.
        save_path: where to write checkpoints (at each evaluation, every ``checkpoint_every`` steps
            and at the end), or None.
        log_path: JSON-lines log file, or None.
        tensorboard_dir: also write the log's scalars as TensorBoard event files here, or None.
        progress: show a progress bar.
        env: this rank's place in a hybrid-parallel job (``model`` is then a HybridModel), or None.
            Every rank reads its share of each global batch; rank 0 logs, shows progress and writes
            checkpoints, which every rank helps assemble (whole tables).
        validation_set: the validation mapping; None holds out the last ``cfg.validation_fraction`` of
            ``train_set`` instead (none at 0: no model selection, the last weights are kept).
        run_record: the resolved run, written as YAML beside the checkpoint (``save_path`` with suffix
            ``.yaml``) when this run first saves, never before: a run that saves nothing leaves what is
            there untouched.

    Evaluations during training score the validation data only. The run keeps the weights of the best
    validation AUC, multiplies the learning rates by ``plateau_factor`` on a plateau and stops after
    ``early_stopping_patience`` evaluations without improvement; checkpoints hold the best weights as
    ``model`` (what evaluation, export and serving read) and the current ones for resuming.
    """

    def __init__(
        self,
        model: nn.Module,
        info: RunInfo,
        train_set: SplitBinaryDataset,
        test_set: SplitBinaryDataset | None,
        cfg: TrainConfig,
        device: torch.device,
        amp_dtype: torch.dtype | None = None,
        save_path: str | os.PathLike | None = None,
        log_path: str | os.PathLike | None = None,
        progress: bool = True,
        env: DistEnv | None = None,
        validation_set: SplitBinaryDataset | None = None,
        run_record: dict[str, Any] | None = None,
        tensorboard_dir: str | os.PathLike | None = None,
    ):
        cfg = cfg.resolve(info.model_name)
        if len(train_set) == 0:  # before anything is made (the log's TensorBoard directory)
            raise ValueError(f"the training mapping '{train_set.mapping}' holds no samples")
        self.env, self.main = env, env is None or env.is_main
        self.log = RunLog(log_path, tensorboard_dir, self.main)
        if validation_set is None and cfg.validation_fraction > 0:
            train_set, validation_set = split_tail(train_set, cfg.validation_fraction)
        self.model, self.info, self.device, self.amp_dtype = model, info, device, amp_dtype
        self.train_set, self.validation_set, self.test_set = train_set, validation_set, test_set
        narrow = narrow_on(device)  # a GPU's batches: read narrow and pinned, copied ahead on a side stream
        self.loader = BatchLoader(
            train_set, cfg.batch_size, shuffle=True, seed=cfg.seed, part=env and env.part, narrow=narrow
        )
        self.feed = DeviceFeed(device)
        self.started = False  # the first step of this process taken (logged once)
        self.steps_per_epoch = len(self.loader)
        cfg, _ = resolved_train(cfg, self.steps_per_epoch)  # the plan's values (a run's plan has set them all)
        self.cfg = cfg
        for m in model.modules():  # raw ids: admission and eviction as the run says
            if isinstance(m, DynamicIds):
                m.configure(cfg.admit_after, cfg.eviction, cfg.count_half_life)
        self.progress = progress and self.main
        self.epochs = cfg.epochs
        planned = self.epochs * self.steps_per_epoch
        self.total_steps = min(planned, cfg.max_steps) if cfg.max_steps else planned
        self.schedule = schedule_of(cfg, planned)
        self.optimizers = build_optimizers(
            model, cfg.optimizer, cfg.lr, cfg.embedding_optimizer, cfg.embedding_lr, cfg.wide_optimizer, cfg.wide_lr
        )
        self.step_fn = TrainStep(
            model, self.optimizers, device, amp_dtype, cfg.compile, cfg.embedding_l2, cfg.weight_decay, cfg.split_batch
        )
        self.step = 0
        self._build_parts(save_path, run_record)

    def _build_parts(self, save_path, run_record: dict[str, Any] | None) -> None:
        """The scorer, selection, snapshot pool and checkpoints, and the run's state besides the weights."""
        cfg, env = self.cfg, self.env
        self.window = Window(self.device)
        self._table_ids = table_parameter_ids(self.model)
        eval_dtype = eval_dtype_for(self.device, cfg.eval_dtype, self.amp_dtype, cfg.precision_asked)  # scoring's
        self.scorer = Scorer(self.model, self._inner, self.device, cfg.eval_batch_size, eval_dtype, env)
        rule = Selection(
            cfg.early_stopping_patience,
            cfg.plateau_patience,
            cfg.plateau_factor,
            cfg.min_delta,
            cfg.warm_start_z,
            cfg.warm_start_logloss,
        )
        disk = cfg.best_weights == "disk" and self.device.type == "cpu"
        best_dir = tables_directory(save_path) if disk else None
        self.selector = Selector(rule, self.validation_set, self.scorer, self._local_state, best_dir)
        # the snapshot pool (``snapshot_ensemble``); none where there is nothing to select on (the plan refuses it)
        pool = 1 if env is not None or not self.selector.active else cfg.snapshot_ensemble
        self.pool = SnapshotPool(pool, self.steps_per_epoch)
        self.checkpoints = Checkpointer(save_path, env, run_record, self.log)
        self.members_done: list[dict[str, Any]] = []  # in a seed ensemble (train/run.py): the members trained before
        self.calibration: float | None = None  # the kept model's logit scale (``calibrate``), set at the end
        self.calibration_record: dict[str, Any] = {}  # ... and its fit, as logged
        self.continued = False  # started from another run's trained model (``continue_from``)
        # set by a seed ensemble's Run: the first member's first-order fit, which later members (the same data and
        # the same normaliser, so the same fit) take instead of fitting again (``warm_start.fit_warm_start``)
        self.warm_start_cache: dict[str, Any] | None = None

    @property
    def member(self) -> int | None:
        """In a seed ensemble: this member's index (its log records say so), else None."""
        return self.log.member

    @member.setter
    def member(self, value: int | None) -> None:
        self.log.member = value

    @property
    def selection(self) -> Selection:
        return self.selector.selection

    @property
    def save_path(self) -> Path | None:
        return self.checkpoints.save_path

    @property
    def _inner(self) -> nn.Module:
        """The model whose state dict this process holds (a HybridModel's wrapped model: its shards)."""
        return self.model.model if self.env is not None else self.model

    def _local_state(
        self, into: dict[str, torch.Tensor] | None = None, on_disk: bool = False
    ) -> dict[str, torch.Tensor]:
        """A copy of the weights this process holds (the whole model, or a rank's shards and replicas); with
        ``into`` (an earlier copy), copied into its tensors where their shapes fit, so that replacing the best
        weights never holds two copies of the tables at once; with ``on_disk`` and ``best_weights`` disk, the
        tables are copied to disk (``best_weights.copy_state``)."""
        return copy_state(self._inner.state_dict(), into, self.selector.best_dir if on_disk else None)

    def eval_steps(self) -> set[int]:
        """Global steps after which to evaluate: evenly spaced within each epoch, plus the last step."""
        spe = self.steps_per_epoch
        points = {self.total_steps}
        if self.cfg.evals_per_epoch:
            for e in range(self.epochs):
                for k in range(1, self.cfg.evals_per_epoch + 1):
                    points.add(e * spe + math.ceil(k * spe / self.cfg.evals_per_epoch))
        return {p for p in points if p <= self.total_steps}

    @property
    def finished(self) -> bool:
        return self.step >= self.total_steps or self.selection.stopped

    def fit(self) -> dict[str, Any]:
        """Trains until ``total_steps`` or the early-stopping patience runs out, keeps the best validation
        weights, and scores the test mapping once with them.

        Returns:
            The test metrics (``auc``, ``logloss``, ...) when there is a test mapping, with ``step`` (steps
            trained), ``best_step`` (the selected weights' step) and ``validation`` (their validation metrics).
        """
        self._log_start()
        if self.step == 0 and self.selection.best_step is None and not self.continued:
            self._prepare()
        fill_pending_tables(self.model)  # tables built undrawn (``storage.FILLED_LATER``) that nothing wrote
        bar = tqdm(
            total=self.total_steps,
            initial=self.step,
            desc="train",
            unit="step",
            disable=not self.progress,
            dynamic_ncols=True,
        )
        self.model.train()
        try:
            self._train(bar)
        finally:
            bar.close()
        return self._finish()

    def _log_start(self) -> None:
        self.log.write(
            {
                "event": "start",
                "unix_time": round(self.log.unix_start(), 3),
                "step": self.step,
                "total_steps": self.total_steps,
                "steps_per_epoch": self.steps_per_epoch,
                "train_samples": len(self.train_set),
                "validation_samples": len(self.validation_set) if self.validation_set is not None else 0,
                "model": self.info.model_name,
                "config": self.cfg.to_dict(),
                "device": str(self.device),
                "threads": torch.get_num_threads(),
            }
        )

    def _prepare(self) -> None:
        """Before the first step of a new run: the input normaliser fitted and the warm start (evaluated at step 0,
        so selection can keep it). A continued model keeps the inputs' scales and buckets it was trained with."""
        fitted = fit_normalizer(self._inner, self.train_set)
        if fitted is not None:
            self.log.write({"event": "numerical_normalizer", "step": 0, **fitted})
        if not self.cfg.linear_warm_start:
            return
        fit = fit_warm_start(self.model, self._inner, self.train_set, self.validation_set, self.warm_start_cache)
        if fit is None:
            return
        self.log.write({"event": "warm_start", "step": 0, **fit})
        if self.progress:
            tqdm.write(describe_fit(fit))
        self.validate(baseline=True)

    def _train(self, bar: tqdm) -> None:
        """Steps until the run is finished: each epoch's batches from where the run stands, an evaluation or a
        checkpoint where one is due."""
        cfg, window, eval_steps = self.cfg, self.window, self.eval_steps()
        window.restart()
        while not self.finished:
            epoch, start = divmod(self.step, self.steps_per_epoch)
            if epoch > 0 and start == 0 and (self.selection.reinit or cfg.reinit_embeddings == "on"):
                self.reinit_embeddings(epoch)
            batches = self.feed(self.loader.epoch(epoch, start))
            try:
                order = self.loader.batch_order(epoch)[start:]
                for k, batch in enumerate(batches):
                    if not self.started:  # the process's start to its first step: the model built, the data open
                        self.started = True
                        self.log.write({"event": "first_step", "step": self.step, "since_start": process_seconds()})
                    lo, hi = self.loader.global_bounds(int(order[k]))
                    scale = self.schedule(self.step) / cfg.lr * self.selection.lr_scale
                    wide_scale = None if cfg.schedule_wide else self.selection.lr_scale
                    window.add(
                        self.step_fn(batch, scale, hi - lo if self.env is not None else None, wide_scale), hi - lo
                    )
                    self.step += 1
                    bar.update(1)
                    if self.step % cfg.print_freq == 0 or self.step == self.total_steps:
                        self._log_window(epoch, bar)
                    self._evaluate_or_save(eval_steps, bar)
                    if self.finished:
                        break
            finally:
                batches.close()  # stops the prefetch thread however the loop ended

    def _log_window(self, epoch: int, bar: tqdm) -> None:
        """Logs the window's mean loss and speed (and stops a run whose loss is no longer finite)."""
        window = self.window
        total = float(window.loss_sum) if self.env is None else all_reduce_sum(float(window.loss_sum))
        elapsed = time.perf_counter() - window.started  # after the loss is read: the device's queue drained
        mean_loss = total / window.steps
        if not math.isfinite(mean_loss):
            raise FloatingPointError(
                f"the training loss became {mean_loss} by step {self.step} (lr {self.schedule(self.step - 1):g}); "
                "training stopped and the last checkpoint was kept: lower the learning rate or lengthen the warmup"
            )
        record = {
            "event": "train",
            "step": self.step,
            "epoch": epoch,
            "loss": mean_loss,
            "lr": self.schedule(self.step - 1) * self.selection.lr_scale,
            "samples_per_s": window.samples / max(elapsed, 1e-9),
        }
        self.log.write(record)
        bar.set_postfix(loss=f"{record['loss']:.4f}", samples_s=f"{record['samples_per_s']:,.0f}")
        window.restart()

    def _evaluate_or_save(self, eval_steps: set[int], bar: tqdm) -> None:
        """After a step: the evaluation due at it (and a save, but for the last, which is the final save after
        calibration), else the periodic checkpoint due at it."""
        if self.step in eval_steps:
            t0 = time.perf_counter()
            record = self.validate()
            if record is not None and self.progress:
                bar.write(
                    f"step {self.step}: validation AUC {record['auc']:.4f} logloss {record['logloss']:.4f} "
                    f"(best: step {record['best_step']})"
                )
            if not self.finished:
                self.save()
            self.window.started += time.perf_counter() - t0  # keep samples/s about training
        elif self.cfg.checkpoint_every and self.step % self.cfg.checkpoint_every == 0:
            self.save()

    def validate(self, baseline: bool = False) -> dict[str, Any] | None:
        """Scores the validation data, updates the selection (best weights, plateau, patience), keeps a snapshot,
        redraws the tables where the run is overfitting, and logs it. ``baseline``: this evaluation is of the warm
        start, which a later model must beat by ``warm_start_z`` standard errors to replace."""
        if not self.selector.active:
            return None
        metrics, selected, seconds = self.selector.evaluate(self.step, baseline, reuse=self.pool.size < 2)
        if not baseline:  # in place where nothing else holds the old copy (a snapshot pool may)
            kept = self.selector.best_state if selected else None
            self.pool.keep(self.step, metrics, lambda: kept if kept is not None else self._local_state())
        if not selected and self._overfitting(metrics):  # auto reinit_embeddings: from the best weights
            self.selection.reinit = True
            self._inner.load_state_dict(self.selector.best_state)
            epoch, into = divmod(self.step, self.steps_per_epoch)
            if into:  # at an epoch's end the next epoch's start redraws them
                self.reinit_embeddings(epoch)
        sel = self.selection
        record = {
            "event": "eval",
            "mapping": "validation",
            "step": self.step,
            **metrics,
            "best_step": sel.best_step,
            "lr_scale": sel.lr_scale,
            "seconds": round(seconds, 3),
        }
        self.log.write(record)
        return record

    def _overfitting(self, metrics: dict[str, Any]) -> bool:
        """Auto ``reinit_embeddings``: past the first epoch, the validation AUC fell more than ``reinit_drop`` below
        the best seen (a second pass over the same rows made the model worse)."""
        if self.cfg.reinit_embeddings != "auto" or self.selection.reinit or self.selection.best_step is None:
            return False
        if self.step <= self.steps_per_epoch:  # the first pass: nothing seen twice yet
            return False
        return metrics.get("auc", math.inf) < self.selection.peak_score - self.cfg.reinit_drop

    def reinit_embeddings(self, epoch: int) -> None:
        """``reinit_embeddings``: the deep tables redrawn (draw ``epoch``: the same values at any world size and on
        resuming) and their optimizer state cleared; the first-order tables and the rest kept."""
        params = redraw_tables(self._inner, draw=epoch)
        if params is None:
            return
        for opt in self.optimizers:
            for p in params:
                opt.state.pop(p, None)
        self.log.write({"event": "reinit_embeddings", "step": self.step, "epoch": epoch})

    def _finish(self) -> dict[str, Any]:
        """After the last step: the ensemble formed, the kept model calibrated, saved and put into the model, the
        test scored; returns the run's result."""
        ensemble_logits = self._form_ensemble()
        if self.member is None:  # a seed ensemble's members are calibrated together (train/run.py)
            self._calibrate(ensemble_logits)
        self.save()  # the best weights (or ensemble) as the model, the last ones to resume from
        self.selector.keep_best(self.step)
        sel, pool = self.selection, self.pool
        result: dict[str, Any] = {"step": self.step, "best_step": sel.best_step, "stopped_early": sel.stopped}
        if sel.best_metrics is not None:
            result["validation"] = sel.best_metrics
        if sel.baseline_metrics() is not None:  # the warm start's regression, for comparison
            result["baseline"] = sel.baseline_metrics()
        if pool.ensemble is not None:
            result["ensemble"], result["validation"] = pool.ensemble, pool.ensemble_metrics
            result["single_validation"] = sel.best_metrics  # what the ensemble is set beside
            result["models_per_request"] = len(pool.ensemble)
        if self.calibration_record:
            result["calibration"] = self.calibration_record
        if self.test_set is not None and len(self.test_set):
            result.update(self._score_test(result["best_step"]))
        self.log.close()
        return result

    def _form_ensemble(self):
        """The snapshot ensemble formed (``SnapshotPool.form_ensemble``); its validation logits where it is kept."""
        record, logits = self.pool.form_ensemble(
            self.step, self.scorer, self.validation_set, self.selection, self.selector.baseline_z
        )
        if record is not None:
            self.log.write(record)
        if logits is not None:
            self.checkpoints.changed()  # the final checkpoint records it
        return logits

    def _calibrate(self, ensemble_logits) -> None:
        """Fits the kept model's logit scale on validation (``calibrate``; ``calibration.py``) and logs the fit;
        the checkpoint saved next stores it. ``ensemble_logits``: a kept snapshot ensemble's validation logits."""
        self.calibration, self.calibration_record = None, {}
        if not self.selector.active or self.cfg.calibrate == "off":
            return
        logits = ensemble_logits if ensemble_logits is not None else self.selector.calibration_logits()
        self.calibration, self.calibration_record = choose_calibration(
            logits, self.validation_set.labels(), self.cfg.calibrate
        )
        self.log.write({"event": "calibration", "step": self.step, **self.calibration_record})
        if self.calibration is not None:
            self.checkpoints.changed()  # the final checkpoint records it

    def _score_test(self, best_step: int | None) -> dict[str, Any]:
        """The test mapping scored once under the kept model (and its parts)."""
        started = time.perf_counter()
        ensemble = self.pool.ensemble
        logits = self.scorer.logits(self.test_set)
        kept = logits if ensemble is None else self.pool.ensemble_logits(self.scorer, self.test_set)
        test = scored_with_parts(self.test_set, kept, self.calibration, logits if ensemble else None)
        if ensemble is not None:
            test["ensemble"] = ensemble
        self.log.write(
            {
                "event": "test",
                "mapping": "test",
                "step": self.step,
                "best_step": best_step,
                **test,
                "seconds": round(time.perf_counter() - started, 3),
            }
        )
        return test

    def kept_states(self) -> list[dict[str, torch.Tensor]]:
        """After ``fit``: the state dicts of the kept model, in host memory (several for an ensemble)."""
        if self.pool.ensemble is not None:
            return [{k: v.cpu() for k, v in state.items()} for state in self.pool.states()]
        return [{k: v.cpu() for k, v in self._local_state().items()}]

    # checkpoints

    def save(self) -> None:
        """Checkpoints the current step (once: a step already saved is not written again).

        In a hybrid-parallel run every rank takes part and rank 0 writes.
        """
        if not self.checkpoints.due(self.step):
            return
        check_finite(self.window.loss_sum, self.model, self._table_ids, self.env, self.step, self.cfg.lr)
        state = self._sharded_checkpoint() if self.env is not None else self.checkpoint()
        self.checkpoints.write(self.step, state, self.selector.release)  # the save read the kept tables in

    def _weights_to_save(self) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor] | None]:
        """The checkpoint's ``model`` (the kept weights) and ``resume_model`` (the current ones, where they differ)."""
        current = {k: v.detach() for k, v in self._inner.state_dict().items()}
        best = self.selector.best_state
        if best is None:
            return current, None
        return best, current if self.selection.best_step != self.step else None

    def _checkpoint_fields(self) -> dict[str, Any]:
        """What every checkpoint of this run records besides weights and optimizer states."""
        return dict(
            model_name=self.info.model_name,
            model_config=config_to_dict(self.info.model_config),
            spec=self.info.spec_summary,
            train_config=self.cfg.to_dict(),
            step=self.step,
            steps_per_epoch=self.steps_per_epoch,
            rng=rng_state(),
            selection=self.selection.state(),
            calibration=self.calibration,
            plan=(self.checkpoints.run_record or {}).get("plan"),
            preprocessing=self.info.preprocessing,
        )

    def checkpoint(self) -> Checkpoint:
        """The checkpoint of a single-process run. Its current weights are the model's own tensors, not a copy:
        write it before training goes on."""
        model, resume = self._weights_to_save()
        return Checkpoint(
            **self._checkpoint_fields(),
            model=model,
            resume_model=resume,
            optimizers=[opt.state_dict() for opt in self.optimizers],
            snapshots=list(self.pool.snapshots) if self.pool.size > 1 else None,
            kept=kept_model(self.pool.ensemble),
            members=list(self.members_done) if self.member is not None else None,
            member=self.member,
        )

    def _sharded_checkpoint(self) -> Checkpoint | None:
        """A hybrid-parallel save: every rank's own file (``Checkpointer.write_rank_file``); rank 0 gets the
        manifest to write (last, so a checkpoint is complete or the previous one stands), the others None."""
        model, resume = self._weights_to_save()
        part = {"model": model, "resume_model": resume, "optimizers": [opt.state_dict() for opt in self.optimizers]}
        files = self.checkpoints.write_rank_file(self.step, part)
        if files is None:
            return None
        names, records = files
        return Checkpoint(
            **self._checkpoint_fields(),
            model={},
            sharding=self.model.sharding_key(),
            shard_files=names,
            shard_records=records,
        )

    def restore(self, ckpt: Checkpoint) -> None:
        """Continues the run a checkpoint was taken from (weights, optimizer, step, RNG)."""
        check_resumable(ckpt, self.cfg, self.steps_per_epoch, len(self.optimizers))
        if ckpt.shard_files:  # a sharded checkpoint of this very sharding (else it was assembled): own file
            self._restore_rank_file(ckpt)
            return
        if self.env is None:
            self.model.load_state_dict(ckpt.resume_weights)
        # else: each rank took its shards of the weights when the model was sharded (see train/run.py)
        self.selector.restore(ckpt.selection, lambda: self._best_of(ckpt), owned=self.env is not None)
        if self.env is None and self.pool.size > 1:
            self.pool.snapshots = list(ckpt.snapshots or [])
        states = ckpt.optimizers or []
        if ckpt.sharding is not None or self.env is not None:
            from ctrkit.distributed.sharded_state import optimizer_states_for_rank

            rank = self.env.rank if self.env is not None else None
            states = optimizer_states_for_rank(
                self.optimizers, states, ckpt.rank_optimizers, ckpt.sharding, self.model, rank
            )
        load_optimizer_states(self.optimizers, states)
        self.step = int(ckpt.step)
        set_rng_state(ckpt.rng)

    def _best_of(self, ckpt: Checkpoint) -> dict[str, torch.Tensor]:
        """This process's part of a checkpoint's selected weights: all of them on its device, or a rank's shards."""
        if self.env is None:  # a tiered table, and a table the run keeps on disk, stays in the checkpoint's mapping
            tiered, best_dir = tiered_keys(self.model), self.selector.best_dir
            return {
                k: v if k in tiered or kept_on_disk(v, best_dir) else v.to(self.device) for k, v in ckpt.model.items()
            }
        current = self._local_state()
        self.model.load_full_state_dict(ckpt.model)
        best = self._local_state()
        self._inner.load_state_dict(current)
        return best

    def _restore_rank_file(self, ckpt: Checkpoint) -> None:
        """Resumes from this rank's file of a sharded checkpoint written with the same sharding."""
        if self.env is None or ckpt.sharding != self.model.sharding_key():
            raise ValueError("a sharded checkpoint resumes as it is only with the sharding it was written with")
        part = read_rank_file(ckpt, self.env.rank)
        if part["optimizers"] is None:
            raise ValueError(NO_OPTIMIZER_STATE)
        source = MappedSource([ckpt.shard_files[self.env.rank]])  # pages dropped as they are copied
        weights = part["resume_model"] if part["resume_model"] is not None else part["model"]
        source.load_state(self._inner, weights)
        best = lambda: {k: source.clone(v).to(self.device) for k, v in part["model"].items()}  # noqa: E731
        self.selector.restore(ckpt.selection, best, owned=True)
        load_optimizer_states(self.optimizers, part["optimizers"])
        self.step = int(ckpt.step)
        set_rng_state(ckpt.rng)

    def continue_from(self, ckpt: Checkpoint, where: str) -> None:
        """Starts this new run from another run's checkpoint (``--continue-from``): its selected weights (the
        dynamic tables' ids and counts with them) and its optimizers' per-parameter states where they are that
        model's (not where a run of several members kept another member than the last one it trained); the
        learning rates and other optimizer settings are this run's; steps, schedule and model selection start
        over."""
        check_continuable(ckpt, self.cfg, len(self.optimizers), self.env is not None, where)
        weights, grown, own = continued_tables(self.model, ckpt)  # tables grown for an extended vocabulary
        self.model.load_state_dict(weights)
        self.continued = True
        states = ckpt.optimizers if own else []
        if grown:
            states = grown_optimizer_states(self.optimizers, states, self.model, grown)
        load_optimizer_states(self.optimizers, states)
