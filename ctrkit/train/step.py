"""One optimizer step on one batch (``TrainStep``): what the trainer and the training benchmarks run."""

from __future__ import annotations

import threading
import warnings
from contextlib import nullcontext

import torch
import torch.nn.functional as F
from torch import nn

from ctrkit import hugepages, thread_split
from ctrkit.data.batch import Batch
from ctrkit.distributed.hybrid import HybridModel
from ctrkit.models import tiered_tables
from ctrkit.models.contract import table_parameter_ids
from ctrkit.models.dynamic import DynamicIds
from ctrkit.models.embeddings import CategoricalEmbeddings
from ctrkit.models.mlp import Dropout, dropout_generator
from ctrkit.train.dynamic_rows import reset_table_rows
from ctrkit.train.optim import SparseRowOptimizer


class TrainStep:
    """One optimizer step on one batch: forward (under autocast), BCE loss, backward, update.

    Shared by the trainer and the training benchmark so both measure the same thing.

    Args:
        model: maps (dense, sparse) to logits (B,).
        optimizers: the optimizers ``build_optimizers`` returns, each with its ``is_wide`` (the first-order part's)
            and ``is_table_optimizer``; each group's ``base_lr`` is scaled by the schedule factor passed to each
            call.
        device: where batches are moved before the forward pass.
        amp_dtype: autocast dtype, or None for full precision. fp16 enables loss scaling.
        compile: run the forward (and its backward) through ``torch.compile``; if compiling fails
            (no C++ compiler or Triton, an unsupported op), in the forward or in the first backward, the
            step says why once and runs eagerly (a step whose backward failed is taken again).
        embedding_l2: adds ``embedding_l2 * sum ||e||^2 / B`` over the embedding vectors ``e`` the
            batch's samples looked up (every CategoricalEmbeddings' output), so only the looked-up rows
            are penalised and the tables' gradients stay sparse.
        weight_decay: adds ``weight_decay / 2 * sum ||W||^2`` over the weight matrices of the dense part.
        split: ``auto`` / ``on`` split each step's batch over the CPU's threads (ctrkit/thread_split.py: one
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
        tables = table_parameter_ids(model)
        self._decayed = [p for p in model.parameters() if p.dim() >= 2 and id(p) not in tables] if weight_decay else []
        self.forward = torch.compile(model) if compile else model
        self.optimizers = optimizers
        self.device = device
        self.amp_dtype = amp_dtype
        self.scaler = torch.amp.GradScaler(device.type) if amp_dtype == torch.float16 else None
        self.split = split
        self.split_threads = self._split_threads(split, compile)
        self._has_dropout = any(isinstance(m, Dropout) and m.p > 0 for m in model.modules())
        self._tiers = tiered_tables.tiers(model)  # tiered tables: each step's rows stay cached until it ends
        self._dynamic = [m for m in model.modules() if isinstance(m, DynamicIds)]  # raw ids: admitted per batch

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
        elif isinstance(self.model, HybridModel):
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
        self,
        batch: Batch,
        scale: float = 1.0,
        global_size: int | None = None,
        wide_scale: float | None = None,
        observed: bool = False,
    ) -> torch.Tensor:
        """One step; returns the loss. ``global_size``: the whole job's batch size when this rank holds
        only part of it (the loss is then this part's sum over ``global_size``). ``wide_scale``: the
        factor of the wide part's optimizers when it differs from ``scale``."""
        for opt in self.optimizers:
            factor = wide_scale if wide_scale is not None and opt.is_wide else scale
            for group in opt.param_groups:
                group["lr"] = group["base_lr"] * factor
        batch = batch.to(self.device, non_blocking=True)
        for tier in self._tiers:
            tier.new_step()
        if not observed:
            for ids in self._dynamic:  # count the batch's raw ids, admit and evict, before the forward looks them up
                reset_table_rows(self.model, self.optimizers, ids.observe(batch.categorical))
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
        # hybrid parallel: the replicated tables' gradients summed over ranks
        sync = self.model.sync_gradients if isinstance(self.model, HybridModel) else None
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
                return self(batch, scale, global_size, wide_scale, observed=True)
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
        """The step with the batch split into ``n`` slices over ``n`` worker threads (ctrkit/thread_split.py)."""
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
        deferring = [isinstance(opt, SparseRowOptimizer) for opt in self.optimizers]
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
