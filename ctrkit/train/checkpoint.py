"""Checkpoints: one file with everything needed to rebuild, evaluate or resume a run.

Contents (plain containers and tensors only, so loading needs no pickle of arbitrary objects and
is done with ``torch.load(..., weights_only=True)``):
``format``, ``model_name``, ``model_config``, ``spec`` (what the model depends on in the feature
spec), ``train_config``, ``model`` (state dict), ``optimizer`` (state dict), ``step``, ``epoch``,
``batch_in_epoch`` (batches of ``epoch`` already trained), ``rng`` (torch CPU/CUDA generator states).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ctrkit.data.atomic import atomic_file
from ctrkit.models.registry import create_model, make_config

FORMAT = "ctrkit-checkpoint-v1"


class CheckpointError(ValueError):
    """A checkpoint that cannot be read or does not fit the data or model it is used with."""


def save_checkpoint(path: str | os.PathLike, state: dict[str, Any]) -> None:
    """Writes ``state`` atomically: to a temp file in the same directory, fsynced, then renamed."""
    with atomic_file(path) as tmp:
        torch.save({"format": FORMAT, **state}, tmp)


def load_checkpoint(path: str | os.PathLike, mmap: bool = False) -> dict[str, Any]:
    """Reads a checkpoint with ``weights_only=True`` (tensors and plain containers only).

    With ``mmap``, tensors stay in the file (memory-mapped, read on use) instead of being loaded.
    """
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: checkpoint not found")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as e:  # truncated file, not a torch file, forbidden pickled object
        raise CheckpointError(
            f"{path}: not a readable ctrkit checkpoint ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
        ) from None
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a ctrkit checkpoint (expected format '{FORMAT}')")
    return ckpt


def model_from_checkpoint(ckpt: dict[str, Any], assign: bool = False) -> nn.Module:
    """Rebuilds the model from the config stored in the checkpoint and loads its weights.

    With ``assign``, the model is built without memory of its own (on the meta device) and takes the
    checkpoint's tensors as its parameters: with a memory-mapped checkpoint, tables stay on disk.
    """
    config = make_config(ckpt["model_name"], ckpt["model_config"])
    if not assign:
        model = create_model(ckpt["model_name"], config)
        model.load_state_dict(ckpt["model"])
        return model
    with torch.device("meta"):
        model = create_model(ckpt["model_name"], config)
    model.load_state_dict(ckpt["model"], assign=True)
    for name, buffer in model.named_buffers():  # non-persistent buffers (offsets, indices) are rebuilt
        if buffer.is_meta:
            raise CheckpointError(f"buffer '{name}' is not stored in the checkpoint; cannot build the model lazily")
    return model


def check_spec_matches(ckpt: dict[str, Any], spec_summary: dict[str, Any], where: str) -> None:
    """Raises CheckpointError when the dataset's features differ from those the model was trained on."""
    trained = ckpt["spec"]
    keys = (
        "numerical_features",
        "categorical_features",
        "cardinalities",
        "multihot_features",
        "multihot_cardinalities",
        "multihot_combiners",
    )
    for key in keys:
        a, b = list(trained.get(key, [])), list(spec_summary.get(key, []))
        if a == b:
            continue
        if key == "cardinalities" and len(a) == len(b):
            diff = [(i, x, y) for i, (x, y) in enumerate(zip(a, b)) if x != y]
            i, x, y = diff[0]
            name = trained["categorical_features"][i]
            detail = f"feature '{name}' has cardinality {y} in {where} but {x} in the checkpoint"
        else:
            detail = f"{key}: checkpoint has {a}, {where} has {b}"
        raise CheckpointError(f"the checkpoint was trained on a different feature spec: {detail}")


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
