"""Scoring a dataset with a model and summarising the scores."""

from __future__ import annotations

import os
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from ctrkit.calibration import calibrated
from ctrkit.checkpoint import Checkpoint, load_checkpoint
from ctrkit.config import ParallelConfig
from ctrkit.data.dataset import SplitBinaryDataset
from ctrkit.data.device_feed import DeviceFeed, narrow_on
from ctrkit.data.feature_spec import FeatureSpec
from ctrkit.data.loader import BatchLoader, part_bounds
from ctrkit.distributed.env import DistEnv, gather_in_order
from ctrkit.metrics import log_loss_from_logits, mean_average_precision, roc_auc, sigmoid
from ctrkit.progress import tqdm


@torch.no_grad()
def predict_logits(
    model: nn.Module,
    dataset: SplitBinaryDataset,
    device: torch.device,
    batch_size: int = 16384,
    amp_dtype: torch.dtype | None = None,
    progress: bool = False,
    env: DistEnv | None = None,
) -> np.ndarray:
    """Logits of every sample of ``dataset``, in dataset order, as a (N,) float32 array.

    In a hybrid-parallel job (``env``) every rank scores its share of each batch and every rank
    returns the whole array.
    """
    was_training = model.training
    model.eval()
    # a GPU's batches read narrow into pinned memory and copied one ahead (``DeviceFeed``), as training's
    loader = BatchLoader(dataset, batch_size, shuffle=False, part=env and env.part, narrow=narrow_on(device))
    bounds = [loader.global_bounds(i) for i in range(len(loader))]
    if env is not None:
        bounds = [part_bounds(lo, hi, *env.part) for lo, hi in bounds]
    positions = np.concatenate([np.arange(lo, hi) for lo, hi in bounds]) if bounds else np.zeros(0, np.int64)
    out = np.empty(len(positions), dtype=np.float32)
    pos = 0
    team = scoring_team(device, env)
    batches = DeviceFeed(device)(loader.epoch(0))
    try:
        for batch in tqdm(batches, total=len(loader), desc="scoring", unit="batch", disable=not progress, leave=False):
            if team is None:
                out[pos : pos + len(batch)] = _forward(model, batch, device, amp_dtype)
            else:
                _score_split(model, batch, amp_dtype, team, out[pos : pos + len(batch)])
            pos += len(batch)
    finally:
        batches.close()  # stops the prefetch thread even when scoring fails
        model.train(was_training)
    out = out if env is None else gather_in_order(out, positions, len(dataset))
    bad = int(np.count_nonzero(~np.isfinite(out)))
    if bad:
        raise FloatingPointError(
            f"the model's scores are NaN or infinite for {bad:,} of {len(out):,} samples of "
            f"'{dataset.mapping}': its weights are not finite (a diverged run?); retrain it"
        )
    return out


SCORE_SLICE = 2048  # rows a CPU worker thread scores at once (a batch's slices share the threads): see _score_split


def scoring_team(device: torch.device, env: DistEnv | None = None):
    """The CPU's worker threads for scoring (``thread_split.py``'s team, one intra-op thread each), or None: on
    CUDA, in a hybrid-parallel job (its collectives run on the calling thread) or with one thread."""
    if device.type != "cpu" or env is not None or torch.get_num_threads() < 2:
        return None
    from ctrkit import thread_split

    return thread_split.team(torch.get_num_threads())


def _forward(model: nn.Module, batch: Any, device: torch.device, amp_dtype: torch.dtype | None) -> np.ndarray:
    with torch.no_grad(), torch.autocast(device.type, dtype=amp_dtype) if amp_dtype is not None else nullcontext():
        logits = model(batch.numerical, batch.categorical, batch.multi_hot)
    return logits.float().cpu().numpy()


def _score_split(model: nn.Module, batch: Any, amp_dtype: torch.dtype | None, team: Any, out: np.ndarray) -> None:
    """Scores ``batch`` into ``out`` on the CPU in slices (``score_in_slices``)."""
    cpu = torch.device("cpu")
    score_in_slices(team, len(batch), lambda s: _forward(model, batch.rows(s), cpu, amp_dtype), out)


def score_in_slices(team: Any, rows: int, score: Any, out: np.ndarray) -> None:
    """``out[s] = score(s)`` for slices ``s`` of ``range(rows)`` of at most ``SCORE_SLICE`` rows, dealt in turn to
    the team's threads (``scoring_team``), each running whole forward passes on one intra-op thread. Each row's
    score is the one the whole batch's forward pass gives, to float rounding (the products run over fewer rows).
    Why: one forward pass spread over the threads by ATen meets at every operation, and a small slice's
    activations stay in the cache; measured in docs/decisions/memory-plan.md."""
    from ctrkit import thread_split

    pieces = thread_split.slices(rows, -(-rows // SCORE_SLICE))
    workers = len(team.workers)

    def job(mine: list[slice]):
        def run() -> None:
            for s in mine:
                out[s] = score(s)

        return run

    team.run([job(pieces[w::workers]) for w in range(min(workers, len(pieces)))])


def evaluate(
    model: nn.Module,
    dataset: SplitBinaryDataset,
    device: torch.device,
    batch_size: int = 16384,
    amp_dtype: torch.dtype | None = None,
    progress: bool = False,
    env: DistEnv | None = None,
) -> dict[str, float]:
    """AUC and log loss of ``model`` over the whole of ``dataset``, and MAP@12 when it has groups.

    Returns:
        ``{"auc", "logloss", "samples", "ctr"}``; ``ctr`` is the mean label, for reading log loss.
        When the mapping stores the spec's map channel, also ``"map@12"`` and ``"map_groups"`` (the
        groups with a click, over which the mean is taken).
    """
    return metrics_of(dataset, predict_logits(model, dataset, device, batch_size, amp_dtype, progress, env))


def metrics_of(dataset: SplitBinaryDataset, logits: np.ndarray) -> dict[str, float]:
    """``evaluate``'s metrics of ``logits`` (in dataset order) against ``dataset``'s labels and groups."""
    labels = dataset.labels()
    metrics = {
        "auc": roc_auc(labels, logits),
        "logloss": log_loss_from_logits(labels, logits),
        "samples": int(len(labels)),
        "ctr": float(labels.mean()) if len(labels) else float("nan"),
    }
    groups = dataset.groups()
    if groups is not None:
        metrics["map@12"], metrics["map_groups"] = mean_average_precision(groups, labels, logits, k=12)
    return metrics


@dataclass
class Scoring:
    """A checkpoint's model ready to score a dataset mapping (sharded over the ranks in a torchrun job)."""

    checkpoint: Checkpoint
    dataset: SplitBinaryDataset
    model: nn.Module
    device: torch.device
    env: DistEnv | None

    @classmethod
    def load(
        cls,
        checkpoint: str | os.PathLike,
        dataset: str | os.PathLike,
        mapping: str = "test",
        device: str = "auto",
        parallel: ParallelConfig | None = None,
        allow_other_vocabulary: bool = False,
    ) -> Scoring:
        """Reads the checkpoint, checks it fits the dataset's features, and builds its model on the device."""
        from ctrkit.checkpoint_shards import MappedSource, assemble_shards, read_rank_file
        from ctrkit.device import resolve_device
        from ctrkit.distributed.env import init_distributed, launched_by_torchrun
        from ctrkit.distributed.hybrid import shard_for_job
        from ctrkit.models.registry import create_model, make_config
        from ctrkit.models.storage import DEFERRED

        par = parallel or ParallelConfig()
        distributed = launched_by_torchrun()
        # memory-mapped and checked: the model takes the file's tables (no second copy, tables larger than memory)
        ckpt = load_checkpoint(checkpoint, mmap=True, assemble=not distributed)
        spec = FeatureSpec.from_yaml(dataset)
        ckpt.check_spec(spec.summary(), str(spec.base_dir), allow_other_vocabulary)
        if distributed and ckpt.models_averaged > 1:
            raise ValueError(
                f"{checkpoint}: holds an ensemble of {ckpt.models_averaged} models, which scores in one process; "
                "run this command without torchrun"
            )
        data = SplitBinaryDataset(spec, mapping)
        env = init_distributed(device, par.dist_timeout) if distributed else None
        dev = env.device if env is not None else resolve_device(device)
        if env is None or not ckpt.shard_files:
            model = ckpt.build_model(assign=True).to(dev)
            model = shard_for_job(model, env, par)  # the checkpoint's whole tables are already in the model
            return cls(ckpt, data, model, dev, env)
        # each rank allocates only its shards
        model = create_model(ckpt.model_name, make_config(ckpt.model_name, ckpt.model_config), DEFERRED)
        model = shard_for_job(model, env, par, device=dev)
        if ckpt.sharding == model.sharding_key():  # the layout it was written with: this rank's file only
            source = MappedSource([ckpt.shard_files[env.rank]])  # its pages dropped as they are copied
            source.load_state(model.model, read_rank_file(ckpt, env.rank)["model"])
        else:  # another layout: each rank reads its shards' rows and columns from the (memory-mapped) rank files
            ckpt = assemble_shards(ckpt, lazy=True)
            model.load_full_state_dict(ckpt.model)
        return cls(ckpt, data, model, dev, env)

    @property
    def is_main(self) -> bool:
        return self.env is None or self.env.is_main

    def logits(self, batch_size: int = 16384, amp: bool = False, progress: bool = False) -> np.ndarray:
        """(N,) float32 logits of the checkpoint's kept model in dataset order, its calibration applied (what
        ``predict``, exports and the server turn into probabilities)."""
        from ctrkit.device import amp_dtype_for, device_facts

        local = batch_size // (self.env.world_size if self.env is not None else 1)  # one process's share
        amp_dtype = amp_dtype_for(device_facts(self.device), amp, None, local, training=False)
        logits = predict_logits(self.model, self.dataset, self.device, batch_size, amp_dtype, progress, self.env)
        return calibrated(logits, self.checkpoint.calibration)

    def evaluate(self, batch_size: int = 16384, amp: bool = False, progress: bool = False) -> dict[str, Any]:
        """``evaluate``'s metrics, plus the mapping, the model name, the step of the kept weights (``step``) and the
        steps the run trained (``steps_trained``)."""
        metrics = metrics_of(self.dataset, self.logits(batch_size, amp, progress))
        ckpt = self.checkpoint
        return {**metrics, "mapping": self.dataset.mapping, "model": ckpt.model_name, "step": ckpt.kept_step,
                "steps_trained": int(ckpt.step)}  # fmt: skip

    def predict(self, batch_size: int = 16384, progress: bool = False) -> np.ndarray:
        """(N,) float32 click probabilities in dataset order."""
        return sigmoid(self.logits(batch_size, progress=progress)).astype(np.float32)
