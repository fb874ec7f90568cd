"""The KServe v2 inference protocol as Triton speaks it: JSON tensors and the binary-tensor extension.

Only parsing and encoding live here (no I/O), so every malformed request becomes a ``RequestError``
naming the input and what was expected, which the server turns into a 400.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from itertools import chain
from typing import TypeGuard

import numpy as np

from ctrkit.models.signature import (
    CATEGORICAL,
    MULTI_HOT,
    NUMERICAL,
    OUTPUT,
    Signature,
    TensorSpec,
    finite_numerical,
)

HEADER_LENGTH = "inference-header-content-length"
# KServe v2 tensor datatypes (the protocol's names) -> NumPy's; a raw input is read in any of them and BYTES, then held
# to the datatype the model declares for it (as Triton holds a request to its config)
TENSOR_DATATYPES = {"FP32": np.float32, "FP64": np.float64, "INT64": np.int64, "INT32": np.int32}
RAW_TENSOR_DATATYPES = (*TENSOR_DATATYPES, "BYTES")


class RequestError(ValueError):
    """A request the server cannot serve; the message says which part and what was expected."""


@dataclass(frozen=True)
class InferRequest:
    """A parsed request: its id, the inputs, and whether the output goes back as binary."""

    id: str | None
    numerical: np.ndarray | None  # (B, N) float32; None for a request of raw values
    categorical: np.ndarray | None  # (B, F) int64; None for a request of raw values
    binary_output: bool
    multi_hot: np.ndarray | None = None  # (B, Fm, L) int64, -1 padding; models with multi-hot features only
    raw: dict[str, list | np.ndarray] | None = None  # column -> B raw values (None for missing ones)
    rows: int = 0  # B
    bad_values_missing: int = 0  # raw values scored as missing (``--bad-values missing``), said in the response

    def with_inputs(self, numerical: np.ndarray, categorical: np.ndarray, multi_hot: np.ndarray | None,
                    bad_values_missing: int = 0) -> InferRequest:  # fmt: skip
        """This request with the model's inputs made from its raw values (``bad_values_missing`` of them scored as
        missing)."""
        return replace(self, numerical=numerical, categorical=categorical, multi_hot=multi_hot, raw=None,
                       bad_values_missing=bad_values_missing)  # fmt: skip


def _expected(name: str, expect: dict[str, TensorSpec]) -> str:
    dims = ", ".join("L" if d is None else str(d) for d in expect[name].dims)
    return f"input '{name}' must be {expect[name].datatype} with shape [B, {dims}]"


def _shape_fits(shape: object, dims: tuple) -> TypeGuard[list[int]]:
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
    if raw is not None and raw.dtype.kind in ("i", "u", "f") and _holds_bool(data):  # NumPy reads true as 1
        raise RequestError(f"input '{name}': 'data' must hold {count} {what}, got booleans")
    if raw is None or raw.dtype.kind not in ("i", "u", "f") or (dtype.kind == "i" and raw.dtype.kind == "f"):
        got = "ragged or non-numeric nesting" if raw is None else kinds.get(raw.dtype.kind, str(raw.dtype))
        raise RequestError(f"input '{name}': 'data' must hold {count} {what}, got {got}")
    try:
        return raw.astype(dtype, casting="safe" if dtype.kind == "i" else "unsafe")
    except TypeError:  # uint64 beyond int64
        raise RequestError(f"input '{name}': 'data' holds integers beyond {dtype.name}") from None


def _holds_bool(data) -> bool:
    """Whether nested JSON lists ``data`` hold a boolean anywhere: a level of nesting at a time, each looked at with
    ``map`` and flattened with ``chain`` (a Python loop over every value cost three times ``json.loads``)."""
    level = [data]
    while True:
        kinds = set(map(type, level))
        if bool in kinds:
            return True
        if list not in kinds:
            return False
        level = list(chain.from_iterable(x for x in level if type(x) is list))


def _check_object(value, what: str) -> dict:
    """``value`` when it is a JSON object (None: an empty one), else a RequestError naming ``what``."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise RequestError(f"{what} must be a JSON object, got {json.dumps(value)[:40]}")
    return value


def _raw_values(name: str, item: dict, binary: memoryview, offset: int) -> tuple[list | np.ndarray, int, int]:
    """One raw input's values (B of them, shape [B] or [B, 1]), the batch size and the binary bytes it took:
    BYTES as text (a binary BYTES tensor holds each element as a 4-byte little-endian length and its bytes),
    numbers as an array; JSON null is a missing value."""
    datatype, shape = item.get("datatype"), item.get("shape")
    if not isinstance(datatype, str) or datatype not in RAW_TENSOR_DATATYPES:
        raise RequestError(f"input '{name}': datatype '{datatype}' is not one of {', '.join(RAW_TENSOR_DATATYPES)}")
    if not (_shape_fits(shape, ()) or _shape_fits(shape, (1,))):
        raise RequestError(f"input '{name}' (a raw column) must have shape [B] or [B, 1], got {shape}")
    count = shape[0]
    size = _check_object(item.get("parameters"), f"input '{name}': 'parameters'").get("binary_data_size")
    if size is not None:
        if not isinstance(size, int) or isinstance(size, bool) or size < 0 or offset + size > len(binary):
            raise RequestError(f"input '{name}': binary_data_size {size!r} does not fit the body's binary bytes")
        chunk = binary[offset : offset + size]
        if datatype != "BYTES":
            dtype = np.dtype(TENSOR_DATATYPES[datatype])
            if size != count * dtype.itemsize:
                raise RequestError(f"input '{name}': binary_data_size {size}, expected {count * dtype.itemsize} bytes")
            return np.frombuffer(chunk, dtype=dtype), count, size
        values, at = [], 0
        while at < size:
            if at + 4 > size:
                raise RequestError(f"input '{name}': a BYTES element's length is cut off")
            n = int.from_bytes(chunk[at : at + 4], "little")
            if at + 4 + n > size:
                raise RequestError(f"input '{name}': a BYTES element of {n} bytes runs past the input")
            values.append(bytes(chunk[at + 4 : at + 4 + n]))
            at += 4 + n
        if len(values) != count:
            raise RequestError(f"input '{name}': holds {len(values)} BYTES elements, shape {shape} needs {count}")
        return values, count, size
    data = item.get("data")
    if not isinstance(data, list):
        raise RequestError(f"input '{name}': 'data' must be a list of {count} values")
    flat = [v[0] if isinstance(v, list) and len(v) == 1 else v for v in data]
    if len(flat) != count:
        raise RequestError(f"input '{name}': 'data' holds {len(flat)} values, shape {shape} needs {count}")
    for v in flat:
        if datatype == "BYTES" and not (v is None or isinstance(v, str)):
            raise RequestError(f"input '{name}': BYTES 'data' must hold strings (or null), got {json.dumps(v)[:40]}")
        if datatype != "BYTES" and (isinstance(v, bool) or not (v is None or isinstance(v, (int, float)))):
            raise RequestError(f"input '{name}': {datatype} 'data' must hold numbers (or null), got "
                               f"{json.dumps(v)[:40]}")  # fmt: skip
        if datatype != "BYTES" and isinstance(v, int) and not -(2**63) <= v < 2**63:  # (read as missing before)
            raise RequestError(f"input '{name}': {str(v)[:20]}... ({len(str(v))} digits) is beyond a 64-bit number")
    return flat, count, 0


def parse_request(body: bytes, header_length: str | None, signature: Signature) -> InferRequest:
    """Parses a v2 infer request body (JSON, or JSON header + binary tensors) for a model's signature: the id
    inputs, or (for a model that carries its preprocessing) raw values by column, in ``InferRequest.raw``."""
    # one job: one request body read in order (its header, then each input in the signature's order), every refusal
    # naming the input it found
    expect = {t.name: t for t in signature.inputs}
    raw_names = [t.name for t in signature.raw_inputs]
    raw_types = {t.name: t.datatype for t in signature.raw_inputs}
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
    _check_object(doc.get("parameters"), "'parameters'")
    outputs = doc.get("outputs")
    if outputs is not None and not (isinstance(outputs, list) and all(isinstance(o, dict) for o in outputs)):
        raise RequestError(f"'outputs' must be a list of objects, got {json.dumps(outputs)[:40]}")
    for i, o in enumerate(outputs or []):
        params = _check_object(o.get("parameters"), f"outputs[{i}]: 'parameters'")
        if o.get("name") != OUTPUT.name:  # (Triton: an unknown output is a 400, never left out in silence)
            raise RequestError(f"outputs[{i}]: unknown output {json.dumps(o.get('name'))[:40]}; the model's output is "
                               f"'{OUTPUT.name}'")  # fmt: skip
        if params.get("classification") or params.get("class_count"):
            raise RequestError(f"outputs[{i}]: class_count (the classification extension) is not served; the output is "
                               "each sample's click probability")  # fmt: skip
    arrays: dict[str, np.ndarray] = {}
    seen: set[str] = set()
    offset = 0
    items = doc["inputs"]
    names = [item.get("name") if isinstance(item, dict) and isinstance(item.get("name"), str) else None
             for item in items]  # fmt: skip
    if raw_names and items and not any(n in expect for n in names):  # raw values by column
        raw: dict[str, list | np.ndarray] = {}
        rows: set[int] = set()
        for i, (item, name) in enumerate(zip(items, names)):
            if not isinstance(name, str):
                raise RequestError(f"inputs[{i}] must be an object with a 'name'")
            if name in raw:
                raise RequestError(f"input '{name}' is given more than once")
            declared = raw_types.get(name)
            if declared is not None and item.get("datatype") != declared:  # Triton's rule: the config's datatype
                raise RequestError(f"input '{name}': datatype {item.get('datatype')}, the model declares {declared} "
                                   "(its metadata and Triton config; Triton refuses any other)")  # fmt: skip
            raw[name], count, used = _raw_values(name, item, binary, offset)
            offset += used
            rows.add(count)
        if offset != len(binary):
            raise RequestError(f"{len(binary) - offset} binary bytes after the last input")
        if len(rows) > 1:
            raise RequestError(f"inputs disagree on the batch size: {', '.join(map(str, sorted(rows)))}")
        if rows == {0}:
            raise RequestError("the batch is empty")
        return InferRequest(_request_id(doc), None, None, _binary_output(doc), raw=raw, rows=rows.pop())
    for i, item in enumerate(items):
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise RequestError(f"inputs[{i}] must be an object with a 'name'")
        name = item["name"]
        if name in arrays or name in seen:
            raise RequestError(f"input '{name}' is given more than once")
        seen.add(name)
        if name not in expect:
            raw_too = f" (or the raw columns {', '.join(raw_names)})" if raw_names else ""
            raise RequestError(f"unknown input '{name}'; this model takes {', '.join(expect)}{raw_too}")
        datatype, shape = item.get("datatype"), item.get("shape")
        if not isinstance(datatype, str) or datatype not in TENSOR_DATATYPES:
            raise RequestError(
                f"{_expected(name, expect)}; datatype '{datatype}' is not one of {', '.join(TENSOR_DATATYPES)}"
            )
        if datatype != expect[name].datatype:
            raise RequestError(f"{_expected(name, expect)}, got datatype {datatype}")
        if not _shape_fits(shape, expect[name].dims):
            raise RequestError(f"{_expected(name, expect)}, got shape {shape}")
        dtype = np.dtype(TENSOR_DATATYPES[datatype])
        count = math.prod(shape)  # exact: numpy's int64 product wraps for absurd shapes
        size = _check_object(item.get("parameters"), f"input '{name}': 'parameters'").get("binary_data_size")
        if size is not None:
            if not isinstance(size, int) or isinstance(size, bool) or size != count * dtype.itemsize:
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
    try:
        numerical = finite_numerical(arrays[NUMERICAL])
    except ValueError as e:
        raise RequestError(str(e)) from None
    return InferRequest(
        _request_id(doc),
        numerical,
        np.asarray(arrays[CATEGORICAL], np.int64),
        _binary_output(doc),
        np.asarray(arrays[MULTI_HOT], np.int64) if MULTI_HOT in arrays else None,
        rows=len(arrays[NUMERICAL]),
    )


def _request_id(doc: dict) -> str | None:
    request_id = doc.get("id")
    return str(request_id) if request_id is not None else None


def _binary_output(doc: dict) -> bool:
    params = doc.get("parameters") or {}
    outputs = doc.get("outputs") or []
    return bool(params.get("binary_data_output", False)) or any(
        isinstance(o, dict) and (o.get("parameters") or {}).get("binary_data", False) for o in outputs
    )


def encode_response(
    model_name: str, request: InferRequest, probability: np.ndarray, version: str = "1"
) -> tuple[bytes, dict[str, str]]:
    """The v2 response body and its headers (binary output when the request asked for it); ``version``: the model
    version that answered."""
    spec = OUTPUT
    out: dict = {"name": spec.name, "datatype": spec.datatype, "shape": list(probability.shape)}
    doc: dict = {"model_name": model_name, "model_version": str(version), "outputs": [out]}
    if request.id is not None:
        doc["id"] = request.id
    if request.bad_values_missing:  # the count of raw values scored as missing (``--bad-values missing``)
        doc["parameters"] = {"bad_values_missing": request.bad_values_missing}
    if request.binary_output:
        raw = np.ascontiguousarray(probability, np.float32).tobytes()
        out["parameters"] = {"binary_data_size": len(raw)}
        header = json.dumps(doc).encode()
        return header + raw, {HEADER_LENGTH: str(len(header)), "content-type": "application/octet-stream"}
    out["data"] = probability.reshape(-1).tolist()
    return json.dumps(doc).encode(), {"content-type": "application/json"}
