"""Digests of what ctrkit writes, checked when it is read back.

A checkpoint's (and each rank file's) contents are hashed with XXH3-64 in the order they are stored: each
tensor with its place in the file, dtype, shape and bytes, and each other value (a number, a text, a
calibration scale, a config field) with its place, type and exact text, so a flipped byte anywhere, a
truncated tensor or two tensors swapped give another digest. Files written before the values were covered
carry the algorithm ``xxh3_64`` (tensors only) and are still checked as they were written.

Exported model files are listed with their XXH3-64 in ``digests.json`` beside them (``seal_files``,
``check_files``). XXH3 reads memory about as fast as it can be read: verifying costs a few percent of ``torch.load``
(``docs/decisions/checkpoint-digest.md``). It guards against damage, not against someone who rewrites
the file and its digest together.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
import xxhash

FILES = "digests.json"  # an export directory's file digests, beside its files
FILE_ALGORITHM = "xxh3_64"  # of a file's bytes, in FILES
ALGORITHM = "xxh3_64+values"  # tensors and every other value
TENSORS_ONLY = "xxh3_64"  # what checkpoints written before the values were covered carry
KEY = "digest"  # where a file's digest is stored, beside the data it covers
CHUNK = 16 << 20  # bytes hashed as one piece (pieces of a large tensor are hashed in parallel)


def tensors(obj: Any, where: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor in ``obj`` (nested dicts, lists and tuples, in their order) with its place, such as
    ``/model/top_mlp.0.weight``; the top-level ``KEY`` entry of a mapping is left out (it holds the digest)."""
    if isinstance(obj, torch.Tensor):
        yield where, obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            if not (where == "" and k == KEY):
                yield from tensors(v, f"{where}/{k}")
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from tensors(v, f"{where}/{i}")


def tensor_bytes(obj: Any) -> int:
    """Bytes of tensor data in ``obj`` (what writing it takes, about)."""
    return sum(t.numel() * t.element_size() for _, t in tensors(obj) if not t.is_meta)


def values(obj: Any, where: str = "") -> Iterator[tuple[str, Any]]:
    """Every tensor and every other leaf value in ``obj`` with its place (as ``tensors``), and each container
    with its kind and length (so an emptied list or a dropped key changes what is hashed)."""
    if isinstance(obj, torch.Tensor):
        yield where, obj
    elif isinstance(obj, dict):
        yield where, ("map", len(obj) - (where == "" and KEY in obj))
        for k, v in obj.items():
            if not (where == "" and k == KEY):
                yield from values(v, f"{where}/{k}")
    elif isinstance(obj, (list, tuple)):
        yield where, ("list" if isinstance(obj, list) else "tuple", len(obj))
        for i, v in enumerate(obj):
            yield from values(v, f"{where}/{i}")
    else:
        yield where, obj


def tensor_digest(obj: Any, covers: str = ALGORITHM) -> str:
    """The digest of ``obj``: every tensor's place, dtype, shape and bytes, and (``covers`` ``ALGORITHM``) every
    other value's place, type and ``repr``. A tensor's bytes are hashed in ``CHUNK``-byte pieces, on
    ``torch.get_num_threads()`` threads (XXH3 releases the GIL), and the pieces' hashes go into the digest in
    order: the same digest whatever the thread count."""
    h = xxhash.xxh3_64()
    for where, x in values(obj) if covers == ALGORITHM else tensors(obj):
        if not isinstance(x, torch.Tensor):
            h.update(f"{where}={type(x).__name__}:{x!r}\0".encode("utf-8", "surrogatepass"))
            continue
        if x.is_meta:
            continue
        t = x.detach().cpu().contiguous().reshape(-1)
        if t.numel() and t.stride(-1) != 1:  # one value may carry any stride (a damaged file's): "contiguous"
            t = t.clone(memory_format=torch.contiguous_format)
        h.update(f"{where}:{t.dtype}:{tuple(x.shape)}\0".encode())
        if t.numel():
            data = t.view(torch.uint8).numpy().data  # (a memoryview of the bytes)
            pieces = [data[i : i + CHUNK] for i in range(0, len(data), CHUNK)]
            hashes = (
                _pool().map(xxhash.xxh3_64_intdigest, pieces)
                if len(pieces) > 1
                else map(xxhash.xxh3_64_intdigest, pieces)
            )
            for value in hashes:
                h.update(value.to_bytes(8, "little"))
    return h.hexdigest()


_pools: list[ThreadPoolExecutor] = []


def _pool() -> ThreadPoolExecutor:
    if not _pools:
        _pools.append(ThreadPoolExecutor(max(1, torch.get_num_threads()), thread_name_prefix="ctrkit-digest"))
    return _pools[0]


def sealed(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with its digest (tensors and values) under ``KEY``."""
    return {**data, KEY: {"algorithm": ALGORITHM, "value": tensor_digest(data)}}


def check(data: Any) -> str | None:
    """None when ``data`` carries no digest (a file written before digests existed) or its contents match it;
    else what is wrong."""
    if not isinstance(data, dict) or not isinstance(data.get(KEY), dict):
        return None
    recorded = data[KEY]
    algorithm = recorded.get("algorithm")
    if algorithm not in (ALGORITHM, TENSORS_ONLY):
        return f"its digest uses {algorithm!r}, which this ctrkit does not know"
    if tensor_digest(data, algorithm) != recorded.get("value"):
        return (
            "its data (tensors and values) does not match the digest recorded when it was written "
            "(damaged or changed since)"
        )
    return None


def vocabulary_fingerprint(vocabularies: Mapping[str, Any]) -> str:
    """A fingerprint of categorical vocabularies (column name -> a DataFrame of (value, ..., id), or an array
    of the values in id order): two datasets share it exactly when each column maps the same values to the
    same ids. Counts are left out: they say how often, not what an id means."""
    h = xxhash.xxh3_64()
    for name, vocab in vocabularies.items():
        h.update(f"{name}\0".encode())
        columns = [vocab[c] for c in vocab.columns if c != "count"] if hasattr(vocab, "columns") else [vocab]
        for column in columns:
            _update_with(h, column)
    return h.hexdigest()


def _update_with(h: Any, column: Any) -> None:
    """Feeds a Polars Series or NumPy array into ``h``: numbers as their bytes, text as lengths and bytes."""
    import numpy as np

    if isinstance(column, np.ndarray):
        h.update(f"{column.dtype}\0".encode())
        h.update(np.ascontiguousarray(column).tobytes())
        return
    h.update(f"{column.name}:{column.dtype}\0".encode())
    if column.dtype.is_numeric():
        h.update(column.fill_null(0).to_numpy().tobytes())
        h.update(column.is_null().to_numpy().tobytes())
        return
    text = column.cast(str).fill_null("")
    h.update(text.str.len_bytes().to_numpy().tobytes())
    if len(text):
        h.update(text.str.join("").item().encode())


def file_digest(path: Path) -> str:
    """XXH3-64 of a file's bytes, read in ``CHUNK``-byte pieces."""
    h = xxhash.xxh3_64()
    with open(path, "rb") as f:
        while piece := f.read(CHUNK):
            h.update(piece)
    return h.hexdigest()


def seal_files(directory: Path) -> dict[str, str]:
    """Writes ``FILES`` in ``directory``: the XXH3-64 of every file under it (by relative path); returns them."""
    directory = Path(directory)
    digests = {name: file_digest(directory / name) for name in _sealable(directory)}
    text = json.dumps({"algorithm": FILE_ALGORITHM, "files": digests}, indent=2) + "\n"
    (directory / FILES).write_text(text)
    return digests


def check_files(directory: Path) -> bool:
    """Checks the files of ``directory`` against its ``FILES``: a one-line ValueError naming the first file that is
    missing, changed or not listed. Returns False when the directory has no ``FILES`` (written before exports
    carried one), True when every file matched."""
    directory = Path(directory)
    record = directory / FILES
    if not record.is_file():
        return False
    try:
        data = json.loads(record.read_text(encoding="utf-8"))
        listed = data["files"]
        if data.get("algorithm") != FILE_ALGORITHM or not isinstance(listed, dict):
            raise ValueError(f"algorithm {data.get('algorithm')!r}")
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
        raise ValueError(f"{record}: not a file-digest record ({type(e).__name__}: {e})") from None
    present = set(_sealable(directory))
    for name in sorted(set(listed) | present):
        path = directory / name
        if name not in present:
            raise ValueError(f"{path}: listed in {FILES} but missing")
        if name not in listed:
            raise ValueError(f"{path}: not listed in {FILES} (added after the export)")
        if file_digest(path) != listed[name]:
            raise ValueError(f"{path}: its bytes do not match {FILES} (damaged or changed since it was exported)")
    return True


def _sealable(directory: Path) -> list[str]:
    """The files ``seal_files`` lists: all but ``FILES`` and Python's byte-code caches (Triton's Python backend
    writes ``__pycache__`` beside ``model.py`` when it imports it)."""
    found = (p.relative_to(directory) for p in directory.rglob("*") if p.is_file())
    return sorted(str(p) for p in found if p.name != FILES and "__pycache__" not in p.parts)
