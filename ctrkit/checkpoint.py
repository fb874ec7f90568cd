"""The typed checkpoint: everything needed to rebuild, evaluate, serve or resume a run, in one file.

Written by training, read by evaluation, export and serving (none of which imports ``train/``). The
file holds plain containers and tensors only, so reading it needs no pickle of arbitrary objects
(``torch.load(..., weights_only=True)``). Its ``format`` names the layout version: version 3 is
this dataclass's fields; version 2 files (the kept model told by which of ``ensemble`` and ``member_ensemble`` was
set) load through ``_from_v2``, version 1 files (written before the typed checkpoint) through ``_from_v1`` then
``_from_v2``; any other version is refused with a message naming it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ctrkit.calibration import check_scale
from ctrkit.checkpoint_files import CheckpointError, read_torch_file, write_sealed
from ctrkit.checkpoint_shards import assemble_shards, read_rank_file, table_prefix
from ctrkit.models.registry import create_model, make_config

FORMAT = "ctrkit-checkpoint"
VERSION = 3
_V1 = "ctrkit-checkpoint-v1"

# what a checkpoint's kept model is (``Checkpoint.kept["kind"]``): one model (``model``); the mean of the logits of
# the snapshots at ``kept["steps"]`` (from ``snapshots``); the mean of the kept models of the seed-ensemble members
# ``kept["members"]`` (from ``members``, each one model or its snapshots' mean)
SINGLE, SNAPSHOT_MEAN, SEED_MEAN = "single", "snapshot_mean", "seed_mean"
KEPT_KINDS = (SINGLE, SNAPSHOT_MEAN, SEED_MEAN)
# what ``Checkpoint.resume`` holds (version 2 held each as a field of its own, the weights as ``resume_model``)
RESUME_KEYS = ("optimizers", "steps_per_epoch", "rng", "rank_optimizers", "selection", "model", "member")


def kept_model(snapshot_steps: list[int] | None = None, members: list[int] | None = None) -> dict[str, Any]:
    """The ``kept`` record of a checkpoint whose kept model is the mean of the snapshots at ``snapshot_steps``, or
    of the seed-ensemble ``members`` (their indices), or (neither) one model."""
    if members is not None:
        return {"kind": SEED_MEAN, "members": [int(i) for i in members]}
    if snapshot_steps:
        return {"kind": SNAPSHOT_MEAN, "steps": [int(s) for s in snapshot_steps]}
    return {"kind": SINGLE}


# the spec summary's fields a model depends on (see FeatureSpec.summary)
SPEC_KEYS = (
    "numerical_features",
    "categorical_features",
    "cardinalities",
    "multi_hot_features",
    "multi_hot_cardinalities",
    "multi_hot_combiners",
    "dynamic_features",
)


# model config fields added after checkpoints were written without them, with the value that reproduces
# the models those checkpoints hold (their defaults may differ)
LEGACY_FIELDS = {"dlrm": {"linear": False}, "dcnv2": {"linear": False}}


@dataclass
class Checkpoint:
    """One saved state of a run.

    Attributes:
        model_name: the registered model name (``ctrkit models``).
        model_config: the model config's fields as plain values (see ``registry.config_to_dict``).
        spec: the dataset's spec summary the model was trained on (features, cardinalities).
        model: the single-process model's state dict (whole tables, whatever the world size): the
            weights the run selected (its best validation evaluation), else its last ones.
        train_config: the resolved TrainConfig as a dict (None for a model saved without a run).
        step: optimizer steps taken.
        resume: what a resumed run continues from, beside ``model`` (empty: a model alone), each key read as the
            property of its name: ``optimizers`` (the optimizers' state dicts in TrainConfig's order: dense,
            embedding, wide), ``steps_per_epoch`` (batches per epoch of the run: to resume at the same place),
            ``rng`` (torch's CPU and CUDA generator states), ``rank_optimizers`` (a hybrid-parallel run's optimizer
            states per rank), ``selection`` (model selection on validation data: the best step, its metrics, the
            plateau and early-stopping counters; None: a run without validation), ``model`` (the weights at
            ``step`` where they differ from ``model``, a run checkpointed past its best evaluation: read as
            ``resume_model``) and ``member`` (in a seed ensemble, the member whose training the weights,
            optimizers and selection belong to; the earlier ones are in ``members``).
        sharding: a hybrid-parallel run's shard placement (None: single process).
        shard_files: a hybrid-parallel run's checkpoint is this file (the manifest, written last) plus
            one file per rank (these names, relative to the manifest's directory, in rank order) holding
            that rank's weights (``model``, ``resume_model``: its shards and the replicated weights) and
            its ``optimizers``; ``load_checkpoint`` assembles them (see ``assemble_shards``). None: one file.
        kept: which model the checkpoint keeps (what ``build_model`` builds): ``{"kind": "single"}`` (``model``),
            ``{"kind": "snapshot_mean", "steps": [...]}`` (the mean of the logits of those steps' ``snapshots``) or
            ``{"kind": "seed_mean", "members": [...]}`` (the mean of those ``members``' kept models: all of them, or
            the best one alone); ``kept_model`` makes it.
        snapshots: a single-process run's snapshot pool (``TrainConfig.snapshot_ensemble``): the best
            evaluations of its best epochs, each ``{"epoch", "step", "score", "model"}`` (``model``: a state
            dict); None: no pool.
        members: a seed ensemble's trained members (``TrainConfig.seed_ensemble``), in seed order, each
            ``{"seed", "best_step", "steps", "validation", "models"}`` (``models``: the state dicts of the model
            that member kept, several for a snapshot ensemble); None: a run of one model.
        calibration: the positive scale the kept model's logit is multiplied by before the sigmoid
            (``TrainConfig.calibrate``; fitted on validation at the end of training): ``Scoring``, ``Predictor``
            and exports apply it, ``build_model`` does not (the model's own logits); None: no scale.
        shard_records: with ``shard_files``, what each rank file must be, in rank order: ``{"run", "step",
            "rank", "digest"}`` (the run that wrote it, its step, its rank, its tensors' digest); a rank file
            from another run, step or rank is refused naming it. None: one file, or written before these.
        preprocessing: what turned the training data's raw rows into the model's inputs (feature names, value -> id
            maps, raw-id hashing, numerical transforms and fills: ``RowTransform.to_state``; Outbrain's lookups and
            statistics: ``OutbrainTransform.to_state``), so raw rows can be scored without the dataset; None: the
            dataset had no record of it.
        plan: the run's plan (``train/plan.py``: every mechanism on or off and why, the memory estimate, the models
            a request runs) as plain values; None: saved without one.
    """

    model_name: str
    model_config: dict[str, Any]
    spec: dict[str, Any]
    model: dict[str, torch.Tensor]
    train_config: dict[str, Any] | None = None
    step: int = 0
    resume: dict[str, Any] = field(default_factory=dict)
    sharding: dict[str, list] | None = None
    shard_files: list[str] | None = None
    kept: dict[str, Any] = field(default_factory=kept_model)
    snapshots: list[dict[str, Any]] | None = None
    members: list[dict[str, Any]] | None = None
    calibration: float | None = None
    plan: dict[str, Any] | None = None
    shard_records: list[dict[str, Any]] | None = None
    preprocessing: dict[str, Any] | None = None

    def row_transform(self):
        """The preprocessing that made the training data, to apply to raw rows (``preprocess.carried``);
        None where the checkpoint carries none (a dataset made without a record: synthetic, NVIDIA's, an older
        ctrkit's)."""
        if self.preprocessing is None:
            return None
        from ctrkit.preprocess import carried

        try:
            return carried.from_state(self.preprocessing)
        except (KeyError, TypeError, ValueError) as e:
            problem = f"{type(e).__name__}: {e}"
            raise CheckpointError(f"the checkpoint's preprocessing record is unreadable ({problem})") from None

    def like(self, where: str):
        """The model's preprocessing for a later day's table (``preprocess table --like``: ``preprocess.like.Like``),
        ``where`` naming the checkpoint in messages."""
        from ctrkit.preprocess.like import Like

        return Like.of(self.row_transform(), self.spec, where, self.model_config.get("multi_hot_combiners"))

    @property
    def optimizers(self) -> list[dict] | None:
        return self.resume.get("optimizers")

    @property
    def rank_optimizers(self) -> list | None:
        return self.resume.get("rank_optimizers")

    @property
    def steps_per_epoch(self) -> int | None:
        return self.resume.get("steps_per_epoch")

    @property
    def rng(self) -> dict[str, Any] | None:
        return self.resume.get("rng")

    @property
    def selection(self) -> dict[str, Any] | None:
        return self.resume.get("selection")

    @property
    def resume_model(self) -> dict[str, torch.Tensor] | None:
        return self.resume.get("model")

    @property
    def member(self) -> int | None:
        return self.resume.get("member")

    def resuming(self, **changes: Any) -> Checkpoint:
        """A copy whose ``resume`` takes ``changes`` (keys of ``RESUME_KEYS``)."""
        unknown = set(changes) - set(RESUME_KEYS)
        if unknown:
            raise ValueError(f"not resume state: {sorted(unknown)}")
        return replace(self, resume={**self.resume, **changes})

    @property
    def ensemble(self) -> list[int] | None:
        """The steps of the snapshots whose mean is the kept model (``kept``), else None."""
        return list(self.kept["steps"]) if self.kept["kind"] == SNAPSHOT_MEAN else None

    @property
    def member_ensemble(self) -> list[int] | None:
        """The seed-ensemble members whose mean is the kept model (``kept``), else None."""
        return list(self.kept["members"]) if self.kept["kind"] == SEED_MEAN else None

    @property
    def models_averaged(self) -> int:
        """How many models' logits the kept model averages (1: a single model)."""
        kind = self.kept["kind"]
        if kind == SEED_MEAN:
            return sum(len(member["models"]) for member in self._kept_members())
        return len(self.kept["steps"]) if kind == SNAPSHOT_MEAN else 1

    def _kept_members(self) -> list[dict[str, Any]]:
        """The seed-ensemble members whose mean is the kept model (a ``SEED_MEAN`` kept record: checked on load)."""
        if self.members is None:
            raise CheckpointError("the kept model is a seed ensemble's mean, and the checkpoint holds no members")
        return [self.members[i] for i in self.kept["members"]]

    @property
    def kept_step(self) -> int:
        """The step of the weights the run kept (its best validation evaluation), else the last step."""
        best = (self.selection or {}).get("best_step")
        return int(best) if best is not None else int(self.step)

    @property
    def resume_weights(self) -> dict[str, torch.Tensor]:
        """The weights training continues from."""
        return self.resume_model if self.resume_model is not None else self.model

    @property
    def epoch(self) -> int:
        return self.step // self.steps_per_epoch if self.steps_per_epoch else 0

    @property
    def batch_in_epoch(self) -> int:
        """Batches of ``epoch`` already trained."""
        return self.step % self.steps_per_epoch if self.steps_per_epoch else self.step

    def build_model(self, assign: bool = False) -> nn.Module:
        """The model rebuilt from the stored config, with the stored weights.

        With ``assign``, the model is built without memory of its own (on the meta device) and takes the
        checkpoint's tensors as its parameters: with a memory-mapped checkpoint, tables stay on disk. A
        sharded checkpoint left unassembled gives a model whose tables stay on the meta device (read them
        through ``sharded_table_views``). A checkpoint whose run selected a snapshot ensemble gives that
        ``Ensemble``.
        """
        config = make_config(self.model_name, self.model_config)
        kind = self.kept["kind"]
        if kind == SEED_MEAN:  # each member's kept model, one or a snapshot mean
            return member_model(self._kept_members(), lambda state: self._build_one(config, state, assign))
        if kind == SNAPSHOT_MEAN:
            from ctrkit.models.ensemble import Ensemble

            return Ensemble([self._build_one(config, state, assign) for state in self.ensemble_states()])
        if not (assign and self.shard_files):
            return self._build_one(config, self.model, assign)
        with torch.device("meta"):
            model = create_model(self.model_name, config)
        # the replicated weights from rank 0's file; the tables stay in the rank files
        state = read_rank_file(self, 0)["model"]  # verified (read once), then its pages read again on use
        prefixes = tuple(f"{table_prefix(n)}." for n in self.sharding or {})
        state = {k: v for k, v in state.items() if not k.startswith(prefixes)}
        missing = model.load_state_dict(state, assign=True, strict=False).missing_keys
        unexpected = [k for k in missing if not k.startswith(prefixes)]
        if unexpected:
            raise CheckpointError(f"{self.shard_files[0]}: lacks the weights {unexpected[:3]}")
        return _checked_buffers(model)

    def ensemble_states(self) -> list[dict[str, torch.Tensor]]:
        """The state dicts of the ensemble's members, in ``ensemble``'s order."""
        return snapshot_states(self.snapshots or [], self.ensemble or [])

    def _build_one(self, config: Any, state: dict[str, torch.Tensor], assign: bool) -> nn.Module:
        """One model from a whole state dict (``assign``: built on the meta device, taking its tensors)."""
        if not assign:
            model = create_model(self.model_name, config)
            model.load_state_dict(state)
            return model
        with torch.device("meta"):
            model = create_model(self.model_name, config)
        model.load_state_dict(state, assign=True)
        return _checked_buffers(model)

    def extended_by(self, spec_summary: dict[str, Any]) -> bool:
        """Whether a dataset's vocabularies extend this model's (``preprocess table --like``): each of its values
        keeps its id, and values it has not seen have ids after its tables' rows."""
        ours = self.spec.get("vocabulary")
        return bool(ours) and ours in spec_summary.get("extends", [])

    def other_vocabulary(self, spec_summary: dict[str, Any]) -> bool:
        """Whether a dataset's ids mean other values than this model's: both record vocabularies, they differ, and
        the dataset's do not extend the model's (``extended_by``)."""
        ours, theirs = self.spec.get("vocabulary"), spec_summary.get("vocabulary")
        return bool(ours and theirs and ours != theirs) and not self.extended_by(spec_summary)

    def check_spec(
        self, spec_summary: dict[str, Any], where: str, allow_other_vocabulary: bool = False, growing: bool = False
    ) -> None:
        """Raises CheckpointError when a dataset's features differ from those the model was trained on, or
        (unless ``allow_other_vocabulary``) its vocabularies do: where both record a fingerprint, ids that
        differ mean other values, and the model's scores would mean nothing. ``growing`` (a run that continues
        from the model): a dataset whose vocabularies extend the model's passes with more rows per feature."""
        extended = self.extended_by(spec_summary)
        for key in SPEC_KEYS:
            a, b = list(self.spec.get(key, [])), list(spec_summary.get(key, []))
            if a == b:
                continue
            grown = key in ("cardinalities", "multi_hot_cardinalities") and len(a) == len(b)
            if growing and extended and grown and all(y >= x for x, y in zip(a, b)):
                continue
            if extended and grown:
                raise CheckpointError(
                    f"{where} extends the checkpoint's vocabularies (values it has not seen have ids beyond its "
                    "tables): continue training on it (train --continue-from), or score its raw rows with "
                    "predict --input"
                )
            if key == "cardinalities" and len(a) == len(b):
                i, x, y = next((i, x, y) for i, (x, y) in enumerate(zip(a, b)) if x != y)
                name = self.spec["categorical_features"][i]
                detail = f"feature '{name}' has cardinality {y} in {where} but {x} in the checkpoint"
            else:
                detail = f"{key}: checkpoint has {a}, {where} has {b}"
            if self.other_vocabulary(spec_summary):
                detail += (" (its vocabularies are other than the checkpoint's: write it with the model's, "
                           "`preprocess table --like CHECKPOINT`)")  # fmt: skip
            raise CheckpointError(f"the checkpoint was trained on a different feature spec: {detail}")
        if self.other_vocabulary(spec_summary) and not allow_other_vocabulary:
            ours, theirs = self.spec.get("vocabulary"), spec_summary.get("vocabulary")
            raise CheckpointError(
                f"{where} was preprocessed with other vocabularies than the checkpoint's training data (fingerprint "
                f"{theirs}, the checkpoint's {ours}): the same id means another value there, so scores would be "
                "meaningless; preprocess it with the training data (one `ctrkit preprocess` run) or with this model's "
                "vocabularies (`preprocess table --like CHECKPOINT`), or pass `allow_other_vocabulary` to use it anyway"
            )

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": VERSION, **{f.name: getattr(self, f.name) for f in fields(self)}}

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "checkpoint") -> Checkpoint:
        """A checkpoint from what ``torch.load`` returned; older versions are converted, unknown ones refused."""
        if not isinstance(data, dict):
            raise CheckpointError(f"{where}: not a ctrkit checkpoint (expected a mapping)")
        if data.get("format") == _V1:
            data = _from_v2(_from_v1(data))
        elif data.get("format") != FORMAT:
            raise CheckpointError(f"{where}: not a ctrkit checkpoint (format {data.get('format')!r})")
        elif data.get("version") == 2:
            data = _from_v2(data)
        elif data.get("version") != VERSION:
            raise CheckpointError(
                f"{where}: checkpoint format version {data.get('version')!r} is not readable by this ctrkit "
                f"(it reads versions 2 and {VERSION}, and {_V1})"
            )
        missing = {"model_name", "model_config", "model"} - set(data)
        if missing:
            raise CheckpointError(f"{where}: checkpoint lacks {sorted(missing)}")
        data = {**data, "model_config": {**LEGACY_FIELDS.get(data["model_name"], {}), **data["model_config"]}}
        known = {f.name for f in fields(cls)}
        try:
            data["calibration"] = check_scale(data.get("calibration"), where)
        except ValueError as e:
            raise CheckpointError(str(e)) from None
        _check_kept(data, where)
        return cls(**{"spec": {}, **{k: v for k, v in data.items() if k in known}})


def member_model(members: list[dict[str, Any]], build) -> nn.Module:
    """The model of seed-ensemble ``members`` (``Checkpoint.members`` entries): each member's kept model (its
    state built with ``build``, or the ``Ensemble`` of its snapshot states), and several members as the
    ``Ensemble`` of those (each member weighs the same)."""
    from ctrkit.models.ensemble import Ensemble

    def one(member):
        states = member["models"]
        return build(states[0]) if len(states) == 1 else Ensemble([build(s) for s in states])

    return one(members[0]) if len(members) == 1 else Ensemble([one(m) for m in members])


def snapshot_states(snapshots: list[dict[str, Any]], steps: list[int]) -> list[dict[str, torch.Tensor]]:
    """The weights of the snapshots taken at ``steps``, in that order (a snapshot pool's entries, see
    ``Checkpoint.snapshots``)."""
    by_step = {int(s["step"]): s["model"] for s in snapshots}
    missing = [step for step in steps if step not in by_step]
    if missing:
        raise CheckpointError(f"the ensemble names steps {missing} that the snapshots lack")
    return [by_step[step] for step in steps]


def _checked_buffers(model: nn.Module) -> nn.Module:
    """``model``, unless a buffer was left on the meta device (not stored, so not rebuilt lazily)."""
    for name, buffer in model.named_buffers():  # non-persistent buffers (offsets, indices) are rebuilt
        if buffer.is_meta:
            raise CheckpointError(f"buffer '{name}' is not stored in the checkpoint; cannot build the model lazily")
    return model


def _renamed(d: dict[str, Any]) -> dict[str, Any]:
    return {k.replace("multihot", "multi_hot"): v for k, v in d.items()}


def _from_v1(data: dict[str, Any]) -> dict[str, Any]:
    """A version-1 checkpoint (an untyped dict; ``multihot_*`` field names) in version 2's layout."""
    out = {k: v for k, v in data.items() if k not in ("format", "epoch", "batch_in_epoch")}
    out["model_config"] = _renamed(data.get("model_config", {}))
    out["spec"] = _renamed(data.get("spec", {}))
    return {"format": FORMAT, "version": 2, **out}


def _from_v2(data: dict[str, Any]) -> dict[str, Any]:
    """A version-2 checkpoint in version 3's layout: its kept model, told by which of ``member_ensemble`` (a seed
    ensemble's kept members) and ``ensemble`` (a snapshot mean's steps) was set, as ``kept``; its resume state, a
    field each, as ``resume``."""
    v2_names = {k: "resume_model" if k == "model" else k for k in RESUME_KEYS}
    out = {k: v for k, v in data.items() if k not in ("ensemble", "member_ensemble", *v2_names.values())}
    out["kept"] = kept_model(data.get("ensemble"), data.get("member_ensemble"))
    out["resume"] = {k: data[old] for k, old in v2_names.items() if data.get(old) is not None}
    return {**out, "version": VERSION}


def _check_kept(data: dict[str, Any], where: str) -> None:
    """Refuses a ``kept`` record of an unknown kind or naming snapshots or members the checkpoint lacks."""
    kept = data.get("kept", {"kind": SINGLE})
    kind = kept.get("kind") if isinstance(kept, dict) else None
    if kind not in KEPT_KINDS:
        raise CheckpointError(f"{where}: its kept model is of kind {kind!r}; expected one of {', '.join(KEPT_KINDS)}")
    if kind == SEED_MEAN:
        held = len(data.get("members") or [])
        if not kept.get("members") or any(not 0 <= int(i) < held for i in kept["members"]):
            raise CheckpointError(f"{where}: its kept model names members {kept.get('members')} of the {held} it holds")
    if kind == SNAPSHOT_MEAN:
        steps = {int(s["step"]) for s in data.get("snapshots") or []}
        if not kept.get("steps") or not set(map(int, kept["steps"])) <= steps:
            raise CheckpointError(f"{where}: its kept model names snapshots {kept.get('steps')} it does not hold")


def save_checkpoint(path: str | os.PathLike, ckpt: Checkpoint) -> None:
    """Writes ``ckpt`` atomically (to a temp file in the same directory, fsynced, then renamed) with the
    digest of its tensors (``integrity``); a disk without room for its tensors is refused before writing."""
    write_sealed(path, ckpt.to_dict())


def load_checkpoint(
    path: str | os.PathLike, mmap: bool = False, assemble: bool = True, verify: bool = True
) -> Checkpoint:
    """Reads a checkpoint with ``weights_only=True`` (tensors and plain containers only).

    With ``mmap``, tensors stay in the file (memory-mapped, read on use) instead of being loaded. ``verify`` checks
    the digest of its contents (a memory-mapped file is then read once, through the page cache, which the
    kernel reclaims: a checkpoint larger than memory can be checked and read); only a reader that wants the
    model's name and config and reads the file whole, verified, later turns it off. A sharded checkpoint (a
    hybrid-parallel run's) is assembled into whole tables unless ``assemble`` is False (then ``model`` is empty
    and each rank reads its own file: ``read_rank_file``); every rank file read is verified too.
    """
    path = Path(path)
    ckpt = Checkpoint.from_dict(read_torch_file(path, mmap, verify), str(path))
    if ckpt.shard_files:  # stored relative to the manifest; absolute from here on
        ckpt.shard_files = [str(path.parent / f) for f in ckpt.shard_files]
        if assemble:
            ckpt = assemble_shards(ckpt)
    return ckpt


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
