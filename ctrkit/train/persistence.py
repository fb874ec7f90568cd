"""What a run saves and takes back: its checkpoints (one file, or a hybrid-parallel job's rank files and manifest),
a resume from one, and a new run started from another run's model (``--continue-from``).

A ``RunStore`` belongs to one ``Trainer`` (``trainer.store``) and reads the trainer's state (the model, optimizers,
selection, snapshot pool, step) to write it, or sets it from a checkpoint; the files themselves are written by the
trainer's ``state.Checkpointer``.
"""

from __future__ import annotations

from typing import Any

import torch

from ctrkit.checkpoint import Checkpoint, kept_model, rng_state, set_rng_state
from ctrkit.checkpoint_shards import MappedSource, read_rank_file
from ctrkit.models.registry import config_to_dict
from ctrkit.models.tiered_tables import tiered_keys
from ctrkit.train.best_weights import kept_on_disk
from ctrkit.train.state import (
    NO_OPTIMIZER_STATE,
    check_continuable,
    check_finite,
    check_resumable,
    continued_tables,
    grown_optimizer_states,
    load_optimizer_states,
)


class RunStore:
    """The checkpoints of a trainer's run: ``save``, ``checkpoint``, ``restore`` and ``continue_from``."""

    def __init__(self, trainer: Any):
        self.trainer = trainer

    def save(self) -> None:
        """Checkpoints the current step (once: a step already saved is not written again).

        In a hybrid-parallel run every rank takes part and rank 0 writes.
        """
        t = self.trainer
        if not t.checkpoints.due(t.step):
            return
        check_finite(t.window.loss_sum, t.model, t.table_ids, t.env, t.step, t.cfg.lr)
        state = self._sharded_checkpoint() if t.env is not None else self.checkpoint()
        t.checkpoints.write(t.step, state, t.selector.release)  # the save read the kept tables in

    def _weights_to_save(self) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor] | None]:
        """The checkpoint's ``model`` (the kept weights) and ``resume_model`` (the current ones, where they differ)."""
        t = self.trainer
        current = {k: v.detach() for k, v in t.inner.state_dict().items()}
        best = t.selector.best_state
        if best is None:
            return current, None
        return best, current if t.selection.best_step != t.step else None

    def _checkpoint_fields(self) -> dict[str, Any]:
        """What every checkpoint of this run records besides weights and optimizer states."""
        t = self.trainer
        return dict(
            model_name=t.info.model_name,
            model_config=config_to_dict(t.info.model_config),
            spec=t.info.spec_summary,
            train_config=t.cfg.to_dict(),
            step=t.step,
            calibration=t.calibration,
            plan=(t.checkpoints.run_record or {}).get("plan"),
            preprocessing=t.info.preprocessing,
        )

    def _resume_state(self) -> dict[str, Any]:
        """What every checkpoint of this run records to resume from besides weights and optimizer states."""
        t = self.trainer
        return {"steps_per_epoch": t.steps_per_epoch, "rng": rng_state(), "selection": t.selection.state()}

    def checkpoint(self) -> Checkpoint:
        """The checkpoint of a single-process run. Its current weights are the model's own tensors, not a copy:
        write it before training goes on."""
        t = self.trainer
        model, resume = self._weights_to_save()
        optimizers = [opt.state_dict() for opt in t.optimizers]
        return Checkpoint(
            **self._checkpoint_fields(),
            model=model,
            resume={**self._resume_state(), "model": resume, "optimizers": optimizers, "member": t.log.member},
            snapshots=list(t.pool.snapshots) if t.pool.size > 1 else None,
            kept=kept_model(t.pool.ensemble),
            members=list(t.members_done) if t.log.member is not None else None,
        )

    def _sharded_checkpoint(self) -> Checkpoint | None:
        """A hybrid-parallel save: every rank's own file (``Checkpointer.write_rank_file``); rank 0 gets the
        manifest to write (last, so a checkpoint is complete or the previous one stands), the others None."""
        t = self.trainer
        model, resume = self._weights_to_save()
        part = {"model": model, "resume_model": resume, "optimizers": [opt.state_dict() for opt in t.optimizers]}
        files = t.checkpoints.write_rank_file(t.step, part)
        if files is None:
            return None
        names, records = files
        return Checkpoint(
            **self._checkpoint_fields(),
            model={},
            resume=self._resume_state(),
            sharding=t.model.sharding_key(),
            shard_files=names,
            shard_records=records,
        )

    def restore(self, ckpt: Checkpoint) -> None:
        """Continues the run a checkpoint was taken from (weights, optimizer, step, RNG)."""
        t = self.trainer
        check_resumable(ckpt, t.cfg, t.steps_per_epoch, len(t.optimizers))
        if ckpt.shard_files:  # a sharded checkpoint of this very sharding (else it was assembled): own file
            self._restore_rank_file(ckpt)
            return
        if t.env is None:
            t.model.load_state_dict(ckpt.resume_weights)
        # else: each rank took its shards of the weights when the model was sharded (see train/run.py)
        t.selector.restore(ckpt.selection, lambda: self._best_of(ckpt), owned=t.env is not None)
        if t.env is None and t.pool.size > 1:
            t.pool.snapshots = list(ckpt.snapshots or [])
        states = ckpt.optimizers or []
        if ckpt.sharding is not None or t.env is not None:
            from ctrkit.distributed.sharded_state import optimizer_states_for_rank

            rank = t.env.rank if t.env is not None else None
            states = optimizer_states_for_rank(t.optimizers, states, ckpt.rank_optimizers, ckpt.sharding, t.model, rank)
        load_optimizer_states(t.optimizers, states)
        t.step = int(ckpt.step)
        set_rng_state(ckpt.rng)

    def _best_of(self, ckpt: Checkpoint) -> dict[str, torch.Tensor]:
        """This process's part of a checkpoint's selected weights: all of them on its device, or a rank's shards."""
        t = self.trainer
        if t.env is None:  # a tiered table, and a table the run keeps on disk, stays in the checkpoint's mapping
            tiered, best_dir = tiered_keys(t.model), t.selector.best_dir
            return {k: v if k in tiered or kept_on_disk(v, best_dir) else v.to(t.device) for k, v in ckpt.model.items()}
        current = t.local_state()
        t.model.load_full_state_dict(ckpt.model)
        best = t.local_state()
        t.inner.load_state_dict(current)
        return best

    def _restore_rank_file(self, ckpt: Checkpoint) -> None:
        """Resumes from this rank's file of a sharded checkpoint written with the same sharding."""
        t = self.trainer
        if t.env is None or ckpt.sharding != t.model.sharding_key():
            raise ValueError("a sharded checkpoint resumes as it is only with the sharding it was written with")
        part = read_rank_file(ckpt, t.env.rank)
        if part["optimizers"] is None:
            raise ValueError(NO_OPTIMIZER_STATE)
        source = MappedSource([ckpt.shard_files[t.env.rank]])  # pages dropped as they are copied
        weights = part["resume_model"] if part["resume_model"] is not None else part["model"]
        source.load_state(t.inner, weights)
        best = lambda: {k: source.clone(v).to(t.device) for k, v in part["model"].items()}  # noqa: E731
        t.selector.restore(ckpt.selection, best, owned=True)
        load_optimizer_states(t.optimizers, part["optimizers"])
        t.step = int(ckpt.step)
        set_rng_state(ckpt.rng)

    def continue_from(self, ckpt: Checkpoint, where: str) -> None:
        """Starts this new run from another run's checkpoint (``--continue-from``): its selected weights (the
        dynamic tables' ids and counts with them) and its optimizers' per-parameter states where they are that
        model's (not where a run of several members kept another member than the last one it trained); the
        learning rates and other optimizer settings are this run's; steps, schedule and model selection start
        over."""
        t = self.trainer
        check_continuable(ckpt, t.cfg, len(t.optimizers), t.env is not None, where)
        weights, grown, own = continued_tables(t.model, ckpt)  # tables grown for an extended vocabulary
        t.model.load_state_dict(weights)
        t.continued = True
        states = ckpt.optimizers if own else []
        if grown:
            states = grown_optimizer_states(t.optimizers, states, t.model, grown)
        load_optimizer_states(t.optimizers, states)
