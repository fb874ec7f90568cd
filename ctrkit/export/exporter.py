"""Exports a trained model for serving: ONNX, TorchScript, or a Triton model repository.

Every artifact takes and returns the tensors of the model's serving signature (``models/signature.py``).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from ctrkit.checkpoint import load_checkpoint
from ctrkit.config import EXPORT_FORMATS as FORMATS
from ctrkit.config import QUANTIZATIONS
from ctrkit.data.atomic import (
    atomic_directory,
    check_target_name,
    disk_error,
    remove_stale_temporaries,
    temporary_prefix,
)
from ctrkit.integrity import seal_files
from ctrkit.models.dynamic import DYNAMIC_FILE, frozen_arrays
from ctrkit.models.signature import MULTI_HOT, PROBABILITY, InferenceModel, Signature
from ctrkit.preprocess.transform import RECORD_FILE
from ctrkit.serve.names import MAX_VERSION, check_name, inside, version_dirs

ONNX_OPSET = 18
PYTHON_BACKEND = "python"  # a Triton export whose model is triton_python_model.py: raw values in, as Merlin serves
TRITON_PYTHON_MODEL = Path(__file__).with_name("triton_python_model.py")  # copied, never imported here


def export_onnx(wrapper: InferenceModel, signature: Signature, path: Path) -> None:
    inputs, names = signature.example_inputs(), signature.input_names
    axes = {name: {0: "batch"} for name in (*names, PROBABILITY)}
    if MULTI_HOT in axes:
        axes[MULTI_HOT] = {0: "batch", 2: "bag_length"}
    # the TorchScript-based exporter: it handles this graph without the extra onnxscript dependency; torch
    # 2.13 marks it deprecated, which says nothing about this export
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(
            wrapper,
            inputs,
            str(path),
            input_names=names,
            output_names=[PROBABILITY],
            dynamic_axes=axes,
            opset_version=ONNX_OPSET,
            dynamo=False,
        )


def quantize_onnx_int8(source: Path, path: Path) -> None:
    """``source`` with int8 weights and per-batch int8 activations in its linear layers (onnxruntime's
    dynamic quantization: uint8 x int8 products, the VNNI instructions' kind); embeddings, the
    interaction and the output stay float32."""
    from onnxruntime.quantization import QuantType, quant_pre_process, quantize_dynamic

    # shape inference and graph optimization first, as onnxruntime asks of a model to quantize (it warns otherwise)
    prepared = source.with_name(source.stem + ".prepared.onnx")
    quant_pre_process(str(source), str(prepared))
    quantize_dynamic(
        str(prepared),
        str(path),
        weight_type=QuantType.QInt8,
        op_types_to_quantize=["MatMul", "Gemm"],
        extra_options={"MatMulConstBOnly": True},  # weights only: the interaction's Gram matrix stays float
    )
    prepared.unlink()


def export_torchscript(wrapper: InferenceModel, signature: Signature, path: Path) -> None:
    with torch.no_grad():
        traced = torch.jit.trace(wrapper, signature.example_inputs(), check_trace=False)
    traced.save(str(path))


def triton_config(name: str, platform: str, signature: Signature, max_batch_size: int = 65536) -> str:
    """config.pbtxt for Triton: dynamic batching, the signature's inputs (a multi-hot input's last
    dimension, the padded bag length, is variable). ``platform`` "python" is the Python-backend model
    (``triton_python_model.py``): its inputs are the raw columns and the id inputs, each optional (a request sends
    one set or the other), its parameter ``missing_columns`` says what a raw column left out means
    (``RowTransform.check_columns``: "error", as ``predict`` and ``ctrkit serve`` by default; edit it to "missing"),
    and ``bad_values`` what a raw value preprocessing refuses means (``values.BadValues``: "error", or "missing")."""
    python = platform == PYTHON_BACKEND
    optional = " optional: true" if python else ""

    def tensor(t, extra: str = "") -> str:
        dims = ", ".join(str(d) for d in t.shape()[1:])
        kind = "STRING" if t.datatype == "BYTES" else t.datatype
        return f'  {{ name: "{t.name}" data_type: TYPE_{kind} dims: [ {dims} ]{extra} }}'

    inputs = (signature.raw_inputs if python else ()) + signature.inputs
    where = 'backend: "python"' if python else f'platform: "{platform}"'
    rule = ('parameters { key: "missing_columns" value: { string_value: "error" } }\n'
            'parameters { key: "bad_values" value: { string_value: "error" } }\n') if python else ""  # fmt: skip
    note = ("# inputs are optional: a request sends the raw columns or the id inputs; a raw column left out is\n"
            '# refused unless missing_columns is "missing", a value preprocessing refuses unless bad_values is\n'
            '# "missing"\n'
            ) if python else ""  # fmt: skip
    return (
        note + f'name: "{name}"\n'
        f"{where}\n"
        f"max_batch_size: {max_batch_size}\n"
        "input [\n" + ",\n".join(tensor(t, optional) for t in inputs) + "\n]\n"
        "output [\n" + tensor(signature.output) + "\n]\n"
        "dynamic_batching { max_queue_delay_microseconds: 500 }\n"
        f"{rule}"
        f"instance_group [ {{ kind: {'KIND_CPU' if python else 'KIND_AUTO'} }} ]\n"
    )


def check_onnx(wrapper: InferenceModel, signature: Signature, path: Path, batch: int = 256) -> float:
    """Max |onnxruntime - PyTorch| over a random batch (out-of-range ids included)."""
    import onnxruntime as ort

    inputs = signature.example_inputs(batch, seed=1)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = session.run([PROBABILITY], {name: x.numpy() for name, x in zip(signature.input_names, inputs)})[0]
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
    version: int | None = None,
) -> dict:
    """Writes ``fmt`` (onnx, torchscript, triton) for a checkpoint into ``out_dir``.

    ``out_dir`` gets ``model.onnx`` or ``model.pt`` plus ``ctrkit_model.json`` (the metadata a server
    needs). ``triton`` treats ``out_dir`` as a model repository, new or existing: it writes version
    ``version`` (default: one after the model's newest, 1 for a new model) of model ``name`` as
    ``out_dir/<name>/<version>/model.<ext>`` with its own ``ctrkit_model.json``, and the model's
    ``config.pbtxt`` and ``ctrkit_model.json`` with its first version. A model with dynamic features (raw ids)
    takes rows in its graph; ``dynamic_ids.npz`` beside the model file holds its id -> row maps, which
    ``ctrkit serve`` applies to requests first (``models/dynamic.FrozenIds``). Other models and versions are left
    untouched; an existing version is replaced only with ``overwrite``, and a model whose config differs
    from this export's (another platform or other inputs) is refused.

    Returns:
        A summary: files written (relative to ``out_dir``), the Triton version, and for ONNX the max abs
        difference against PyTorch.
    """
    # one job: one export: the flags checked, the checkpoint's model and signature, its files written and sealed
    # (ONNX compared with PyTorch) and placed whole; the steps share the model, the signature and the paths
    if fmt not in FORMATS:
        raise ValueError(f"export format must be one of {', '.join(FORMATS)}, got '{fmt}'")
    if backend not in ("onnx", "torchscript", PYTHON_BACKEND):
        raise ValueError(f"Triton backend must be onnx, torchscript or python, got '{backend}'")
    if quantize not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {', '.join(QUANTIZATIONS)}, got '{quantize}'")
    if version is not None and (fmt != "triton" or not 1 <= version <= MAX_VERSION):
        raise ValueError(
            f"`version` applies to triton exports and must be from 1 to {MAX_VERSION} (an int64), got {version} "
            f"for {fmt}"
        )
    kind = (backend if backend != PYTHON_BACKEND else "onnx") if fmt == "triton" else fmt
    if quantize != "none" and kind != "onnx":
        raise ValueError(f"quantization {quantize} applies to ONNX models; this export writes {kind}")
    if name is not None:
        check_name(name, "`name`")
    ckpt = load_checkpoint(checkpoint)
    signature = Signature.from_config(ckpt.model_config)
    if fmt == "triton" and signature.num_numerical == 0:
        raise ValueError(
            "Triton export: this model has no numerical features, and Triton refuses a zero-width input "
            "(config dims must be >= 1); export it as onnx or torchscript and serve it with `ctrkit serve`"
        )
    name = ckpt.model_name if name is None else name
    transform = ckpt.row_transform()
    if transform is not None:
        signature = signature.with_raw_inputs(transform.input_specs())
    if backend == PYTHON_BACKEND and fmt == "triton" and transform is None:
        raise ValueError(
            "`backend` python serves raw values, and this checkpoint carries no preprocessing (its dataset was not "
            "made by `ctrkit preprocess table` or `preprocess criteo`): export it with the onnx backend"
        )
    platform = "onnxruntime_onnx" if kind == "onnx" else "pytorch_libtorch"
    if fmt == "triton" and backend == PYTHON_BACKEND:
        platform = PYTHON_BACKEND
    config = triton_config(name, platform, signature) if fmt == "triton" else None
    out = Path(out_dir)
    if config:
        inside(out, out / name)  # a model directory linked to elsewhere is not written through
        _triton_version_dir(out / name, config, version, overwrite)  # refused now rather than after the work
    wrapper = InferenceModel(ckpt.build_model().cpu(), signature, ckpt.calibration).eval()
    dynamic = wrapper.dynamic  # raw ids: the graph takes rows; the server translates with the exported maps
    wrapper.dynamic = None
    meta = {**signature.metadata(ckpt.model_name, ckpt.step), "quantize": quantize}
    if transform is not None:  # the raw inputs, by name, and the files that turn them into the model's inputs
        meta["features"] = transform.input_specs()
        meta["preprocessing"] = RECORD_FILE
    if dynamic is not None:
        meta["dynamic_ids"] = DYNAMIC_FILE
    summary: dict = {"format": fmt, "name": name, "quantize": quantize}

    def write(where: Path) -> None:
        """The export's files in ``where``, sealed with their digests."""
        model_file = where / _model_file(kind)
        if kind == "onnx":
            float_file = where / "model.fp32.onnx" if quantize == "int8" else model_file
            export_onnx(wrapper, signature, float_file)
            if quantize == "int8":
                quantize_onnx_int8(float_file, model_file)
                float_file.unlink()
            summary["max_abs_diff_vs_pytorch"] = check_onnx(wrapper, signature, model_file)
        else:
            export_torchscript(wrapper, signature, model_file)
        if dynamic is not None:
            # (numpy's stub types any keyword of savez as its allow_pickle)
            np.savez(where / DYNAMIC_FILE, **cast(dict[str, Any], frozen_arrays(dynamic)))
        if transform is not None:
            transform.write(where)
        if platform == PYTHON_BACKEND:
            shutil.copyfile(TRITON_PYTHON_MODEL, where / "model.py")
        (where / "ctrkit_model.json").write_text(json.dumps({**meta, "file": model_file.name}, indent=2) + "\n")
        seal_files(where)

    if not config:
        with atomic_directory(out, overwrite) as tmp:
            write(tmp)
            written = sorted(p.relative_to(tmp) for p in tmp.rglob("*") if p.is_file())
        summary["files"] = [str(p) for p in written]
        return summary
    with staging_directory(out, name) as staged:
        write(staged)
        written = sorted(p.relative_to(staged) for p in staged.rglob("*") if p.is_file())
        number, new_model = _place_version(out, name, staged, config, version, overwrite)
    model_files = ["config.pbtxt", "ctrkit_model.json"] if new_model else []
    summary["files"] = [f"{name}/{f}" for f in model_files] + [f"{name}/{number}/{p}" for p in written]
    summary["version"] = number
    return summary


def _model_file(kind: str) -> str:
    return "model.onnx" if kind == "onnx" else "model.pt"


def _temporary(out: Path, name: str) -> Path:
    """A new empty directory in repository ``out``, named as a temporary of model ``name`` (a later export removes it
    if this process dies)."""
    check_target_name(out / name)
    return Path(tempfile.mkdtemp(dir=out, prefix=temporary_prefix(out / name)))


@contextmanager
def staging_directory(out: Path, name: str) -> Iterator[Path]:
    """A temporary directory in the repository ``out`` where a version of model ``name`` is written before it is
    placed; removed afterwards whatever happens (a killed export's is removed by the next export of ``name``). A
    full, read-only or forbidden disk is a ``DiskError`` naming the model directory."""
    target = out / name
    tmp = None
    try:
        out.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(target)
        tmp = _temporary(out, name)
        yield tmp
    except BaseException as e:
        problem = disk_error(e, target, 0, None)
        if problem is not None:
            raise problem from None
        raise
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


@contextmanager
def repository_lock(out: Path) -> Iterator[None]:
    """Holds an flock on the repository directory ``out`` itself (no lock file; the kernel releases it when its
    holder dies) while one export places its version: versions are chosen and created one export at a time."""
    import fcntl

    fd = os.open(out, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _place_version(
    out: Path, name: str, staged: Path, config: str, version: int | None, overwrite: bool
) -> tuple[int, bool]:
    """Moves the version written in ``staged`` into model ``name`` of repository ``out``, under the repository's lock:
    its number chosen then (``version``, or one after the newest), a new model created whole (config, metadata,
    the version) by one rename that fails rather than replace a directory made meanwhile. Returns the number and
    whether the model is new."""
    model_dir = out / name
    os.chmod(staged, 0o755)  # mkdtemp creates 0700
    with repository_lock(out):
        inside(out, model_dir)
        target = _triton_version_dir(model_dir, config, version, overwrite)
        number = int(target.name)
        if model_dir.exists():
            if target.exists():  # replaced (overwrite): the old version set aside, then removed
                old = _temporary(out, name)
                os.replace(target, old / "old")
                os.replace(staged, target)
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.replace(staged, target)
            return number, False
        model = _temporary(out, name)
        try:
            os.chmod(model, 0o755)
            os.replace(staged, model / str(number))
            shutil.copyfile(model / str(number) / "ctrkit_model.json", model / "ctrkit_model.json")
            (model / "config.pbtxt").write_text(config)
            try:
                os.replace(model, model_dir)
            except OSError as e:
                raise ValueError(
                    f"{model_dir}: appeared while this export ran, not by a ctrkit export; left as it is and this "
                    f"export discarded ({e.strerror})"
                ) from None
        finally:
            shutil.rmtree(model, ignore_errors=True)
        return number, True


def _triton_version_dir(model_dir: Path, config: str, version: int | None, overwrite: bool) -> Path:
    """The version directory a Triton export writes in ``model_dir`` (a model of a repository, new or
    existing), after checking that the export fits the model's existing config."""
    existing: list[int] = []
    if model_dir.exists():
        config_file = model_dir / "config.pbtxt"
        if not config_file.is_file():
            raise ValueError(f"{model_dir}: exists but holds no config.pbtxt; expected a model of a Triton repository")
        inside(model_dir.parent, config_file)  # a config linked to elsewhere is neither read nor trusted
        if config_file.read_text().rstrip("\n") != config.rstrip("\n"):
            raise ValueError(
                f"{config_file}: this model's versions take other inputs or another platform than "
                f"this export (a model's versions share one config); export it under another --name"
            )
        existing = list(version_dirs(model_dir))
    number = version or (existing[-1] + 1 if existing else 1)
    if number > MAX_VERSION:
        raise ValueError(
            f"{model_dir}: version {number} is beyond Triton's largest ({MAX_VERSION}, an int64)"
            + ("; the newest version's number leaves no next one: give --version" if version is None else "")
        )
    target = model_dir / str(number)
    if target.exists() and not overwrite:
        raise ValueError(
            f"{target}: version {number} of model '{model_dir.name}' exists; set `overwrite` to replace it, or "
            f"leave `version` unset to write the next one ({existing[-1] + 1})"
        )
    return target
