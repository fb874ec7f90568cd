"""Exports a trained model for serving: ONNX, TorchScript, or a Triton model repository.

Every artifact takes the tensors of the KServe v2 request ctrkit's server speaks, named after the
FeatureSpec channels: ``numerical`` (B, N) FP32 (the dataset's numerical values) and ``categorical``
(B, F) INT64 (raw contiguous ids of the one-hot features), plus, for a model with multi-hot features,
``multi_hot`` (B, Fm, L) INT64 (each sample's ids per multi-hot feature, padded with -1 to a common
length L), and returns ``probability`` (B, 1) FP32. Ids beyond a table (values unseen at training
time) are mapped to the table's row 0, the recipe's missing/unseen id, inside the graph, so no
runtime fails on them; a negative one-hot id does the same, a negative multi-hot id is padding.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ctrkit.data.atomic import atomic_directory
from ctrkit.data.batch import PaddedMultiHot

FORMATS = ("onnx", "torchscript", "triton")
QUANTIZATIONS = ("none", "int8")
INPUT_NUMERICAL, INPUT_CATEGORICAL, INPUT_MULTI_HOT, OUTPUT = "numerical", "categorical", "multi_hot", "probability"
ONNX_OPSET = 18


class InferenceModel(nn.Module):
    """A trained model as a server runs it: raw ids in, click probabilities out.

    Args:
        model: a single-process ctrkit model.
        cardinalities: rows of each one-hot categorical feature's table.
        multihot_cardinalities: rows of each multi-hot feature's table (none: the model has none).

    Shapes: numerical (B, N) float32, categorical (B, F) int64, multi_hot (B, Fm, L) int64 (-1 padding;
    only with multi-hot features) -> probability (B, 1) float32.
    """

    def __init__(self, model: nn.Module, cardinalities: list[int], multihot_cardinalities: list[int] = ()):
        super().__init__()
        self.model = model.eval()
        self.has_numerical = getattr(getattr(model, "config", None), "num_numerical", 1) > 0
        self.register_buffer("cardinalities", torch.tensor(cardinalities, dtype=torch.int64))
        self.register_buffer("multihot_cardinalities", torch.tensor(list(multihot_cardinalities), dtype=torch.int64))

    def forward(
        self, numerical: torch.Tensor, categorical: torch.Tensor, multi_hot: torch.Tensor | None = None
    ) -> torch.Tensor:
        outside = (categorical < 0) | (categorical >= self.cardinalities)  # (B, F)
        ids = torch.where(outside, torch.zeros_like(categorical), categorical)
        dense = numerical if self.has_numerical else None
        if dense is None:  # use the (B, 0) input, or exporters drop it from the graph (and Triton's config)
            ids = ids.reshape(numerical.shape[0], -1)  # fails unless both inputs hold B samples
        bags = None
        if multi_hot is not None:  # ids beyond a table -> 0 (unseen); negative ones stay padding
            unseen = multi_hot >= self.multihot_cardinalities.view(1, -1, 1)  # (B, Fm, L)
            bags = PaddedMultiHot(torch.where(unseen, torch.zeros_like(multi_hot), multi_hot))
        return torch.sigmoid(self.model(dense, ids, bags).float()).unsqueeze(1)  # (B, 1), fp32 under autocast too


def model_metadata(ckpt: dict) -> dict:
    """What a server needs besides the graph: names, shapes and where the model came from."""
    cfg = ckpt["model_config"]
    multihot = [int(c) for c in cfg.get("multihot_cardinalities") or ()]
    inputs = {INPUT_NUMERICAL: "FP32", INPUT_CATEGORICAL: "INT64", **({INPUT_MULTI_HOT: "INT64"} if multihot else {})}
    return {
        "model_name": ckpt["model_name"],
        "num_numerical": int(cfg["num_numerical"]),
        "cardinalities": [int(c) for c in cfg["cardinalities"]],
        "multihot_cardinalities": multihot,
        "step": int(ckpt.get("step", 0)),
        "inputs": inputs,
        "output": OUTPUT,
    }


def example_inputs(meta: dict, batch: int = 4, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Random inputs of the model's shape (numerical, categorical[, multi_hot]), some ids out of range
    and some multi-hot padding on purpose."""
    g = torch.Generator().manual_seed(seed)
    numerical = torch.randn(batch, meta["num_numerical"], generator=g)
    cats = [torch.randint(0, c + 2, (batch,), generator=g) for c in meta["cardinalities"]]
    inputs = (numerical, torch.stack(cats, 1) if cats else torch.zeros(batch, 0, dtype=torch.int64))
    multihot = meta.get("multihot_cardinalities") or []
    if multihot:
        bags = torch.stack([torch.randint(-1, c + 2, (batch, 3), generator=g) for c in multihot], 1)  # (B, Fm, 3)
        inputs += (bags,)
    return inputs


def input_names(meta: dict) -> list[str]:
    return list(meta.get("inputs") or (INPUT_NUMERICAL, INPUT_CATEGORICAL))


def export_onnx(wrapper: InferenceModel, meta: dict, path: Path) -> None:
    inputs, names = example_inputs(meta), input_names(meta)
    axes = {name: {0: "batch"} for name in (*names, OUTPUT)}
    if INPUT_MULTI_HOT in axes:
        axes[INPUT_MULTI_HOT] = {0: "batch", 2: "bag_length"}
    # the TorchScript-based exporter: it handles this graph without the extra onnxscript dependency; torch
    # 2.13 marks it deprecated, which says nothing about this export
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(
            wrapper,
            inputs,
            str(path),
            input_names=names,
            output_names=[OUTPUT],
            dynamic_axes=axes,
            opset_version=ONNX_OPSET,
            dynamo=False,
        )


def quantize_onnx_int8(source: Path, path: Path) -> None:
    """``source`` with int8 weights and per-batch int8 activations in its linear layers (onnxruntime's
    dynamic quantization: uint8 x int8 products, the VNNI instructions' kind); embeddings, the
    interaction and the output stay float32."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(
        str(source),
        str(path),
        weight_type=QuantType.QInt8,
        op_types_to_quantize=["MatMul", "Gemm"],
        extra_options={"MatMulConstBOnly": True},  # weights only: the interaction's Gram matrix stays float
    )


def export_torchscript(wrapper: InferenceModel, meta: dict, path: Path) -> None:
    with torch.no_grad():
        traced = torch.jit.trace(wrapper, example_inputs(meta), check_trace=False)
    traced.save(str(path))


def triton_config(name: str, platform: str, meta: dict, max_batch_size: int = 65536) -> str:
    """config.pbtxt for Triton: dynamic batching, inputs named after the FeatureSpec channels (a
    multi-hot input's last dimension, the padded bag length, is variable)."""
    dims = {INPUT_NUMERICAL: f"{meta['num_numerical']}", INPUT_CATEGORICAL: f"{len(meta['cardinalities'])}"}
    if meta.get("multihot_cardinalities"):
        dims[INPUT_MULTI_HOT] = f"{len(meta['multihot_cardinalities'])}, -1"
    inputs = ",\n".join(
        f'  {{ name: "{n}" data_type: TYPE_{meta["inputs"][n]} dims: [ {d} ] }}' for n, d in dims.items()
    )
    return (
        f'name: "{name}"\n'
        f'platform: "{platform}"\n'
        f"max_batch_size: {max_batch_size}\n"
        f"input [\n{inputs}\n]\n"
        "output [\n"
        f'  {{ name: "{OUTPUT}" data_type: TYPE_FP32 dims: [ 1 ] }}\n'
        "]\n"
        "dynamic_batching { max_queue_delay_microseconds: 500 }\n"
        "instance_group [ { kind: KIND_AUTO } ]\n"
    )


def check_onnx(wrapper: InferenceModel, meta: dict, path: Path, batch: int = 256) -> float:
    """Max |onnxruntime - PyTorch| over a random batch (out-of-range ids included)."""
    import onnxruntime as ort

    inputs = example_inputs(meta, batch, seed=1)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = session.run([OUTPUT], {name: x.numpy() for name, x in zip(input_names(meta), inputs)})[0]
    with torch.no_grad():
        want = wrapper(*inputs).numpy()
    return float(np.abs(got - want).max())


def export_checkpoint(
    checkpoint: str | os.PathLike,
    out_dir: str | os.PathLike,
    fmt: str,
    name: str | None = None,
    backend: str = "onnx",
    overwrite: bool = False,
    quantize: str = "none",
) -> dict:
    """Writes ``fmt`` (onnx, torchscript, triton) for a checkpoint into ``out_dir``.

    ``out_dir`` gets ``model.onnx`` or ``model.pt`` plus ``ctrkit_model.json`` (the metadata a server
    needs); ``triton`` writes ``out_dir/<name>/config.pbtxt`` and ``out_dir/<name>/1/model.<ext>`` with
    ``backend`` (onnx or torchscript) as the model file, and the metadata beside the config.

    Returns:
        A summary: files written and, for ONNX, the max abs difference against PyTorch.
    """
    from ctrkit.train.checkpoint import load_checkpoint, model_from_checkpoint

    if fmt not in FORMATS:
        raise ValueError(f"--format must be one of {', '.join(FORMATS)}, got '{fmt}'")
    if backend not in ("onnx", "torchscript"):
        raise ValueError(f"--backend must be onnx or torchscript, got '{backend}'")
    if quantize not in QUANTIZATIONS:
        raise ValueError(f"--quantize must be one of {', '.join(QUANTIZATIONS)}, got '{quantize}'")
    kind = backend if fmt == "triton" else fmt
    if quantize != "none" and kind != "onnx":
        raise ValueError(f"--quantize {quantize} applies to ONNX models; this export writes {kind}")
    ckpt = load_checkpoint(checkpoint)
    meta = model_metadata(ckpt)
    if fmt == "triton" and meta["num_numerical"] == 0:
        raise ValueError(
            "--format triton: this model has no numerical features, and Triton refuses a zero-width input "
            "(config dims must be >= 1); export --format onnx or torchscript and serve it with `ctrkit serve`"
        )
    wrapper = InferenceModel(
        model_from_checkpoint(ckpt).cpu(), meta["cardinalities"], meta["multihot_cardinalities"]
    ).eval()
    name = name or meta["model_name"]
    summary: dict = {"format": fmt, "name": name, "quantize": quantize}
    with atomic_directory(out_dir, overwrite) as tmp:
        target = tmp / name / "1" if fmt == "triton" else tmp
        target.mkdir(parents=True, exist_ok=True)
        model_file = target / ("model.onnx" if kind == "onnx" else "model.pt")
        if kind == "onnx":
            float_file = target / "model.fp32.onnx" if quantize == "int8" else model_file
            export_onnx(wrapper, meta, float_file)
            if quantize == "int8":
                quantize_onnx_int8(float_file, model_file)
                float_file.unlink()
            summary["max_abs_diff_vs_pytorch"] = check_onnx(wrapper, meta, model_file)
        else:
            export_torchscript(wrapper, meta, model_file)
        meta_dir = tmp / name if fmt == "triton" else tmp
        (meta_dir / "ctrkit_model.json").write_text(
            json.dumps({**meta, "file": model_file.name, "quantize": quantize}, indent=2) + "\n"
        )
        if fmt == "triton":
            platform = "onnxruntime_onnx" if kind == "onnx" else "pytorch_libtorch"
            (tmp / name / "config.pbtxt").write_text(triton_config(name, platform, meta))
        summary["files"] = sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*") if p.is_file())
    return summary


def find_model_dir(model_dir: str | os.PathLike) -> Path:
    """The directory holding ``ctrkit_model.json`` in an export (itself, or the one model of a Triton repo)."""
    root = Path(model_dir)
    if (root / "ctrkit_model.json").exists():
        return root
    found = sorted(p.parent for p in root.glob("*/ctrkit_model.json"))
    if len(found) != 1:
        raise ValueError(
            f"{root}: expected an export written by `ctrkit export` (ctrkit_model.json here or in one model "
            f"directory), found {len(found)}"
        )
    return found[0]
