"""Digests of what ctrkit writes, checked when it is read back.

A checkpoint's (and each rank file's) tensors are hashed with XXH3-64 in the order they are stored, each
with its place in the file, dtype and shape, so a flipped byte, a truncated tensor or two tensors swapped
give another digest. XXH3 reads memory about as fast as it can be read: verifying costs a few percent of ``torch.load``
(``docs/decisions/checkpoint-digest.md``). It guards against damage, not against someone who rewrites
the file and its digest together.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
import xxhash

ALGORITHM = "xxh3_64"
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


def tensor_digest(obj: Any) -> str:
    """The digest of every tensor in ``obj``: its place, dtype, shape and bytes. A tensor's bytes are hashed
    in ``CHUNK``-byte pieces, on ``torch.get_num_threads()`` threads (XXH3 releases the GIL), and the pieces'
    hashes go into the digest in order: the same digest whatever the thread count."""
    h = xxhash.xxh3_64()
    for where, x in tensors(obj):
        if x.is_meta:
            continue
        t = x.detach().cpu().contiguous().reshape(-1)
        h.update(f"{where}:{t.dtype}:{tuple(x.shape)}\0".encode())
        if t.numel():
            data = memoryview(t.view(torch.uint8).numpy())
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
    """``data`` with its tensors' digest under ``KEY``."""
    return {**data, KEY: {"algorithm": ALGORITHM, "value": tensor_digest(data)}}


def check(data: Any) -> str | None:
    """None when ``data`` carries no digest or its tensors match it; else what is wrong."""
    if not isinstance(data, dict) or not isinstance(data.get(KEY), dict):
        return None
    recorded = data[KEY]
    if recorded.get("algorithm") != ALGORITHM:
        return f"its digest uses {recorded.get('algorithm')!r}, which this ctrkit does not know"
    if tensor_digest(data) != recorded.get("value"):
        return "its tensor data does not match the digest recorded when it was written (damaged or changed since)"
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
