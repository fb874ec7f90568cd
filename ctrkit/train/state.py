"""A run's checkpoints: when and where they are written (whole, or one file per rank of a hybrid-parallel job with
a manifest written last), the checks a resumed or continued run passes first, and the optimizer states it takes."""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import yaml
from torch import nn

from ctrkit.checkpoint import Checkpoint, save_checkpoint
from ctrkit.checkpoint_shards import rank_file_name, write_rank_file
from ctrkit.config import TrainConfig
from ctrkit.data.atomic import atomic_file
from ctrkit.distributed.env import DistEnv, all_reduce_sum
from ctrkit.train.optim import SparseRowOptimizer
from ctrkit.train.run_log import RunLog

NO_OPTIMIZER_STATE = (
    "the checkpoint holds no optimizer state (an older `ctrkit convert-checkpoint --world-size` wrote it); "
    "resume from the checkpoint it was converted from (evaluate, predict, export and serve read it as it is)"
)
OPTIMIZER_KINDS = ("optimizer", "embedding_optimizer", "wide_optimizer")


class Checkpointer:
    """Writes a run's checkpoints to ``save_path`` (None: nowhere), each step's once; ``run_record`` (the resolved
    run) goes beside it as YAML at the run's first save, never before, so a run that saves nothing leaves what is
    there untouched. In a hybrid-parallel job (``env``) every rank writes its own file and rank 0 the manifest."""

    def __init__(self, save_path, env: DistEnv | None, run_record: dict[str, Any] | None, log: RunLog):
        self.save_path = Path(save_path) if save_path else None
        self.env, self.run_record, self.log = env, run_record, log
        self.main = env is None or env.is_main
        self.saved_step: int | None = None
        self.run_id: str | None = None  # a hybrid-parallel run's id in its rank files (rank 0's, broadcast)

    def due(self, step: int) -> bool:
        """Whether a save at ``step`` writes anything (a step already saved is not written again)."""
        return self.save_path is not None and self.saved_step != step

    def changed(self) -> None:
        """What the last save wrote has changed (a calibration, an ensemble): the next save writes again."""
        self.saved_step = None

    def write(self, step: int, checkpoint: Checkpoint | None, written: Callable[[], None]) -> None:
        """Writes ``checkpoint`` of ``step`` (rank 0's manifest in a job; None on the other ranks), then calls
        ``written()``."""
        started = time.perf_counter()
        if self.main and checkpoint is not None:
            save_checkpoint(self.save_path, checkpoint)
            written()
            self.log.write(
                {
                    "event": "checkpoint",
                    "step": step,
                    "seconds": round(time.perf_counter() - started, 3),
                    "bytes": self.save_path.stat().st_size,
                }
            )
            if self.env is not None:
                _remove_older_rank_files(self.save_path, step)
            if self.run_record is not None and self.saved_step is None:  # this run's first save
                with atomic_file(self.save_path.with_suffix(".yaml")) as tmp, open(tmp, "w") as f:
                    yaml.safe_dump(self.run_record, f, sort_keys=False)
        self.saved_step = step

    def write_rank_file(self, step: int, part: dict[str, Any]) -> tuple[list[str], list] | None:
        """A hybrid-parallel save: this rank's weights and optimizer states (``part``) in its own file, written
        atomically; once every rank's is, rank 0 gets the files' names and records for the manifest (None on the
        other ranks). No rank holds more than its own."""
        env = self.env
        names = [rank_file_name(self.save_path, step, r, env.world_size) for r in range(env.world_size)]
        if self.run_id is None:  # one id for the run's rank files, rank 0's
            shared = [uuid.uuid4().hex]
            torch.distributed.broadcast_object_list(shared, src=0)
            self.run_id = shared[0]
        record = write_rank_file(self.save_path.parent / names[env.rank], part, self.run_id, step, env.rank)
        records: list = [None] * env.world_size
        torch.distributed.all_gather_object(records, record)  # every rank's file is complete: the manifest names it
        return (names, records) if self.main else None


def _remove_older_rank_files(path: Path, step: int) -> None:
    """Deletes the rank files of ``path``'s earlier saves (the manifest now names this step's)."""
    folder = path.parent / f"{path.name}.shards"
    for f in folder.glob("step*-rank*-of-*.pt"):
        try:
            if int(f.name[4:].split("-", 1)[0]) < step:
                f.unlink(missing_ok=True)
        except ValueError:
            continue


def _optimizer_kinds(ckpt: Checkpoint, cfg: TrainConfig) -> tuple[list, list]:
    return [(ckpt.train_config or {}).get(k) for k in OPTIMIZER_KINDS], [getattr(cfg, k) for k in OPTIMIZER_KINDS]


# settings a resumed run cannot apply: each acted before the checkpoint's step (the start's fit and its test, the
# seed of every epoch's batch order), so a resume with another value would be neither run
RESUME_FIXED = ("seed", "linear_warm_start", "warm_start_z", "warm_start_logloss")


def check_resumable(ckpt: Checkpoint, cfg: TrainConfig, steps_per_epoch: int, optimizers: int) -> None:
    """Raises ValueError where this run cannot resume ``ckpt``'s: other batches per epoch, no optimizer state, other
    optimizers, another value of a ``RESUME_FIXED`` setting than the checkpoint's run had (both as the trainer
    resolved them)."""
    theirs = ckpt.train_config or {}
    changed = [f for f in RESUME_FIXED if f in theirs and theirs[f] != getattr(cfg, f)]
    if changed:
        said = ", ".join(f"{f} {getattr(cfg, f)} (the checkpoint's: {theirs[f]})" for f in changed)
        raise ValueError(
            f"a resumed run continues the run it was taken from and cannot apply {said}: resume with the same "
            "settings, or start a new run from its weights with --continue-from"
        )
    if ckpt.steps_per_epoch not in (None, steps_per_epoch):
        raise ValueError(
            f"the checkpoint's run had {ckpt.steps_per_epoch} batches per epoch, this one "
            f"has {steps_per_epoch}: resume with the same dataset and batch size"
        )
    if ckpt.rank_optimizers is not None and any(s is None for s in ckpt.rank_optimizers):
        raise ValueError(NO_OPTIMIZER_STATE)
    theirs, ours = _optimizer_kinds(ckpt, cfg)
    if (len(ckpt.optimizers or []) != optimizers and not ckpt.shard_files) or theirs != ours:
        raise ValueError(
            f"the checkpoint's optimizers (dense/embedding/wide: {theirs}) differ from this run's ({ours}); "
            "resume with the same optimizer, embedding_optimizer and wide_optimizer"
        )


def check_continuable(ckpt: Checkpoint, cfg: TrainConfig, optimizers: int, distributed: bool, where: str) -> None:
    """Raises ValueError where a new run cannot start from ``ckpt``'s model (``--continue-from``, named ``where``)."""
    if distributed or ckpt.shard_files or ckpt.rank_optimizers is not None:
        raise ValueError(f"{where}: --continue-from starts one process from a single-process checkpoint")
    theirs, ours = _optimizer_kinds(ckpt, cfg)
    if theirs != ours or len(ckpt.optimizers or []) != optimizers:
        raise ValueError(
            f"{where}: the checkpoint's optimizers (dense/embedding/wide: {theirs}) differ from this run's "
            f"({ours}); continue with the same optimizer, embedding_optimizer and wide_optimizer"
        )
    if ckpt.models_averaged > 1:
        raise ValueError(
            f"{where}: the checkpoint's model is an ensemble of {ckpt.models_averaged}; "
            "--continue-from continues one model (train it with --snapshot-ensemble 1 "
            "--seed-ensemble 1)"
        )


def continued_weights(ckpt: Checkpoint) -> tuple[dict[str, torch.Tensor], bool]:
    """The model a new run continues from (the kept member's in a seed ensemble) and whether the checkpoint's
    optimizer states are that model's (they are the last member's)."""
    if ckpt.member_ensemble is None:
        return ckpt.model, True
    kept = ckpt.member_ensemble[0]
    return ckpt.members[kept]["models"][0], kept == len(ckpt.members) - 1


def continued_tables(model: nn.Module, ckpt: Checkpoint) -> tuple[dict[str, torch.Tensor], dict, bool]:
    """``continued_weights`` for ``model``, whose tables may have more rows a feature than the checkpoint's
    (``--continue-from`` on data preprocessed ``--like`` it: ``models/growth.py``); also each grown table's
    (rows before, rows after) and whether the optimizer states are the model's."""
    from ctrkit.models.embeddings import fill_pending_tables
    from ctrkit.models.growth import grown_weights, table_rows
    from ctrkit.models.registry import create_model, make_config
    from ctrkit.models.storage import DEFERRED

    weights, own = continued_weights(ckpt)
    before = table_rows(create_model(ckpt.model_name, make_config(ckpt.model_name, ckpt.model_config), DEFERRED))
    if before == table_rows(model):
        return weights, {}, own
    fill_pending_tables(model)  # the new rows: the model's own initial values
    grown, changed = grown_weights(weights, before, model)
    return grown, changed, own


def grown_optimizer_states(optimizers: list, states: list, model: nn.Module, changed: dict) -> list:
    """The optimizers' ``states`` with each grown table's per-row states grown as its rows (``continued_tables``):
    the learned rows' states kept, the new rows' at the optimizer's initial values (``optimizers.KINDS``; 0 for
    others)."""
    from ctrkit.models.growth import grown

    names = {id(p): name for name, p in model.named_parameters()}
    out = []
    for opt, state in zip(optimizers, states):
        if state is None:
            out.append(None)
            continue
        record = opt.record if isinstance(opt, SparseRowOptimizer) else None
        initial = dict(record.value_state + record.row_state) if record is not None else {}
        params = [p for group in opt.param_groups for p in group["params"]]
        entries = dict(state["state"])
        for index, p in enumerate(params):
            if names.get(id(p)) not in changed or index not in entries:
                continue
            old_rows, new_rows = changed[names[id(p)]]
            entry = dict(entries[index])
            for key, value in entry.items():
                if torch.is_tensor(value) and value.dim() and value.shape[0] == sum(old_rows):
                    fill = torch.full((sum(new_rows), *value.shape[1:]), float(initial.get(key, 0.0)),
                                      dtype=value.dtype)  # fmt: skip
                    entry[key] = grown(value, fill, old_rows, new_rows)
            entries[index] = entry
        out.append({**state, "state": entries})
    return out


def load_optimizer_states(optimizers: list, states: list) -> None:
    """Loads each optimizer's per-parameter state (None: left as it is); the rates and other settings stay the
    optimizer's own, this run's: a resumed run applies the rates it is given (``--lr``, ``--embedding-lr``, ...), as
    a continued one does, and with the same settings continues exactly as the run would have."""
    for opt, state in zip(optimizers, states):
        if state is None:
            continue
        settings = [{k: v for k, v in group.items() if k != "params"} for group in opt.param_groups]
        opt.load_state_dict(state)
        for group, mine in zip(opt.param_groups, settings):
            group.update(mine)


def check_finite(
    loss_sum: torch.Tensor, model: nn.Module, table_ids: set[int], env: DistEnv | None, step: int, lr: float
) -> None:
    """Raises FloatingPointError when the losses of the current log window (earlier windows were checked when
    logged) or the dense weights are not finite, so that a diverged run never replaces a good checkpoint (one
    sync, at saves only)."""
    total = float(loss_sum) if env is None else all_reduce_sum(float(loss_sum))
    bad = [n for n, p in model.named_parameters() if id(p) not in table_ids and not bool(torch.isfinite(p).all())]
    bad_count = len(bad) if env is None else all_reduce_sum(float(len(bad)))
    if not math.isfinite(total) or bad_count:
        what = f"the training loss became {total}" if not math.isfinite(total) else f"weights {bad[:3]} hold NaN/Inf"
        raise FloatingPointError(
            f"{what} by step {step}; training stopped and the last checkpoint was kept. The learning "
            f"rate ({lr:g}) may be too high, or the warmup too short"
        )
