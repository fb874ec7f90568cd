"""A run's state: the checkpoint it saves (whole, or sharded over the ranks of a hybrid-parallel job) and
restores, so that a resumed run continues exactly where it stopped."""

from __future__ import annotations

import math
import time
import uuid
from pathlib import Path

import torch
import yaml

from ctrkit.checkpoint import Checkpoint, rng_state, save_checkpoint, set_rng_state
from ctrkit.checkpoint_shards import MappedSource, rank_file_name, read_rank_file, write_rank_file
from ctrkit.data.atomic import atomic_file
from ctrkit.distributed.env import all_reduce_sum
from ctrkit.models.registry import config_to_dict
from ctrkit.train.best_weights import release
from ctrkit.train.selection import Selection

NO_OPTIMIZER_STATE = (
    "the checkpoint holds no optimizer state (an older `ctrkit convert-checkpoint --world-size` wrote it); "
    "resume from the checkpoint it was converted from (evaluate, predict, export and serve read it as it is)"
)


def _remove_older_rank_files(path: Path, step: int) -> None:
    """Deletes the rank files of ``path``'s earlier saves (the manifest now names this step's)."""
    folder = path.parent / f"{path.name}.shards"
    for f in folder.glob("step*-rank*-of-*.pt"):
        try:
            if int(f.name[4:].split("-", 1)[0]) < step:
                f.unlink(missing_ok=True)
        except ValueError:
            continue


class TrainerState:
    """The Trainer's checkpoints: saving, restoring, the sharded form (a mixin of ``Trainer``)."""

    def state(self) -> Checkpoint:
        """The checkpoint of a single-process run (a hybrid-parallel run saves with ``_save_sharded``). Its
        current weights are the model's own tensors, not a copy: write it before training goes on."""
        current = {k: v.detach() for k, v in self._inner.state_dict().items()}
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
            preprocessing=self.info.preprocessing,
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
                self._best_owned = True
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

    def continue_from(self, ckpt: Checkpoint, where: str) -> None:
        """Starts this new run from another run's checkpoint (``--continue-from``): its selected weights (the
        dynamic tables' ids and counts with them) and its optimizers' per-parameter states where they are that
        model's (not where a run of several members kept another member than the last one it trained); the
        learning rates and other optimizer settings are this run's; steps, schedule and model selection start
        over."""
        if self.env is not None or ckpt.shard_files or ckpt.rank_optimizers is not None:
            raise ValueError(f"{where}: --continue-from starts one process from a single-process checkpoint")
        kinds = ("optimizer", "embedding_optimizer", "wide_optimizer")
        theirs = [(ckpt.train_config or {}).get(k) for k in kinds]
        ours = [getattr(self.cfg, k) for k in kinds]
        if theirs != ours or len(ckpt.optimizers or []) != len(self.optimizers):
            raise ValueError(
                f"{where}: the checkpoint's optimizers (dense/embedding/wide: {theirs}) differ from this run's "
                f"({ours}); continue with the same optimizer, embedding_optimizer and wide_optimizer"
            )
        if ckpt.models_averaged > 1:
            raise ValueError(f"{where}: the checkpoint's model is an ensemble of {ckpt.models_averaged}; "
                             "--continue-from continues one model (train it with --snapshot-ensemble 1 "
                             "--seed-ensemble 1)")  # fmt: skip
        weights, own = ckpt.model, True
        if ckpt.member_ensemble is not None:  # the kept member's model; the states are the last member's
            kept = ckpt.member_ensemble[0]
            weights, own = ckpt.members[kept]["models"][0], kept == len(ckpt.members) - 1
        self.model.load_state_dict(weights)
        self.continued = True
        for opt, state in zip(self.optimizers, ckpt.optimizers if own else []):
            if state is not None:  # the per-parameter state; the rates and other settings stay this run's
                settings = [{k: v for k, v in group.items() if k != "params"} for group in opt.param_groups]
                opt.load_state_dict(state)
                for group, mine in zip(opt.param_groups, settings):
                    group.update(mine)

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
                self._best_owned = True
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
            started = time.perf_counter()
            state = self._save_sharded() if self.env is not None else self.state()
            if self.main and state is not None:
                save_checkpoint(self.save_path, state)
                release(self.best_state, self.best_dir)  # the save read them in: back to the file only
                self._log({"event": "checkpoint", "step": self.step, "seconds": round(time.perf_counter() - started, 3),
                           "bytes": self.save_path.stat().st_size})  # fmt: skip
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
        if self._run_id is None:  # one id for the run's rank files, rank 0's
            shared = [uuid.uuid4().hex]
            torch.distributed.broadcast_object_list(shared, src=0)
            self._run_id = shared[0]
        record = write_rank_file(self.save_path.parent / names[env.rank], part, self._run_id, self.step, env.rank)
        records: list = [None] * env.world_size
        torch.distributed.all_gather_object(records, record)  # every rank's file is complete: the manifest names it
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
            shard_records=records,
            calibration=self.calibration,
            plan=(self.run_record or {}).get("plan"),
            preprocessing=self.info.preprocessing,
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
