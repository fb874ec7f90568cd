"""A model ready to answer requests: (numerical, categorical) arrays in, click probabilities out.

Backends: ``torch`` (the checkpoint's PyTorch model), ``onnx`` (onnxruntime) and ``torchscript``,
the last two from a directory written by ``ctrkit export``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import torch


class Predictor:
    """Scores batches; ``meta`` describes the inputs (see ``export.exporter.model_metadata``).

    Shapes: numerical (B, N) float32, categorical (B, F) int64 -> (B, 1) float32.
    """

    def __init__(self, meta: dict, backend: str, run):
        self.meta = meta
        self.backend = backend
        self._run = run
        self.num_numerical = int(meta["num_numerical"])
        self.num_categorical = len(meta["cardinalities"])

    def __call__(self, numerical: np.ndarray, categorical: np.ndarray) -> np.ndarray:
        return self._run(np.ascontiguousarray(numerical, np.float32), np.ascontiguousarray(categorical, np.int64))

    @classmethod
    def from_checkpoint(cls, checkpoint: str | os.PathLike, threads: int | None = None) -> Predictor:
        from ctrkit.export.exporter import InferenceModel, model_metadata
        from ctrkit.train.checkpoint import load_checkpoint, model_from_checkpoint

        ckpt = load_checkpoint(checkpoint)
        meta = model_metadata(ckpt)
        model = InferenceModel(model_from_checkpoint(ckpt).cpu(), meta["cardinalities"]).eval()

        @torch.inference_mode()
        def run(numerical: np.ndarray, categorical: np.ndarray) -> np.ndarray:
            return model(torch.from_numpy(numerical), torch.from_numpy(categorical)).numpy()

        return cls(meta, "torch", run)

    @classmethod
    def from_export(cls, model_dir: str | os.PathLike) -> Predictor:
        from ctrkit.export.exporter import INPUT_CATEGORICAL, INPUT_NUMERICAL, OUTPUT, find_model_dir

        root = find_model_dir(model_dir)
        meta = json.loads((root / "ctrkit_model.json").read_text())
        files = [p for p in (root / meta["file"], root / "1" / meta["file"]) if p.exists()]
        if not files:
            raise ValueError(f"{root}: model file '{meta['file']}' named in ctrkit_model.json not found")
        path = files[0]
        if path.suffix == ".onnx":
            import onnxruntime as ort

            session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])

            def run(numerical: np.ndarray, categorical: np.ndarray) -> np.ndarray:
                return session.run([OUTPUT], {INPUT_NUMERICAL: numerical, INPUT_CATEGORICAL: categorical})[0]

            return cls(meta, "onnx", run)
        module = torch.jit.load(str(path))

        @torch.inference_mode()
        def run_ts(numerical: np.ndarray, categorical: np.ndarray) -> np.ndarray:
            return module(torch.from_numpy(numerical), torch.from_numpy(categorical)).numpy()

        return cls(meta, "torchscript", run_ts)


def load_predictor(checkpoint: Path | None, model_dir: Path | None) -> Predictor:
    if (checkpoint is None) == (model_dir is None):
        raise ValueError("give exactly one of --checkpoint and --model-dir")
    return Predictor.from_checkpoint(checkpoint) if checkpoint is not None else Predictor.from_export(model_dir)
