"""The KServe v2 inference protocol as Triton speaks it: JSON tensors and the binary-tensor extension.

Only parsing and encoding live here (no I/O), so every malformed request becomes a ``RequestError``
naming the input and what was expected, which the server turns into a 400.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np

from ctrkit.models.signature import CATEGORICAL, MULTI_HOT, NUMERICAL, OUTPUT, Signature, TensorSpec

HEADER_LENGTH = "inference-header-content-length"
DTYPES = {"FP32": np.float32, "FP64": np.float64, "INT64": np.int64, "INT32": np.int32}


class RequestError(ValueError):
    """A request the server cannot serve; the message says which part and what was expected."""


@dataclass(frozen=True)
class InferRequest:
    """A parsed request: its id, the inputs, and whether the output goes back as binary."""

    id: str | None
    numerical: np.ndarray  # (B, N) float32
    categorical: np.ndarray  # (B, F) int64
    binary_output: bool
    multi_hot: np.ndarray | None = None  # (B, Fm, L) int64, -1 padding; models with multi-hot features only


def _expected(name: str, expect: dict[str, TensorSpec]) -> str:
    dims = ", ".join("L" if d is None else str(d) for d in expect[name].dims)
    return f"input '{name}' must be {expect[name].datatype} with shape [B, {dims}]"


def _shape_fits(shape, dims: tuple) -> bool:
    """``shape`` is a list of non-negative ints [B, *dims], a None in ``dims`` matching any length >= 1."""
    return (
        isinstance(shape, list)
        and len(shape) == 1 + len(dims)
        and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)
        and all(got == want if want is not None else got >= 1 for got, want in zip(shape[1:], dims))
    )


def _json_values(name: str, data, dtype: np.dtype, count: int) -> np.ndarray:
    """The JSON ``data`` of an input as ``dtype``, refusing what the protocol does not allow: strings,
    booleans, nulls, ragged nesting, and non-integral numbers for an integer datatype."""
    what = "integers" if dtype.kind == "i" else "numbers"
    try:
        raw = np.asarray(data)
    except (TypeError, ValueError, RecursionError):
        raw = None
    kinds = {"U": "strings", "S": "strings", "b": "booleans", "f": "non-integral numbers", "O": "nulls or mixed values"}
    if raw is None or raw.dtype.kind not in ("i", "u", "f") or (dtype.kind == "i" and raw.dtype.kind == "f"):
        got = "ragged or non-numeric nesting" if raw is None else kinds.get(raw.dtype.kind, str(raw.dtype))
        raise RequestError(f"input '{name}': 'data' must hold {count} {what}, got {got}")
    try:
        return raw.astype(dtype, casting="safe" if dtype.kind == "i" else "unsafe")
    except TypeError:  # uint64 beyond int64
        raise RequestError(f"input '{name}': 'data' holds integers beyond {dtype.name}") from None


def parse_request(body: bytes, header_length: str | None, signature: Signature) -> InferRequest:
    """Parses a v2 infer request body (JSON, or JSON header + binary tensors) for a model's signature."""
    expect = {t.name: t for t in signature.inputs}
    if header_length is not None:
        try:
            n = int(header_length)
        except ValueError:
            raise RequestError(f"Inference-Header-Content-Length must be an integer, got '{header_length}'") from None
        if not 0 < n <= len(body):
            raise RequestError(f"Inference-Header-Content-Length {n} does not fit a body of {len(body)} bytes")
        header, binary = body[:n], memoryview(body)[n:]
    else:
        header, binary = body, memoryview(b"")
    try:
        doc = json.loads(header)
    except (ValueError, UnicodeDecodeError) as e:
        raise RequestError(f"the request is not valid JSON: {e}") from None
    except RecursionError:
        raise RequestError("the request's JSON is nested too deeply") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("inputs"), list):
        raise RequestError("the request must be a JSON object with an 'inputs' list")
    arrays: dict[str, np.ndarray] = {}
    seen: set[str] = set()
    offset = 0
    for i, item in enumerate(doc["inputs"]):
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise RequestError(f"inputs[{i}] must be an object with a 'name'")
        name = item["name"]
        if name in arrays or name in seen:
            raise RequestError(f"input '{name}' is given more than once")
        seen.add(name)
        if name not in expect:
            raise RequestError(f"unknown input '{name}'; this model takes {', '.join(expect)}")
        datatype, shape = item.get("datatype"), item.get("shape")
        if datatype not in DTYPES:
            raise RequestError(f"{_expected(name, expect)}; datatype '{datatype}' is not one of {', '.join(DTYPES)}")
        if datatype != expect[name].datatype:
            raise RequestError(f"{_expected(name, expect)}, got datatype {datatype}")
        if not _shape_fits(shape, expect[name].dims):
            raise RequestError(f"{_expected(name, expect)}, got shape {shape}")
        dtype = np.dtype(DTYPES[datatype])
        count = math.prod(shape)  # exact: numpy's int64 product wraps for absurd shapes
        size = (item.get("parameters") or {}).get("binary_data_size")
        if size is not None:
            if not isinstance(size, int) or size != count * dtype.itemsize:
                raise RequestError(f"input '{name}': binary_data_size {size}, expected {count * dtype.itemsize} bytes")
            if offset + size > len(binary):
                raise RequestError(f"input '{name}': the body holds {len(binary) - offset} of its {size} binary bytes")
            arrays[name] = np.frombuffer(binary[offset : offset + size], dtype=dtype).reshape(shape)
            offset += size
        else:
            values = _json_values(name, item.get("data"), dtype, count)
            if values.size != count:
                raise RequestError(f"input '{name}': 'data' holds {values.size} values, shape {shape} needs {count}")
            arrays[name] = values.reshape(shape)
    missing = [n for n in expect if n not in arrays]
    if missing:
        raise RequestError(f"missing input(s) {', '.join(missing)}; " + "; ".join(_expected(n, expect) for n in expect))
    if offset != len(binary):
        raise RequestError(f"{len(binary) - offset} binary bytes after the last input")
    if len({a.shape[0] for a in arrays.values()}) > 1:
        sizes = ", ".join(f"{n} {a.shape[0]}" for n, a in arrays.items())
        raise RequestError(f"inputs disagree on the batch size: {sizes}")
    if arrays[NUMERICAL].shape[0] == 0:
        raise RequestError("the batch is empty")
    if not np.isfinite(arrays[NUMERICAL]).all():
        raise RequestError(f"input '{NUMERICAL}' holds NaN or infinite values")
    params = doc.get("parameters") or {}
    outputs = doc.get("outputs") or []
    binary_output = bool(params.get("binary_data_output", False)) or any(
        isinstance(o, dict) and (o.get("parameters") or {}).get("binary_data", False) for o in outputs
    )
    request_id = doc.get("id")
    return InferRequest(
        str(request_id) if request_id is not None else None,
        np.asarray(arrays[NUMERICAL], np.float32),
        np.asarray(arrays[CATEGORICAL], np.int64),
        binary_output,
        np.asarray(arrays[MULTI_HOT], np.int64) if MULTI_HOT in arrays else None,
    )


def encode_response(model_name: str, request: InferRequest, probability: np.ndarray) -> tuple[bytes, dict[str, str]]:
    """The v2 response body and its headers (binary output when the request asked for it)."""
    spec = OUTPUT
    out: dict = {"name": spec.name, "datatype": spec.datatype, "shape": list(probability.shape)}
    doc: dict = {"model_name": model_name, "model_version": "1", "outputs": [out]}
    if request.id is not None:
        doc["id"] = request.id
    if request.binary_output:
        raw = np.ascontiguousarray(probability, np.float32).tobytes()
        out["parameters"] = {"binary_data_size": len(raw)}
        header = json.dumps(doc).encode()
        return header + raw, {HEADER_LENGTH: str(len(header)), "content-type": "application/octet-stream"}
    out["data"] = probability.reshape(-1).tolist()
    return json.dumps(doc).encode(), {"content-type": "application/json"}
