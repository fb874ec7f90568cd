"""The training loop: batches in, optimizer steps, periodic evaluation, logs and checkpoints.

A ``Trainer`` is composed of parts, each in its own module: the step (``step.TrainStep``), the scorer
(``scoring.Scorer``), model selection (``selection.Selector``, the one best-model rule), the snapshot pool
(``snapshots.SnapshotPool``), the checkpoints (``state.Checkpointer``, written, restored and continued from by
``persistence.RunStore``: ``trainer.store``), the warm start (``warm_start``), the log (``run_log.RunLog``) and the
run's end (``finish``). The trainer holds the model, its optimizers and the step count, and passes each part what
it needs.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ctrkit.config import TrainConfig
from ctrkit.data.dataset import SplitBinaryDataset
from ctrkit.data.device_feed import DeviceFeed, narrow_on
from ctrkit.data.loader import BatchLoader
from ctrkit.distributed.env import DistEnv, all_reduce_sum
from ctrkit.models.contract import redraw_tables, table_parameter_ids
from ctrkit.models.dynamic import DynamicIds
from ctrkit.models.embeddings import fill_pending_tables
from ctrkit.progress import tqdm
from ctrkit.train.best_weights import copy_state
from ctrkit.train.finish import finish
from ctrkit.train.memory import tables_directory
from ctrkit.train.optim import LRSchedule, build_optimizers
from ctrkit.train.persistence import RunStore
from ctrkit.train.run_log import RunLog, process_seconds
from ctrkit.train.scoring import Scorer
from ctrkit.train.selection import Selection, Selector
from ctrkit.train.snapshots import SnapshotPool
from ctrkit.train.state import Checkpointer
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


@dataclass(frozen=True)
class TrainData:
    """A run's mappings: ``train``; ``test``, scored once at the end with the kept weights (None: not scored);
    ``validation`` (None: the last ``TrainConfig.validation_fraction`` of ``train`` is held out instead; none at 0:
    no model selection, the last weights are kept)."""

    train: SplitBinaryDataset
    test: SplitBinaryDataset | None = None
    validation: SplitBinaryDataset | None = None


@dataclass(frozen=True)
class Placement:
    """Where a run computes: ``device``; ``amp_dtype``, its autocast dtype (None: none); ``env``, this rank's place
    in a hybrid-parallel job (the model is then a HybridModel: every rank reads its share of each global batch, rank
    0 logs, shows progress and writes checkpoints, which every rank helps assemble), None in one process;
    ``eval_dtype``, the autocast dtype its evaluations score in (None: fp32; a Run decides it with
    ``device.eval_dtype_for``)."""

    device: torch.device
    amp_dtype: torch.dtype | None = None
    env: DistEnv | None = None
    eval_dtype: torch.dtype | None = None


@dataclass(frozen=True)
class RunOutputs:
    """What a run writes: checkpoints to ``save_path`` (at each evaluation, every ``checkpoint_every`` steps and at
    the end; None: none), the JSON-lines log to ``log_path``, its scalars as TensorBoard events to
    ``tensorboard_dir``, the resolved run ``run_record`` as YAML beside the checkpoint (``save_path`` with suffix
    ``.yaml``) when the run first saves, never before (a run that saves nothing leaves what is there untouched), and
    a progress bar with ``progress``."""

    save_path: str | os.PathLike | None = None
    log_path: str | os.PathLike | None = None
    tensorboard_dir: str | os.PathLike | None = None
    run_record: dict[str, Any] | None = None
    progress: bool = True


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


# the settings a Trainer needs decided (by a Run's plan, or ``run.settled``): the model's training defaults, and what
# the data decide (``plan.resolved_train``)
DECIDED = (
    "optimizer", "lr", "embedding_optimizer", "embedding_lr", "batch_size", "wide_optimizer", "wide_lr", "epochs",
    "early_stopping_patience", "plateau_patience", "warmup_steps", "decay_steps", "decay_start_step",
)  # fmt: skip


class Trainer:
    """Trains a model on a split-binary dataset, with settings already decided (``DECIDED``; a Run's plan decides
    them, ``run.settled`` for a Trainer built by hand) and the mappings as given.

    Args:
        model: the model (already on ``where.device``).
        info: model name/config and the dataset's spec summary, stored in checkpoints.
        data: the mappings it trains on, selects on and scores (``TrainData``).
        cfg: TrainConfig.
        where: the device, autocast dtype and hybrid-parallel place (``Placement``).
        outputs: the checkpoints, log and progress it writes (``RunOutputs``).

    Evaluations during training score the validation data only. The run keeps the weights of the best
    validation AUC, multiplies the learning rates by ``plateau_factor`` on a plateau and stops after
    ``early_stopping_patience`` evaluations without improvement; checkpoints hold the best weights as
    ``model`` (what evaluation, export and serving read) and the current ones for resuming.
    """

    def __init__(
        self,
        model: nn.Module,
        info: RunInfo,
        data: TrainData,
        cfg: TrainConfig,
        where: Placement,
        outputs: RunOutputs = RunOutputs(),
    ):
        train_set, test_set, validation_set = data.train, data.test, data.validation
        device, amp_dtype, env = where.device, where.amp_dtype, where.env
        undecided = [k for k in DECIDED if getattr(cfg, k) is None]
        if undecided:
            raise ValueError(
                f"a Trainer trains settings already decided, and {', '.join(undecided)} are not: a Run's plan decides "
                "them (ctrkit.train.run.settled for a Trainer built by hand)"
            )
        if len(train_set) == 0:  # before anything is made (the log's TensorBoard directory)
            raise ValueError(f"the training mapping '{train_set.mapping}' holds no samples")
        self.env, self.main = env, env is None or env.is_main
        self.log = RunLog(outputs.log_path, outputs.tensorboard_dir, self.main)
        self.model, self.info, self.device, self.amp_dtype = model, info, device, amp_dtype
        self.train_set, self.validation_set, self.test_set = train_set, validation_set, test_set
        narrow = narrow_on(device)  # a GPU's batches: read narrow and pinned, copied ahead on a side stream
        self.loader = BatchLoader(
            train_set, cfg.batch_size, shuffle=True, seed=cfg.seed, part=env and env.part, narrow=narrow
        )
        self.feed = DeviceFeed(device)
        self.started = False  # the first step of this process taken (logged once)
        self.steps_per_epoch = len(self.loader)
        self.cfg = cfg
        for m in model.modules():  # raw ids: admission and eviction as the run says
            if isinstance(m, DynamicIds):
                m.configure(cfg.admit_after, cfg.eviction, cfg.count_half_life)
        self.progress = outputs.progress and self.main
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
        self._build_parts(outputs.save_path, outputs.run_record, where.eval_dtype)

    def _build_parts(self, save_path, run_record: dict[str, Any] | None, eval_dtype: torch.dtype | None) -> None:
        """The scorer, selection, snapshot pool and checkpoints, and the run's state besides the weights."""
        cfg, env = self.cfg, self.env
        self.window = Window(self.device)
        self.table_ids = table_parameter_ids(self.model)
        self.scorer = Scorer(self.model, self.inner, self.device, cfg.eval_batch_size, eval_dtype, env)
        rule = Selection(
            cfg.early_stopping_patience,
            cfg.plateau_patience,
            cfg.plateau_factor,
            cfg.min_delta,
            cfg.warm_start_z,
            cfg.warm_start_logloss,
        )
        best_dir = tables_directory(save_path) if cfg.best_weights == "disk" else None  # as planned, on any device
        self.selector = Selector(rule, self.validation_set, self.scorer, self.local_state, best_dir)
        self.pool = SnapshotPool(cfg.snapshot_ensemble, self.steps_per_epoch)  # as planned (``plan._batches``)
        self.checkpoints = Checkpointer(save_path, env, run_record, self.log)
        self.store = RunStore(self)  # the run's checkpoints: save, restore, continue from another run's
        self.members_done: list[dict[str, Any]] = []  # in a seed ensemble (train/run.py): the members trained before
        self.calibration: float | None = None  # the kept model's logit scale (``calibrate``), set at the end
        self.calibration_record: dict[str, Any] = {}  # ... and its fit, as logged
        self.continued = False  # started from another run's trained model (``continue_from``)
        # set by a seed ensemble's Run: the first member's first-order fit, which later members (the same data and
        # the same normaliser, so the same fit) take instead of fitting again (``warm_start.fit_warm_start``)
        self.warm_start_cache: dict[str, Any] | None = None

    @property
    def selection(self) -> Selection:
        return self.selector.selection

    @property
    def inner(self) -> nn.Module:
        """The model whose state dict this process holds (a HybridModel's wrapped model: its shards)."""
        return self.model.model if self.env is not None else self.model

    def local_state(
        self, into: dict[str, torch.Tensor] | None = None, on_disk: bool = False
    ) -> dict[str, torch.Tensor]:
        """A copy of the weights this process holds (the whole model, or a rank's shards and replicas); with
        ``into`` (an earlier copy), copied into its tensors where their shapes fit, so that replacing the best
        weights never holds two copies of the tables at once; with ``on_disk`` and ``best_weights`` disk, the
        tables are copied to disk (``best_weights.copy_state``)."""
        return copy_state(self.inner.state_dict(), into, self.selector.best_dir if on_disk else None)

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
        self.log.start(
            step=self.step,
            total_steps=self.total_steps,
            steps_per_epoch=self.steps_per_epoch,
            train_samples=len(self.train_set),
            validation_samples=len(self.validation_set) if self.validation_set is not None else 0,
            model=self.info.model_name,
            config=self.cfg.to_dict(),
            device=str(self.device),
        )
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
        return finish(self)

    def _prepare(self) -> None:
        """Before the first step of a new run: the input normaliser fitted and the warm start (evaluated at step 0,
        so selection can keep it). A continued model keeps the inputs' scales and buckets it was trained with."""
        fitted = fit_normalizer(self.inner, self.train_set)
        if fitted is not None:
            self.log.write({"event": "numerical_normalizer", "step": 0, **fitted})
        if not self.cfg.linear_warm_start:
            return
        fit = fit_warm_start(self.model, self.inner, self.train_set, self.validation_set, self.warm_start_cache)
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
                self.store.save()
            self.window.started += time.perf_counter() - t0  # keep samples/s about training
        elif self.cfg.checkpoint_every and self.step % self.cfg.checkpoint_every == 0:
            self.store.save()

    def validate(self, baseline: bool = False) -> dict[str, Any] | None:
        """Scores the validation data, updates the selection (best weights, plateau, patience), keeps a snapshot,
        redraws the tables where the run is overfitting, and logs it. ``baseline``: this evaluation is of the warm
        start, which a later model must beat by ``warm_start_z`` standard errors to replace."""
        if not self.selector.active:
            return None
        metrics, selected, seconds = self.selector.evaluate(self.step, baseline, reuse=self.pool.size < 2)
        if not baseline:  # in place where nothing else holds the old copy (a snapshot pool may)
            kept = self.selector.best_state if selected else None
            self.pool.keep(self.step, metrics, lambda: kept if kept is not None else self.local_state())
        if not selected and self._overfitting(metrics):  # auto reinit_embeddings: from the best weights
            self.selection.reinit = True
            self.inner.load_state_dict(self.selector.best_state)
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
        params = redraw_tables(self.inner, draw=epoch)
        if params is None:
            return
        for opt in self.optimizers:
            for p in params:
                opt.state.pop(p, None)
        self.log.write({"event": "reinit_embeddings", "step": self.step, "epoch": epoch})
