"""The training loop: batches in, optimizer steps, periodic evaluation, logs and checkpoints."""

from __future__ import annotations

import json
import math
import os
import threading
import time
import warnings
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
import yaml
from torch import nn
from tqdm.auto import tqdm

from ctrkit import hugepages
from ctrkit.checkpoint import (
    Checkpoint,
    MappedSource,
    rank_file_name,
    read_rank_file,
    rng_state,
    save_checkpoint,
    set_rng_state,
    snapshot_states,
    torch_save,
)
from ctrkit.config import TrainConfig
from ctrkit.data.atomic import atomic_file
from ctrkit.data.batch import Batch
from ctrkit.data.dataset import SplitBinaryDataset, split_tail
from ctrkit.data.loader import BatchLoader
from ctrkit.distributed.env import DistEnv, all_reduce_sum
from ctrkit.eval.calibration import calibrated, choose_calibration
from ctrkit.eval.evaluator import metrics_of, predict_logits
from ctrkit.eval.metrics import auc_difference
from ctrkit.models.embeddings import CategoricalEmbeddings
from ctrkit.models.mlp import Dropout, dropout_generator
from ctrkit.models.registry import config_to_dict
from ctrkit.train import split as thread_split
from ctrkit.train.optim import LRSchedule, build_optimizers
from ctrkit.train.plan import resolved_train
from ctrkit.train.selection import Selection, score
from ctrkit.train.tensorboard import TensorBoardSink


def schedule_of(cfg: TrainConfig, total_steps: int) -> LRSchedule:
    """The LR schedule of a config whose schedule fields the plan has set (``plan.resolved_train``)."""
    return LRSchedule(cfg.lr, cfg.warmup_steps, cfg.decay_start_step, cfg.decay_steps, cfg.decay_power, cfg.end_lr,
                      cfg.lr_schedule, total_steps)  # fmt: skip


NO_OPTIMIZER_STATE = (
    "the checkpoint holds no optimizer state (an older `ctrkit convert-checkpoint --world-size` wrote it); "
    "resume from the checkpoint it was converted from (evaluate, predict, export and serve read it as it is)"
)


class TrainStep:
    """One optimizer step on one batch: forward (under autocast), BCE loss, backward, update.

    Shared by the trainer and the training benchmark so both measure the same thing.

    Args:
        model: maps (dense, sparse) to logits (B,).
        optimizers: the optimizers of the parameter sets (see build_optimizers); each group's
            ``base_lr`` is scaled by the schedule factor passed to each call.
        device: where batches are moved before the forward pass.
        amp_dtype: autocast dtype, or None for full precision. fp16 enables loss scaling.
        compile: run the forward (and its backward) through ``torch.compile``; if compiling fails
            (no C++ compiler or Triton, an unsupported op), in the forward or in the first backward, the
            step says why once and runs eagerly (a step whose backward failed is taken again).
        embedding_l2: adds ``embedding_l2 * sum ||e||^2 / B`` over the embedding vectors ``e`` the
            batch's samples looked up (every CategoricalEmbeddings' output), so only the looked-up rows
            are penalised and the tables' gradients stay sparse.
        weight_decay: adds ``weight_decay / 2 * sum ||W||^2`` over the weight matrices of the dense part.
        split: ``auto`` / ``on`` split each step's batch over the CPU's threads (ctrkit/train/split.py: one
            worker thread per intra-op thread, each running its slice's forward and backward on one thread; the
            same step to float rounding). ``auto`` splits on the CPU with two or more threads, without
            ``compile`` or fp16 and outside a hybrid-parallel job, and only batches of at least
            ``split.MIN_ROWS`` samples a thread (one slice a thread); ``on`` splits any batch there; ``off`` never.
    """

    def __init__(
        self,
        model: nn.Module,
        optimizers: list[torch.optim.Optimizer],
        device: torch.device,
        amp_dtype: torch.dtype | None = None,
        compile: bool = False,
        embedding_l2: float = 0.0,
        weight_decay: float = 0.0,
        split: str = "auto",
    ):
        self.model = model
        if device.type == "cpu":  # a step's activations reuse freed pages rather than fault in fresh ones
            hugepages.retain_freed_memory()
        self.embedding_l2, self.weight_decay = embedding_l2, weight_decay
        self._local = threading.local()  # each thread's embedding lookups (a split step runs several)
        if embedding_l2 > 0:  # keep each lookup's output for the penalty (no second lookup)
            for m in model.modules():
                if isinstance(m, CategoricalEmbeddings):
                    m.register_forward_hook(self._keep_lookup)
        tables = {id(p) for m in model.modules() if hasattr(m, "table_parameters") for p in m.table_parameters()}
        self._decayed = [p for p in model.parameters() if p.dim() >= 2 and id(p) not in tables] if weight_decay else []
        self.forward = torch.compile(model) if compile else model
        self.optimizers = optimizers
        self.device = device
        self.amp_dtype = amp_dtype
        self.scaler = torch.amp.GradScaler(device.type) if amp_dtype == torch.float16 else None
        self.split = split
        self.split_threads = self._split_threads(split, compile)
        self._has_dropout = any(isinstance(m, Dropout) and m.p > 0 for m in model.modules())

    def _split_threads(self, split: str, compile: bool) -> int:
        """How many slices a step's batch may be split into (1: none); refuses ``on`` where it cannot split."""
        if split not in ("auto", "on", "off"):
            raise ValueError(f"`split`: expected auto, on or off, got {split!r}")
        why = None
        if self.device.type != "cpu":
            why = f"the device is {self.device.type}, not the CPU"
        elif compile:
            why = "the model is compiled"
        elif self.scaler is not None:
            why = "fp16 loss scaling steps the optimizers itself"
        elif getattr(self.model, "sync_gradients", None) is not None:
            why = "a hybrid-parallel job splits the batch over processes"
        elif torch.get_num_threads() < 2:
            why = "torch runs one thread"
        if why is not None:
            if split == "on":
                raise ValueError(f"`split` on: cannot split the batch over threads: {why}")
            return 1
        return torch.get_num_threads() if split != "off" else 1

    def _lookups(self) -> list[torch.Tensor]:
        items = getattr(self._local, "items", None)
        if items is None:
            items = self._local.items = []
        return items

    def _keep_lookup(self, module: nn.Module, inputs: tuple, out: torch.Tensor) -> None:
        if module.training and torch.is_grad_enabled():  # training forwards only, not evaluations
            self._lookups().append(out)

    def __call__(
        self, batch: Batch, scale: float = 1.0, global_size: int | None = None, wide_scale: float | None = None
    ) -> torch.Tensor:
        """One step; returns the loss. ``global_size``: the whole job's batch size when this rank holds
        only part of it (the loss is then this part's sum over ``global_size``). ``wide_scale``: the
        factor of the wide part's optimizers when it differs from ``scale``."""
        for opt in self.optimizers:
            factor = wide_scale if wide_scale is not None and getattr(opt, "is_wide", False) else scale
            for group in opt.param_groups:
                group["lr"] = group["base_lr"] * factor
        batch = batch.to(self.device, non_blocking=True)
        slices = self._slice_count(batch)
        if slices > 1:
            return self._split_step(batch, slices, global_size)
        looked_up = self._lookups()
        looked_up.clear()
        autocast = (
            torch.autocast(self.device.type, dtype=self.amp_dtype) if self.amp_dtype is not None else nullcontext()
        )
        with autocast:
            logits = self._forward(batch)  # (B,)
        if global_size is None:
            loss = F.binary_cross_entropy_with_logits(logits.float(), batch.labels)
        else:
            loss = F.binary_cross_entropy_with_logits(logits.float(), batch.labels, reduction="sum") / global_size
        loss = self._penalties(loss, looked_up, global_size or len(batch), True)
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=True)
        sync = getattr(self.model, "sync_gradients", None)  # hybrid parallel: replicated tables' gradients
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
            if sync is not None:
                sync()
            for opt in self.optimizers:
                self.scaler.step(opt)
            self.scaler.update()
        else:
            try:
                loss.backward()  # hybrid parallel: DDP sums the dense gradients over ranks meanwhile
            except Exception as e:
                if self.forward is self.model:
                    raise
                # the compiled backward is built at the first backward, after the forward ran: a backend
                # that cannot handle it fails here; the step is taken again eagerly (no optimizer stepped yet)
                self._fall_back(e)
                return self(batch, scale, global_size, wide_scale)
            if sync is not None:
                sync()
            for opt in self.optimizers:
                opt.step()
        return loss.detach()

    def _penalties(self, loss: torch.Tensor, looked_up: list, size: int, decay: bool) -> torch.Tensor:
        """``loss`` plus the embedding L2 over ``looked_up`` (then cleared) and, where ``decay``, the weight decay."""
        if looked_up:
            penalty = sum(e.float().pow(2).sum() for e in looked_up) / size
            looked_up.clear()
            loss = loss + self.embedding_l2 * penalty
        if decay and self._decayed:
            loss = loss + 0.5 * self.weight_decay * sum(p.float().pow(2).sum() for p in self._decayed)
        return loss

    def _slice_count(self, batch: Batch) -> int:
        n = self.split_threads
        if n < 2 or batch.labels is None or not torch.is_grad_enabled():
            return 1
        if self.split == "auto":  # every thread its own slice of enough samples, or no split (fewer would idle cores)
            return n if len(batch) >= n * thread_split.MIN_ROWS else 1
        return min(n, len(batch))

    def _split_step(self, batch: Batch, n: int, global_size: int | None) -> torch.Tensor:
        """The step with the batch split into ``n`` slices over ``n`` worker threads (ctrkit/train/split.py)."""
        size = global_size or len(batch)
        parts = [batch.rows(s) for s in thread_split.slices(len(batch), n)]
        seeds = torch.randint(0, 2**62, (n,)).tolist() if self._has_dropout else None  # from the global generator
        params = [p for p in self.model.parameters() if p.requires_grad]  # each step: a run may replace tables

        def slice_job(i: int):
            def run():
                part = parts[i]
                masks = dropout_generator(torch.Generator().manual_seed(seeds[i])) if seeds else nullcontext()
                autocast = torch.autocast("cpu", dtype=self.amp_dtype) if self.amp_dtype is not None else nullcontext()
                looked_up = self._lookups()
                looked_up.clear()
                with masks, autocast:
                    logits = self.model(part.numerical, part.categorical, part.multi_hot)
                loss = F.binary_cross_entropy_with_logits(logits.float(), part.labels, reduction="sum") / size
                loss = self._penalties(loss, looked_up, size, i == 0)
                return loss.detach(), torch.autograd.grad(loss, params, allow_unused=True)

            return run

        team = thread_split.team(n)
        results = team.run([slice_job(i) for i in range(n)])
        grads = {id(p): [r[1][k] for r in results] for k, p in enumerate(params)}
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=True)
        # the optimizers dealt to the workers; the tables' row updates come back unrun, in pieces that every worker
        # takes once its own optimizers are done (one meeting: a worker does not wait for the others to start on rows)
        deferring = [hasattr(opt, "step_deferring_rows") for opt in self.optimizers]
        costs = [thread_split.optimizer_cost(opt, grads, d) for opt, d in zip(self.optimizers, deferring)]
        rows = thread_split.RowWork(sum(deferring), parts=2 * n)

        def optimizer_job(indices: list[int]):
            def run() -> None:
                try:
                    for i in indices:
                        opt = self.optimizers[i]
                        for group in opt.param_groups:
                            for p in group["params"]:
                                p.grad = thread_split.sum_gradients(grads.get(id(p), ()), p)
                        if deferring[i]:
                            rows.add(opt.step_deferring_rows())
                        else:
                            opt.step()
                except BaseException:
                    rows.fail()  # no further row piece starts anywhere; the caller raises this
                    raise
                rows.work()

            return run

        team.run([optimizer_job(idx) for idx in thread_split.assign(costs, n, first=deferring)])
        loss = results[0][0]
        for r in results[1:]:
            loss = loss + r[0]
        return loss

    def _fall_back(self, e: Exception) -> None:
        """Says once why ``torch.compile`` failed, and runs the model eagerly from now on."""
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        warnings.warn(
            f"torch.compile failed ({type(e).__name__}: {first}); training continues in eager mode", stacklevel=3
        )
        self.forward = self.model

    def _forward(self, batch: Batch) -> torch.Tensor:
        if self.forward is self.model:
            return self.model(batch.numerical, batch.categorical, batch.multi_hot)
        try:
            return self.forward(batch.numerical, batch.categorical, batch.multi_hot)
        except Exception as e:  # the backend is missing or cannot handle the model: run eagerly
            self._fall_back(e)
            return self.model(batch.numerical, batch.categorical, batch.multi_hot)


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


def _remove_older_rank_files(path: Path, step: int) -> None:
    """Deletes the rank files of ``path``'s earlier saves (the manifest now names this step's)."""
    folder = path.parent / f"{path.name}.shards"
    for f in folder.glob("step*-rank*-of-*.pt"):
        try:
            if int(f.name[4:].split("-", 1)[0]) < step:
                f.unlink(missing_ok=True)
        except ValueError:
            continue


@dataclass
class RunInfo:
    """What a checkpoint needs to know about the run besides the weights."""

    model_name: str
    model_config: Any
    spec_summary: dict[str, Any]


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
        self.run_record = run_record
        if len(train_set) == 0:
            raise ValueError(f"the training mapping '{train_set.mapping}' holds no samples")
        if validation_set is None and cfg.validation_fraction > 0:
            train_set, validation_set = split_tail(train_set, cfg.validation_fraction)
        self.validation_set = validation_set
        self.loader = BatchLoader(train_set, cfg.batch_size, shuffle=True, seed=cfg.seed, part=env and env.part)
        self.steps_per_epoch = len(self.loader)
        cfg, _ = resolved_train(cfg, self.steps_per_epoch)  # the plan's values (a run's plan has set them all)
        self.selection = Selection(
            cfg.early_stopping_patience,
            cfg.plateau_patience,
            cfg.plateau_factor,
            cfg.min_delta,
            cfg.warm_start_z,
            cfg.warm_start_logloss,
        )
        self.best_state: dict[str, torch.Tensor] | None = None  # the best weights this process holds
        self.snapshots: list[dict[str, Any]] = []  # the snapshot pool, best score first (snapshot_ensemble)
        self.member: int | None = None  # in a seed ensemble (train/run.py): this member's index
        self.members_done: list[dict[str, Any]] = []  # ... and the members trained before it (saved with it)
        self.ensemble: list[int] | None = None  # the steps of the snapshots forming the selected ensemble
        self.ensemble_metrics: dict[str, Any] | None = None
        self.calibration: float | None = None  # the kept model's logit scale (``calibrate``), set at the end
        self.calibration_record: dict[str, Any] = {}  # ... and its fit, as logged
        self._baseline_logits = None  # the warm start's validation logits while it is the selected model
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
        self._loss_sum = torch.zeros((), device=device)  # losses since the last logged (and checked) window
        self._table_ids = {id(p) for m in model.modules() if hasattr(m, "table_parameters")
                           for p in m.table_parameters()}  # fmt: skip
        self.pool_size = self._pool_size()

    # -------------------------------------------------------------------------- checkpointing
    def state(self) -> Checkpoint:
        """The checkpoint of a single-process run (a hybrid-parallel run saves with ``_save_sharded``)."""
        current = self._local_state()
        return Checkpoint(
            model_name=self.info.model_name,
            model_config=config_to_dict(self.info.model_config),
            spec=self.info.spec_summary,
            model=self.best_state if self.best_state is not None else current,
            resume_model=current if self.best_state is not None and self.selection.best_step != self.step else None,
            train_config=self.cfg.to_dict(),
            optimizers=[opt.state_dict() for opt in self.optimizers],
            step=self.step,
            steps_per_epoch=self.steps_per_epoch,
            rng=rng_state(),
            selection=self.selection.state(),
            snapshots=list(self.snapshots) if self.pool_size > 1 else None,
            ensemble=self.ensemble,
            members=list(self.members_done) if self.member is not None else None,
            member=self.member,
            calibration=self.calibration,
            plan=(self.run_record or {}).get("plan"),
        )

    def restore(self, ckpt: Checkpoint) -> None:
        """Continues the run a checkpoint was taken from (weights, optimizer, step, RNG)."""
        if ckpt.steps_per_epoch not in (None, self.steps_per_epoch):
            raise ValueError(
                f"the checkpoint's run had {ckpt.steps_per_epoch} batches per epoch, this one "
                f"has {self.steps_per_epoch}: resume with the same dataset and batch size"
            )
        if ckpt.rank_optimizers is not None and any(s is None for s in ckpt.rank_optimizers):
            raise ValueError(NO_OPTIMIZER_STATE)
        states = ckpt.optimizers or []
        kinds = ("optimizer", "embedding_optimizer", "wide_optimizer")
        theirs = [(ckpt.train_config or {}).get(k) for k in kinds]
        ours = [getattr(self.cfg, k) for k in kinds]
        if (len(states) != len(self.optimizers) and not ckpt.shard_files) or theirs != ours:
            raise ValueError(
                f"the checkpoint's optimizers (dense/embedding/wide: {theirs}) differ from this run's ({ours}); "
                "resume with the same optimizer, embedding_optimizer and wide_optimizer"
            )
        if ckpt.shard_files:  # a sharded checkpoint of this very sharding (else it was assembled): own file
            self._restore_rank_file(ckpt)
            return
        if self.env is None:
            self.model.load_state_dict(ckpt.resume_weights)
        # else: each rank took its shards of the weights when the model was sharded (see train/run.py)
        if ckpt.selection is not None:
            self.selection = Selection.from_state(ckpt.selection)
            if self.selection.best_step is not None and self.env is None:
                self.best_state = {k: v.to(self.device) for k, v in ckpt.model.items()}
            elif self.selection.best_step is not None:  # this rank's part of the best weights
                current = self._local_state()
                self.model.load_full_state_dict(ckpt.model)
                self.best_state = self._local_state()
                self._inner.load_state_dict(current)
        if self.env is None and self.pool_size > 1:
            self.snapshots = list(ckpt.snapshots or [])
        if ckpt.sharding is not None or self.env is not None:
            from ctrkit.distributed.sharded_state import optimizer_states_for_rank

            rank = self.env.rank if self.env is not None else None
            states = optimizer_states_for_rank(
                self.optimizers, states, ckpt.rank_optimizers, ckpt.sharding, self.model, rank
            )
        for opt, state in zip(self.optimizers, states):
            if state is not None:
                opt.load_state_dict(state)
        self.step = int(ckpt.step)
        set_rng_state(ckpt.rng)

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
        if ckpt.selection is not None:
            self.selection = Selection.from_state(ckpt.selection)
            if self.selection.best_step is not None:
                self.best_state = {k: source.clone(v).to(self.device) for k, v in part["model"].items()}
        for opt, state in zip(self.optimizers, part["optimizers"]):
            opt.load_state_dict(state)
        self.step = int(ckpt.step)
        set_rng_state(ckpt.rng)

    def save(self) -> None:
        """Checkpoints the current step (once: a step already saved is not written again).

        In a hybrid-parallel run every rank takes part and rank 0 writes.
        """
        if self.save_path is not None and self._saved_step != self.step:
            self._check_finite()
            state = self._save_sharded() if self.env is not None else self.state()
            if self.main and state is not None:
                save_checkpoint(self.save_path, state)
                if self.env is not None:
                    _remove_older_rank_files(self.save_path, self.step)
                if self.run_record is not None and self._saved_step is None:  # this run's first save
                    with atomic_file(self.save_path.with_suffix(".yaml")) as tmp, open(tmp, "w") as f:
                        yaml.safe_dump(self.run_record, f, sort_keys=False)
            self._saved_step = self.step

    def _save_sharded(self) -> Checkpoint | None:
        """A hybrid-parallel save: every rank writes its own weights (its shards and the replicated ones)
        and optimizer states to its own file, atomically; once all have, rank 0 gets the manifest to write
        (last, so a checkpoint is complete or the previous one stands). No rank holds more than its own."""
        env, model = self.env, self.model
        current = {k: v.detach() for k, v in self._inner.state_dict().items()}
        past_best = self.best_state is not None and self.selection.best_step != self.step
        part = {
            "model": self.best_state if self.best_state is not None else current,
            "resume_model": current if past_best else None,
            "optimizers": [opt.state_dict() for opt in self.optimizers],
        }
        names = [rank_file_name(self.save_path, self.step, r, env.world_size) for r in range(env.world_size)]
        with atomic_file(self.save_path.parent / names[env.rank]) as tmp:
            torch_save(part, tmp)
        torch.distributed.barrier()  # every rank's file is complete before the manifest names it
        if not self.main:
            return None
        return Checkpoint(
            model_name=self.info.model_name,
            model_config=config_to_dict(self.info.model_config),
            spec=self.info.spec_summary,
            model={},
            train_config=self.cfg.to_dict(),
            step=self.step,
            steps_per_epoch=self.steps_per_epoch,
            rng=rng_state(),
            selection=self.selection.state(),
            sharding=model.sharding_key(),
            shard_files=names,
            calibration=self.calibration,
            plan=(self.run_record or {}).get("plan"),
        )

    def _check_finite(self) -> None:
        """Raises FloatingPointError when the losses of the current log window (earlier windows were
        checked when logged) or the dense weights are not finite, so that a diverged run never replaces
        a good checkpoint (one sync, at saves only)."""
        total = float(self._loss_sum) if self.env is None else all_reduce_sum(float(self._loss_sum))
        bad = [n for n, p in self.model.named_parameters() if id(p) not in self._table_ids
               and not bool(torch.isfinite(p).all())]  # fmt: skip
        bad_count = len(bad) if self.env is None else all_reduce_sum(float(len(bad)))
        if not math.isfinite(total) or bad_count:
            what = (
                f"the training loss became {total}" if not math.isfinite(total) else f"weights {bad[:3]} hold NaN/Inf"
            )
            raise FloatingPointError(
                f"{what} by step {self.step}; training stopped and the last checkpoint was kept. The learning "
                f"rate ({self.cfg.lr:g}) may be too high, or the warmup too short"
            )

    # -------------------------------------------------------------------------------- logging
    def _log(self, record: dict[str, Any]) -> None:
        if self.member is not None:  # a seed ensemble's member: its records say which
            record = {**record, "member": self.member}
        if self.log_path is not None and self.main:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.log_path, "a") as f:
                f.write(json.dumps(record) + "\n")
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

    # ---------------------------------------------------------------------- model selection
    @property
    def _inner(self) -> nn.Module:
        """The model whose state dict this process holds (a HybridModel's wrapped model: its shards)."""
        return self.model.model if self.env is not None else self.model

    def _local_state(self) -> dict[str, torch.Tensor]:
        """A copy of the weights this process holds (the whole model, or a rank's shards and replicas)."""
        return {k: v.detach().clone() for k, v in self._inner.state_dict().items()}

    def _logits_of(self, states: list[dict[str, torch.Tensor]], dataset) -> list[np.ndarray]:
        """``dataset``'s logits (float64) under each of ``states`` in turn; the model's weights are as before
        afterwards."""
        kept, out = self._local_state(), []
        for state in states:
            self._inner.load_state_dict(state)
            out.append(np.asarray(self._logits(dataset), np.float64))
        self._inner.load_state_dict(kept)
        return out

    def _ensemble_logits(self, dataset) -> np.ndarray:
        """The selected ensemble's logits on ``dataset``: its members' logits averaged (not calibrated)."""
        logits = self._logits_of(snapshot_states(self.snapshots, self.ensemble), dataset)
        return np.mean(logits, axis=0).astype(np.float32)

    def _calibrate(self, ensemble_logits: np.ndarray | None) -> None:
        """Fits the kept model's logit scale on validation (``calibrate``; ``eval/calibration.py``) and logs
        the fit; the checkpoint saved next stores it. ``ensemble_logits``: a kept snapshot ensemble's
        validation logits (``_form_ensemble``'s); None: the selected weights are scored here."""
        self.calibration, self.calibration_record = None, {}
        if self.validation_set is None or len(self.validation_set) == 0 or self.cfg.calibrate == "off":
            return
        if ensemble_logits is not None:
            logits = ensemble_logits
        elif self.best_state is not None:
            logits = self._logits_of([self.best_state], self.validation_set)[0].astype(np.float32)
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
        metrics, logits = self._score_validation()
        if sel.guarding_baseline and logits is not None:
            metrics["baseline_z"] = self._baseline_z(logits)
        selected = sel.update(self.step, metrics, baseline=baseline)
        if selected:
            self.best_state = self._local_state()
            self._baseline_logits = logits if baseline else None
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
                  "best_step": sel.best_step, "lr_scale": sel.lr_scale}  # fmt: skip
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
        return predict_logits(self.model, dataset, self.device, self.cfg.eval_batch_size, self.amp_dtype, env=self.env)

    def _baseline_validation_logits(self) -> Any:
        """The selected (baseline) weights' validation logits; after a resume, recomputed from them."""
        if self._baseline_logits is None:
            current = self._local_state()
            self._inner.load_state_dict(self.best_state)
            self._baseline_logits = self._logits(self.validation_set)
            self._inner.load_state_dict(current)
        return self._baseline_logits

    def kept_states(self) -> list[dict[str, torch.Tensor]]:
        """After ``fit``: the state dicts of the kept model, in host memory (several for an ensemble)."""
        if self.ensemble is not None:
            return [{k: v.cpu() for k, v in state.items()} for state in snapshot_states(self.snapshots, self.ensemble)]
        return [{k: v.cpu() for k, v in self._local_state().items()}]

    def _keep_best(self) -> None:
        """Puts the selected weights into the model (the last ones when nothing was selected)."""
        if self.best_state is None or self.selection.best_step == self.step:
            return
        self._inner.load_state_dict(self.best_state)

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

    def _fit_normalizer(self) -> None:
        """Before the first step: the model's numerical inputs standardised (and raw amounts logged) with
        statistics of the training data (``models.inputs.NumericalNormalizer``), and the first-order term's
        bucket cut points set at their quantiles (``models.inputs.NumericalBuckets``)."""
        from ctrkit.models.inputs import normalizer_sample

        inner = getattr(self.model, "model", self.model)
        norm = getattr(inner, "numerical_norm", None)
        if norm is None or norm.log_mask.numel() == 0:
            return
        drawn = normalizer_sample(self.train_set, labels=True)
        if drawn is None:
            return
        sample, labels = drawn
        fitted = norm.fit(sample)
        buckets = getattr(inner, "wide_buckets", None)
        if buckets is not None:  # the first-order term's cut points, fewer where clicks (or non-clicks) are few
            clicks = int(np.count_nonzero(self.train_set.labels()))  # reads the memory-mapped labels through
            seen = norm(sample.to(norm.shift.device)).cpu()
            rarer = min(clicks, len(self.train_set) - clicks)
            fitted.update(buckets.fit(sample, rarer_label_rows=rarer, labels=labels, seen=seen))
        self._log({"event": "numerical_normalizer", "step": 0, "rows": int(sample.shape[0]), **fitted})

    def _warm_start(self) -> None:
        """``linear_warm_start``: the first-order term fitted as a logistic regression, the deep output
        zeroed, and the result evaluated on validation at step 0 (so selection can keep it)."""
        inner = getattr(self.model, "model", self.model)
        if not (self.cfg.linear_warm_start and getattr(inner, "wide_embeddings", None) is not None):
            return
        if self.validation_set is None or len(self.validation_set) == 0:
            return
        from ctrkit.train.linear_fit import FIRST_ORDER_MODULES, fit_first_order

        cache = self.warm_start_cache
        modules = {name: getattr(inner, name) for name in FIRST_ORDER_MODULES if getattr(inner, name, None) is not None}
        if cache:  # a later member of a seed ensemble: the first member's fit, which is deterministic in the data
            for name, module in modules.items():
                module.load_state_dict(cache["states"][name])
            fit = {**cache["fit"], "reused": True}
        else:
            fit = fit_first_order(self.model, self.train_set, self.validation_set)
            if cache is not None:
                cache["fit"] = fit
                cache["states"] = {name: {k: v.detach().clone() for k, v in module.state_dict().items()}
                                   for name, module in modules.items()}  # fmt: skip
        self._log({"event": "warm_start", "step": 0, **fit})
        if self.progress:
            how = "reused from the seed ensemble's first member" if fit.get("reused") else f"{fit['seconds']:.1f} s"
            tqdm.write(f"first-order term fitted as a logistic regression on {fit['rows']:,} rows (C {fit['C']:g}, "
                       f"validation AUC {fit['validation_auc']:.4f}, {how})")  # fmt: skip
        self.validate(baseline=True)

    # ----------------------------------------------------------------------------------- loop
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
        if self.step == 0 and self.selection.best_step is None:
            self._fit_normalizer()
            self._warm_start()
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
                        self.save()
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
        if self.calibration_record:
            result["calibration"] = self.calibration_record
        if self.test_set is not None and len(self.test_set):
            logits = self._logits(self.test_set)
            kept = logits if self.ensemble is None else self._ensemble_logits(self.test_set)
            test = scored_with_parts(self.test_set, kept, self.calibration, logits if self.ensemble else None)
            if self.ensemble is not None:
                test["ensemble"] = self.ensemble
            self._log({"event": "test", "mapping": "test", "step": self.step, "best_step": result["best_step"],
                       **test})  # fmt: skip
            result.update(test)
        if self.tensorboard is not None:
            self.tensorboard.close()
        return result
