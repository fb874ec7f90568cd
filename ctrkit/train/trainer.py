"""The training loop: batches in, optimizer steps, periodic evaluation, logs and checkpoints."""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tqdm.auto import tqdm

from ctrkit.config import TrainConfig
from ctrkit.data.atomic import append_text
from ctrkit.data.dataset import SplitBinaryDataset, split_tail
from ctrkit.data.loader import BatchLoader
from ctrkit.device import eval_dtype_for
from ctrkit.distributed.env import DistEnv, all_reduce_sum
from ctrkit.models.dynamic import DynamicIds
from ctrkit.models.embeddings import fill_pending_tables
from ctrkit.train.best_weights import copy_state
from ctrkit.train.memory import tables_directory
from ctrkit.train.optim import LRSchedule, build_optimizers
from ctrkit.train.plan import resolved_train
from ctrkit.train.selection import ModelSelection, Selection
from ctrkit.train.snapshots import SnapshotPool, scored_with_parts
from ctrkit.train.state import TrainerState
from ctrkit.train.step import TrainStep
from ctrkit.train.tensorboard import TensorBoardSink
from ctrkit.train.warm_start import WarmStart


def schedule_of(cfg: TrainConfig, total_steps: int) -> LRSchedule:
    """The LR schedule of a config whose schedule fields the plan has set (``plan.resolved_train``)."""
    return LRSchedule(cfg.lr, cfg.warmup_steps, cfg.decay_start_step, cfg.decay_steps, cfg.decay_power, cfg.end_lr,
                      cfg.lr_schedule, total_steps)  # fmt: skip


@dataclass
class RunInfo:
    """What a checkpoint needs to know about the run besides the weights."""

    model_name: str
    model_config: Any
    spec_summary: dict[str, Any]
    preprocessing: dict[str, Any] | None = None  # the dataset's raw rows -> inputs (``RowTransform.to_state``)


class Trainer(TrainerState, ModelSelection, SnapshotPool, WarmStart):
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
        self._started = time.perf_counter()
        self.run_record = run_record
        if len(train_set) == 0:
            raise ValueError(f"the training mapping '{train_set.mapping}' holds no samples")
        if validation_set is None and cfg.validation_fraction > 0:
            train_set, validation_set = split_tail(train_set, cfg.validation_fraction)
        self.validation_set = validation_set
        self.loader = BatchLoader(train_set, cfg.batch_size, shuffle=True, seed=cfg.seed, part=env and env.part)
        self.steps_per_epoch = len(self.loader)
        cfg, _ = resolved_train(cfg, self.steps_per_epoch)  # the plan's values (a run's plan has set them all)
        for m in model.modules():  # raw ids: admission and eviction as the run says
            if isinstance(m, DynamicIds):
                m.configure(cfg.admit_after, cfg.eviction, cfg.count_half_life)
        self.selection = Selection(
            cfg.early_stopping_patience,
            cfg.plateau_patience,
            cfg.plateau_factor,
            cfg.min_delta,
            cfg.warm_start_z,
            cfg.warm_start_logloss,
        )
        self.best_state: dict[str, torch.Tensor] | None = None  # the best weights this process holds
        self._best_owned = False  # best_state is this trainer's own copy (not a checkpoint's tensors)
        disk = cfg.best_weights == "disk" and device.type == "cpu"
        self.best_dir = tables_directory(save_path) if disk else None
        self.snapshots: list[dict[str, Any]] = []  # the snapshot pool, best score first (snapshot_ensemble)
        self.member: int | None = None  # in a seed ensemble (train/run.py): this member's index
        self.members_done: list[dict[str, Any]] = []  # ... and the members trained before it (saved with it)
        self.ensemble: list[int] | None = None  # the steps of the snapshots forming the selected ensemble
        self.ensemble_metrics: dict[str, Any] | None = None
        self.calibration: float | None = None  # the kept model's logit scale (``calibrate``), set at the end
        self.calibration_record: dict[str, Any] = {}  # ... and its fit, as logged
        self._baseline_logits = None  # the warm start's validation logits while it is the selected model
        self._best_logits = None  # the selected weights' validation logits (None after a resume)
        self.continued = False  # started from another run's trained model (``continue_from``)
        # set by a seed ensemble's Run: the first member's first-order fit, which later members (the same data
        # and the same normaliser, so the same fit) take instead of fitting again (``_warm_start``)
        self.warm_start_cache: dict[str, Any] | None = None
        self.model = model
        self.info = info
        self.train_set = train_set
        self.test_set = test_set
        self.cfg = cfg
        self.device = device
        self.amp_dtype = amp_dtype
        self.eval_amp_dtype = eval_dtype_for(device, cfg.eval_dtype, amp_dtype)  # scoring's (``--eval-dtype``)
        self.save_path = Path(save_path) if save_path else None
        self.log_path = Path(log_path) if log_path else None
        self.env = env
        self.main = env is None or env.is_main
        self.tensorboard = TensorBoardSink(tensorboard_dir) if tensorboard_dir is not None and self.main else None
        self.progress = progress and self.main
        self.epochs = cfg.epochs
        planned = self.epochs * self.steps_per_epoch
        self.total_steps = min(planned, cfg.max_steps) if cfg.max_steps else planned
        self.schedule = schedule_of(cfg, planned)
        self.optimizers = build_optimizers(
            model, cfg.optimizer, cfg.lr, cfg.embedding_optimizer, cfg.embedding_lr, cfg.wide_optimizer, cfg.wide_lr
        )
        self.step_fn = TrainStep(model, self.optimizers, device, amp_dtype, cfg.compile, cfg.embedding_l2,
                                 cfg.weight_decay, cfg.split_batch)  # fmt: skip
        self.step = 0
        self._saved_step: int | None = None
        self._run_id: str | None = None  # a hybrid-parallel run's id in its rank files (rank 0's, broadcast)
        self._loss_sum = torch.zeros((), device=device)  # losses since the last logged (and checked) window
        self._table_ids = {id(p) for m in model.modules() if hasattr(m, "table_parameters")
                           for p in m.table_parameters()}  # fmt: skip
        self.pool_size = self._pool_size()

    def _log(self, record: dict[str, Any]) -> None:
        """Appends ``record`` to the log (and TensorBoard), with ``time``: seconds since the trainer was built."""
        record = {**record, "time": round(time.perf_counter() - self._started, 3)}
        if self.member is not None:  # a seed ensemble's member: its records say which
            record = {**record, "member": self.member}
        if self.log_path is not None and self.main:
            append_text(self.log_path, json.dumps(record) + "\n")
        if self.tensorboard is not None:
            self.tensorboard.write(record)

    def _eval_steps(self) -> set[int]:
        """Global steps after which to evaluate: evenly spaced within each epoch, plus the last step."""
        spe = self.steps_per_epoch
        points = {self.total_steps}
        if self.cfg.evals_per_epoch:
            for e in range(self.epochs):
                for k in range(1, self.cfg.evals_per_epoch + 1):
                    points.add(e * spe + math.ceil(k * spe / self.cfg.evals_per_epoch))
        return {p for p in points if p <= self.total_steps}

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
        return copy_state(self._inner.state_dict(), into, self.best_dir if on_disk else None)

    def fit(self) -> dict[str, Any]:
        """Trains until ``total_steps`` or the early-stopping patience runs out, keeps the best validation
        weights, and scores the test mapping once with them.

        Returns:
            The test metrics (``auc``, ``logloss``, ...) when there is a test mapping, with ``step`` (steps
            trained), ``best_step`` (the selected weights' step) and ``validation`` (their validation metrics).
        """
        cfg = self.cfg
        self._log(
            {
                "event": "start",
                "unix_time": round(time.time() - (time.perf_counter() - self._started), 3),  # the trainer's time 0
                "step": self.step,
                "total_steps": self.total_steps,
                "steps_per_epoch": self.steps_per_epoch,
                "train_samples": len(self.train_set),
                "validation_samples": len(self.validation_set) if self.validation_set is not None else 0,
                "model": self.info.model_name,
                "config": cfg.to_dict(),
                "device": str(self.device),
                "threads": torch.get_num_threads(),
            }
        )
        if self.step == 0 and self.selection.best_step is None and not self.continued:
            self._fit_normalizer()  # a continued model keeps the inputs' scales and buckets it was trained with
            self._warm_start()
        fill_pending_tables(self.model)  # tables built undrawn (``tables_filled_later``) that nothing wrote
        eval_steps = self._eval_steps()
        loss_sum = self._loss_sum
        window_steps = window_samples = 0
        window_start = time.perf_counter()
        bar = tqdm(
            total=self.total_steps,
            initial=self.step,
            desc="train",
            unit="step",
            disable=not self.progress,
            dynamic_ncols=True,
        )
        self.model.train()
        batches = None
        try:
            while self.step < self.total_steps and not self.selection.stopped:
                epoch, start = divmod(self.step, self.steps_per_epoch)
                if epoch > 0 and start == 0 and (self.selection.reinit or cfg.reinit_embeddings == "on"):
                    self._reinit_embeddings(epoch)
                batches = self.loader.epoch(epoch, start)
                order = self.loader.batch_order(epoch)[start:]
                for k, batch in enumerate(batches):
                    lo, hi = self.loader.global_bounds(int(order[k]))
                    global_size = hi - lo if self.env is not None else None
                    scale = self.schedule(self.step) / cfg.lr * self.selection.lr_scale
                    wide_scale = None if cfg.schedule_wide else self.selection.lr_scale
                    loss_sum += self.step_fn(batch, scale, global_size, wide_scale)
                    self.step += 1
                    window_steps += 1
                    window_samples += hi - lo
                    bar.update(1)
                    if self.step % cfg.print_freq == 0 or self.step == self.total_steps:
                        elapsed = time.perf_counter() - window_start
                        total = float(loss_sum) if self.env is None else all_reduce_sum(float(loss_sum))
                        mean_loss = total / window_steps
                        if not math.isfinite(mean_loss):
                            raise FloatingPointError(
                                f"the training loss became {mean_loss} by step {self.step} (lr "
                                f"{self.schedule(self.step - 1):g}); training stopped and the last checkpoint was "
                                "kept: lower the learning rate or lengthen the warmup"
                            )
                        record = {
                            "event": "train",
                            "step": self.step,
                            "epoch": epoch,
                            "loss": mean_loss,
                            "lr": self.schedule(self.step - 1) * self.selection.lr_scale,
                            "samples_per_s": window_samples / max(elapsed, 1e-9),
                        }
                        self._log(record)
                        bar.set_postfix(loss=f"{record['loss']:.4f}", samples_s=f"{record['samples_per_s']:,.0f}")
                        loss_sum.zero_()
                        window_steps = window_samples = 0
                        window_start = time.perf_counter()
                    if self.step in eval_steps:
                        t0 = time.perf_counter()
                        record = self.validate()
                        if record is not None and self.progress:
                            bar.write(
                                f"step {self.step}: validation AUC {record['auc']:.4f} logloss {record['logloss']:.4f}"
                                f" (best: step {record['best_step']})"
                            )
                        if not (self.step >= self.total_steps or self.selection.stopped):
                            self.save()  # the last evaluation's is the final save, after calibration
                        window_start += time.perf_counter() - t0  # keep samples/s about training
                    elif cfg.checkpoint_every and self.step % cfg.checkpoint_every == 0:
                        self.save()
                    if self.step >= self.total_steps or self.selection.stopped:
                        break
        finally:
            if batches is not None:
                batches.close()  # stops the prefetch thread however the loop ended
            bar.close()
        ensemble_logits = self._form_ensemble()
        if self.member is None:  # a seed ensemble's members are calibrated together (train/run.py)
            self._calibrate(ensemble_logits)
        self.save()  # the best weights (or ensemble) as the model, the last ones to resume from
        self._keep_best()
        result: dict[str, Any] = {"step": self.step, "best_step": self.selection.best_step,
                                  "stopped_early": self.selection.stopped}  # fmt: skip
        if self.selection.best_metrics is not None:
            result["validation"] = self.selection.best_metrics
        if self.selection.baseline_metrics() is not None:  # the warm start's regression, for comparison
            result["baseline"] = self.selection.baseline_metrics()
        if self.ensemble is not None:
            result["ensemble"], result["validation"] = self.ensemble, self.ensemble_metrics
            result["single_validation"] = self.selection.best_metrics  # what the ensemble is set beside
            result["models_per_request"] = len(self.ensemble)
        if self.calibration_record:
            result["calibration"] = self.calibration_record
        if self.test_set is not None and len(self.test_set):
            started = time.perf_counter()
            logits = self._logits(self.test_set)
            kept = logits if self.ensemble is None else self._ensemble_logits(self.test_set)
            test = scored_with_parts(self.test_set, kept, self.calibration, logits if self.ensemble else None)
            if self.ensemble is not None:
                test["ensemble"] = self.ensemble
            self._log({"event": "test", "mapping": "test", "step": self.step, "best_step": result["best_step"],
                       **test, "seconds": round(time.perf_counter() - started, 3)})  # fmt: skip
            result.update(test)
        if self.tensorboard is not None:
            self.tensorboard.close()
        return result
