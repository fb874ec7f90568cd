"""Scoring during training: a model's logits on a mapping, the logits of other weights put in its place for a
while (their tensors exchanged with the model's, no copy of the tables), and the kept model's metrics beside
what each of its parts earned."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch import nn

from ctrkit.calibration import calibrated
from ctrkit.distributed.env import DistEnv
from ctrkit.eval.evaluator import metrics_of, predict_logits
from ctrkit.models.contract import TableCollection


class Scorer:
    """Scores ``model`` (``inner``: the module whose state dict this process holds, a hybrid-parallel model's
    wrapped one) in batches of ``batch_size`` under autocast ``dtype`` (None: none); in a job (``env``) every
    rank scores its share and gets the whole array."""

    def __init__(
        self,
        model: nn.Module,
        inner: nn.Module,
        device: torch.device,
        batch_size: int,
        dtype: torch.dtype | None,
        env: DistEnv | None,
    ):
        self.model, self.inner, self.device = model, inner, device
        self.batch_size, self.dtype, self.env = batch_size, dtype, env

    def logits(self, dataset) -> np.ndarray:
        """``dataset``'s logits (float32) under the model's current weights."""
        return predict_logits(self.model, dataset, self.device, self.batch_size, self.dtype, env=self.env)

    def logits_of(self, states: list[dict[str, torch.Tensor]], dataset) -> list[np.ndarray]:
        """``dataset``'s logits (float64) under each of ``states`` in turn; the model's weights are as before
        afterwards."""
        out = []
        for state in states:
            with self.weights(state):
                out.append(np.asarray(self.logits(dataset), np.float64))
        return out

    @contextlib.contextmanager
    def weights(self, state: dict[str, torch.Tensor]) -> Iterator[None]:
        """Inside, the model computes with ``state``'s tensors: each parameter's and buffer's data is exchanged
        with ``state``'s (no copy of the tables where they are on the model's device; a GPU model's weights kept
        on disk are copied to it for the while) and exchanged back on the way out."""
        with torch.no_grad():
            slots = _slots(self.inner, state)
            state = dict(state)  # the caller's dict keeps its tensors
            for attr, store, key, full in slots:
                if attr != "tier" and state[full].device != store[key].device:
                    state[full] = state[full].to(store[key].device)

            def swap() -> None:
                for attr, store, key, full in slots:
                    _exchange(attr, store, key, state, full)

            swap()
            try:
                yield
            finally:
                swap()


def _slots(inner: nn.Module, state: dict[str, torch.Tensor]) -> list[tuple[str, Any, str, str]]:
    """Where each of ``state``'s tensors goes in ``inner``: (kind, store, key, state key)."""
    slots = []
    for name, module in inner.named_modules():
        prefix = f"{name}." if name else ""
        tiered = isinstance(module, TableCollection) and module.tier is not None
        if tiered and f"{prefix}weight" in state:
            slots.append(("tier", module.tier, "weight", f"{prefix}weight"))
        for attr, store in (("param", module._parameters), ("buffer", module._buffers)):
            for key, t in store.items():
                full = prefix + key
                if attr == "param" and key == "weight" and tiered:
                    continue  # its cache: the tier's slot above reads the table
                if t is None or full not in state or state[full].shape != t.shape:
                    continue
                slots.append((attr, store, key, full))
    missing = set(state) - {s[3] for s in slots}
    if missing:
        raise ValueError(f"weights {sorted(missing)[:3]} do not fit the model")
    return slots


def _exchange(attr: str, store: Any, key: str, state: dict[str, torch.Tensor], full: str) -> None:
    """Exchanges the data of module tensor ``store[key]`` with ``state[full]`` (a parameter keeps its object)."""
    if attr == "tier":  # tiered tables: reads go to ``state``'s table instead (``TieredTable.override``)
        store.override, state[full] = state[full], store.override
    elif attr == "param":
        ours = store[key].data
        store[key].data = state[full]
        state[full] = ours
    else:
        store[key], state[full] = state[full], store[key]


def scored_with_parts(dataset, logits: np.ndarray, scale: float | None, single: np.ndarray | None) -> dict[str, Any]:
    """``dataset``'s metrics under the kept model: ``logits`` (an ensemble's mean, or one model's) with the logit
    ``scale`` applied; beside them, the AUC and log loss of the logits unscaled (``uncalibrated``, when scaled) and
    of the ensemble's best single model (``single``: its logits, unscaled), so a run says what each part earned."""
    test: dict[str, Any] = metrics_of(dataset, calibrated(logits, scale))
    if scale is not None:
        test["uncalibrated"] = _auc_logloss(metrics_of(dataset, logits))
    if single is not None:
        test["single"] = _auc_logloss(metrics_of(dataset, single))
    return test


def _auc_logloss(metrics: dict[str, Any]) -> dict[str, float]:
    return {k: metrics[k] for k in ("auc", "logloss")}
