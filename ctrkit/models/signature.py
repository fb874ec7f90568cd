"""The serving signature: the tensors a served model takes and returns, in one place.

Exports, the server's protocol and metadata, and the inference benchmark all read it. Inputs are
named after the FeatureSpec channels: ``numerical`` (B, N) FP32, ``categorical`` (B, F) INT64 (raw
contiguous ids of the one-hot features) and, for a model with multi-hot features, ``multi_hot``
(B, Fm, L) INT64 (each sample's ids per multi-hot feature, -1 padded to a common length L); the
output is ``probability`` (B, 1) FP32. Ids beyond a table (values unseen at training time) are mapped
to the table's row 0, the recipe's missing/unseen id, inside the model, so no runtime fails on them;
a negative one-hot id does the same, a negative multi-hot id is padding.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from torch import nn

from ctrkit.data.batch import PaddedMultiHot

NUMERICAL, CATEGORICAL, MULTI_HOT, PROBABILITY = "numerical", "categorical", "multi_hot", "probability"


def finite_numerical(values: Any) -> np.ndarray:
    """The ``numerical`` input as float32; NaN, infinities and numbers float32 cannot hold (1e300) are refused, as
    every server of ctrkit's refuses them (ValueError)."""
    with np.errstate(over="ignore"):
        array = np.asarray(values, np.float32)
    if not np.isfinite(array).all():
        raise ValueError(f"input '{NUMERICAL}' holds NaN or infinite values (or numbers beyond float32's range)")
    return array


@dataclass(frozen=True)
class TensorSpec:
    """One tensor of the signature: its name, KServe v2 datatype and the dims after the batch
    dimension (None: any length >= 1)."""

    name: str
    datatype: str
    dims: tuple[int | None, ...]

    def shape(self) -> list[int]:
        """The shape as KServe v2 metadata and Triton configs write it (-1 for variable dims)."""
        return [-1, *(-1 if d is None else d for d in self.dims)]


OUTPUT = TensorSpec(PROBABILITY, "FP32", (1,))


@dataclass(frozen=True)
class Signature:
    """What a model takes and returns when served.

    Attributes:
        num_numerical: N.
        cardinalities: rows of each one-hot feature's table (F entries).
        multi_hot_cardinalities: rows of each multi-hot feature's table (Fm entries; none: no input).
        raw_inputs: with the preprocessing the model carries (``preprocess/transform.py``), one input per raw column
            of the training table, by name, shape (B, 1): text as BYTES, numbers as INT64 or FP32 (what a request
            may send instead of the id inputs); none: the id inputs only.
    """

    num_numerical: int
    cardinalities: tuple[int, ...]
    multi_hot_cardinalities: tuple[int, ...] = ()
    raw_inputs: tuple[TensorSpec, ...] = ()

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> Signature:
        """The signature of a model config given as a dict (as stored in checkpoints and exports; the
        ``multihot_`` spelling of exports written before ctrkit 0.2 is read too)."""
        multi = config.get("multi_hot_cardinalities", config.get("multihot_cardinalities")) or ()
        return cls(int(config["num_numerical"]), tuple(int(c) for c in config["cardinalities"]),
                   tuple(int(c) for c in multi))  # fmt: skip

    @property
    def inputs(self) -> tuple[TensorSpec, ...]:
        specs = (
            TensorSpec(NUMERICAL, "FP32", (self.num_numerical,)),
            TensorSpec(CATEGORICAL, "INT64", (len(self.cardinalities),)),
        )
        if self.multi_hot_cardinalities:  # padded bags: any length L >= 1
            specs += (TensorSpec(MULTI_HOT, "INT64", (len(self.multi_hot_cardinalities), None)),)
        return specs

    @property
    def input_names(self) -> list[str]:
        return [t.name for t in self.inputs]

    @property
    def output(self) -> TensorSpec:
        return OUTPUT

    def metadata(self, model_name: str, step: int = 0) -> dict[str, Any]:
        """What a server needs besides the graph (written as ``ctrkit_model.json`` beside exports)."""
        return {
            "model_name": model_name,
            "num_numerical": self.num_numerical,
            "cardinalities": list(self.cardinalities),
            "multi_hot_cardinalities": list(self.multi_hot_cardinalities),
            "step": int(step),
            "inputs": {t.name: t.datatype for t in self.inputs},
            "output": PROBABILITY,
        }

    def with_raw_inputs(self, features: list[dict[str, Any]]) -> Signature:
        """This signature with the raw inputs ``features`` (``RowTransform.input_specs``: name, datatype, role)."""
        return replace(self, raw_inputs=tuple(TensorSpec(f["name"], f["datatype"], (1,)) for f in features))

    def example_inputs(self, batch: int = 4, seed: int = 0) -> tuple[torch.Tensor, ...]:
        """Random inputs of this shape, some ids out of range and some multi-hot padding on purpose."""
        g = torch.Generator().manual_seed(seed)
        numerical = torch.randn(batch, self.num_numerical, generator=g)
        cats = [torch.randint(0, c + 2, (batch,), generator=g) for c in self.cardinalities]
        inputs = (numerical, torch.stack(cats, 1) if cats else torch.zeros(batch, 0, dtype=torch.int64))
        if self.multi_hot_cardinalities:
            bags = [torch.randint(-1, c + 2, (batch, 3), generator=g) for c in self.multi_hot_cardinalities]
            inputs += (torch.stack(bags, 1),)  # (B, Fm, 3)
        return inputs


class InferenceModel(nn.Module):
    """A trained model as a server runs it: the signature's inputs in, click probabilities out.

    Args:
        model: a single-process ctrkit model.
        signature: its serving signature.
        scale: the checkpoint's calibration (``Checkpoint.calibration``): the logit is multiplied by it, in
            float32, before the sigmoid; None: no scale.

    Shapes: numerical (B, N) float32, categorical (B, F) int64, multi_hot (B, Fm, L) int64 (-1 padding;
    only with multi-hot features) -> probability (B, 1) float32.
    """

    def __init__(self, model: nn.Module, signature: Signature, scale: float | None = None):
        super().__init__()
        # raw ids of dynamic features: translated to rows first (an export leaves this to the server's input step)
        self.dynamic = getattr(model, "dynamic_ids", None)
        if self.dynamic is not None:
            model.dynamic_ids = None
        self.model = model.eval()
        self.scale = None if scale is None else float(scale)
        self.has_numerical = signature.num_numerical > 0
        self.register_buffer("cardinalities", torch.tensor(signature.cardinalities, dtype=torch.int64))
        multi = torch.tensor(signature.multi_hot_cardinalities, dtype=torch.int64)
        self.register_buffer("multi_hot_cardinalities", multi)

    def forward(
        self, numerical: torch.Tensor, categorical: torch.Tensor, multi_hot: torch.Tensor | None = None
    ) -> torch.Tensor:
        if self.dynamic is not None:
            categorical = self.dynamic(categorical)
        outside = (categorical < 0) | (categorical >= self.cardinalities)  # (B, F)
        ids = torch.where(outside, torch.zeros_like(categorical), categorical)
        numerical_in = numerical if self.has_numerical else None
        if numerical_in is None:  # use the (B, 0) input, or exporters drop it from the graph (and Triton's config)
            ids = ids.reshape(numerical.shape[0], -1)  # fails unless both inputs hold B samples
        bags = None
        if multi_hot is not None:  # ids beyond a table -> 0 (unseen); negative ones stay padding
            unseen = multi_hot >= self.multi_hot_cardinalities.view(1, -1, 1)  # (B, Fm, L)
            bags = PaddedMultiHot(torch.where(unseen, torch.zeros_like(multi_hot), multi_hot))
        logits = self.model(numerical_in, ids, bags).float()  # (B,), fp32 under autocast
        if self.scale is not None:
            logits = logits * self.scale
        return torch.sigmoid(logits).unsqueeze(1)  # (B, 1)
