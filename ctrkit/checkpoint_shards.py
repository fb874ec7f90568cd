"""A hybrid-parallel run's checkpoint files: each rank's file, the tables assembled from them (whole, or as views
that read the memory-mapped rank files in blocks), and the layout of sharded table keys."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol, TypeVar

import numpy as np
import torch
from torch import nn

from ctrkit.checkpoint_files import (
    DIGEST,
    CheckpointError,
    drop_pages,
    mapped_file_range,
    read_torch_file,
    write_sealed,
)


class ShardedManifest(Protocol):
    """What this module reads of a sharded checkpoint's manifest (``checkpoint.Checkpoint`` is one, a dataclass):
    its rank files, the manifest's record of each, and the sharding they were written with."""

    shard_files: list[str] | None
    shard_records: list[dict[str, Any]] | None
    sharding: dict[str, list] | None


Manifest = TypeVar("Manifest", bound=ShardedManifest)
RELEASE_CHUNK_BYTES = 32 * 2**20  # a memory-mapped source is copied and released this many bytes at a time


def chunk_rows(row_bytes: int) -> int:
    """Rows per chunk when copying from a memory-mapped source and releasing what was copied."""
    return max(1, RELEASE_CHUNK_BYTES // max(row_bytes, 1))


class MappedSource:
    """The rank files of a checkpoint, memory-mapped: ``copy(dst, src)`` copies a tensor read from one of
    them and then drops the pages it read from this process's resident memory (``madvise(MADV_DONTNEED)``
    on the file's private, never-written mapping: the next read faults them in from the file again), a
    chunk of rows at a time. Without this, every page a load touches stays resident until the whole file
    is unmapped, and loading a checkpoint costs its size on top of the model. Memory that is not a mapping
    of one of ``paths`` (checked in /proc/self/maps) is only copied, never released."""

    def __init__(self, paths: list[str | os.PathLike]):
        self.paths = [str(p) for p in paths]
        self._libc = None
        try:
            import ctypes

            self._libc = ctypes.CDLL(None, use_errno=True)
            self._page = os.sysconf("SC_PAGE_SIZE")
        except (OSError, AttributeError, ValueError):
            self._libc = None

    def mapped(self, ptr: int, nbytes: int) -> bool:
        """Whether [ptr, ptr + nbytes) lies in this process's mapping of one of the files (never for less than
        a page, which holds no whole page to release: no need to read /proc/self/maps for it)."""
        if self._libc is None or nbytes < self._page:
            return False
        for path in self.paths:
            found = mapped_file_range(ptr, path)
            if found is not None:
                return ptr + nbytes <= found[1]
        return False

    def _mapped(self, t: torch.Tensor) -> bool:
        if t.device.type != "cpu" or not t.is_contiguous():
            return False
        return self.mapped(t.data_ptr(), t.numel() * t.element_size())

    def clone(self, t: torch.Tensor) -> torch.Tensor:
        """A copy of ``t`` in ordinary memory (``copy``)."""
        out = torch.empty(t.shape, dtype=t.dtype)
        self.copy(out, t)
        return out

    def release(self, start: int, length: int) -> None:
        """Drops the whole pages inside [start, start + length) (caller: a mapping of one of the files)."""
        drop_pages(start, length, self._libc, self._page)

    @torch.no_grad()
    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """``dst.copy_(src)``, releasing ``src``'s pages as it goes when ``src`` lies in one of the files."""
        if src.dim() == 0 or not self._mapped(src):
            dst.copy_(src)
            return
        rows = chunk_rows(src[0].numel() * src.element_size())
        for lo in range(0, src.shape[0], rows):
            piece = src[lo : lo + rows]
            dst[lo : lo + rows].copy_(piece)
            self.release(piece.data_ptr(), piece.numel() * piece.element_size())

    def load_state(self, module: nn.Module, state: dict[str, torch.Tensor]) -> None:
        """``module.load_state_dict(state)`` (strict) through ``copy``."""
        own = module.state_dict()
        missing, unexpected = sorted(set(own) - set(state)), sorted(set(state) - set(own))
        if missing or unexpected:
            raise ValueError(f"state dict does not fit the model: missing {missing}, unexpected {unexpected}")
        for name, target in own.items():
            if target.shape != state[name].shape:
                raise ValueError(f"{name}: the checkpoint's shape {tuple(state[name].shape)} is not the "
                                 f"model's {tuple(target.shape)}")  # fmt: skip
            self.copy(target, state[name])


def rank_file_name(path: str | os.PathLike, step: int, rank: int, world_size: int) -> str:
    """Where rank ``rank`` writes its part of the checkpoint ``path`` at ``step`` (relative to its directory)."""
    return f"{Path(path).name}.shards/step{step}-rank{rank}-of-{world_size}.pt"


def write_rank_file(path: Path, part: dict[str, Any], run: str, step: int, rank: int) -> dict[str, Any]:
    """Writes rank ``rank``'s ``part`` of run ``run``'s checkpoint at ``step`` (atomically, with its digest);
    returns the record the manifest keeps of it (``Checkpoint.shard_records``)."""
    record = {"run": run, "step": int(step), "rank": int(rank)}
    digest = write_sealed(path, {**part, "provenance": record})
    return {**record, "digest": digest}


def read_rank_file(ckpt: ShardedManifest, rank: int, verify: bool = True) -> dict[str, Any]:
    """Rank ``rank``'s part of a sharded checkpoint read by ``load_checkpoint`` (memory-mapped), checked
    against the manifest's record of it (run, step, rank, digest) and, with ``verify``, its contents against
    their digest (which reads the whole file once)."""
    path = Path(ckpt.shard_files[rank])
    part = read_torch_file(path, mmap=True, verify=verify)
    if not isinstance(part, dict) or "model" not in part:
        raise CheckpointError(f"{path}: not a ctrkit checkpoint shard file")
    if ckpt.shard_records is not None:
        want, got = ckpt.shard_records[rank], dict(part.get("provenance") or {})
        got["digest"] = (part.get(DIGEST) or {}).get("value")
        if got != want:
            said = lambda r: f"rank {r.get('rank')} of step {r.get('step')} of run {str(r.get('run'))[:8]}"  # noqa: E731
            detail = said(got) if got.get("run") is not None else "no record of the run that wrote it"
            what = f"holds {detail}" + (", other weights" if said(got) == said(want) else "")
            raise CheckpointError(
                f"{path}: refused: this rank file {what}; the manifest expects "
                f"{said(want)} (a file copied from another run or step, or renamed)"
            )
    return part


def table_prefix(plan_name: str) -> str:
    """The module path of a plan's tables: "embeddings" -> "embeddings.onehot", "x.bags" stays."""
    return plan_name if plan_name.endswith(".bags") else f"{plan_name}.onehot"


def assemble_shards(ckpt: Manifest, lazy: bool = False) -> Manifest:
    """The one-file form of a sharded checkpoint: whole tables assembled from every rank's file (each
    memory-mapped, so only the assembled tables take memory), rank 0's optimizer states as
    ``optimizers`` and every rank's as ``rank_optimizers``.

    With ``lazy`` each table is a ``ShardedTableView`` over the rank files instead, from which a reader
    that holds only some shards (``load_full_tables``: ``table[rows, cols]``) reads just those rows and
    columns: nothing is assembled."""
    parts = [read_rank_file(ckpt, r) for r in range(len(ckpt.shard_files))]
    sharding = ckpt.sharding or {}
    prefixes = tuple(f"{table_prefix(n)}." for n in sharding)
    source = MappedSource(ckpt.shard_files) if lazy else None

    def whole(which: str) -> dict[str, Any]:
        state: dict[str, Any] = {k: v.clone() for k, v in parts[0][which].items() if not k.startswith(prefixes)}
        for prefix, (rows, dim, pieces) in _table_pieces(sharding, parts, which).items():
            if lazy:
                state[f"{prefix}.weight"] = _view(pieces, rows, dim, source)
                continue
            flat = torch.zeros(rows, dim)
            for lo, hi, col_lo, col_hi, piece in pieces:
                flat[lo:hi, col_lo:col_hi] = piece
            state[f"{prefix}.weight"] = flat
        return state

    resume_model = whole("resume_model") if parts[0].get("resume_model") is not None else None
    optimizers = {"optimizers": parts[0]["optimizers"], "rank_optimizers": [p["optimizers"] for p in parts]}
    return replace(
        ckpt.resuming(model=resume_model, **optimizers), model=whole("model"), shard_files=None, shard_records=None
    )


class ShardedTableView:
    """One flat table of a sharded checkpoint, read by rows from the rank files (memory-mapped) without
    ever being assembled: ``view[rows]`` gathers the given flat rows (N,) from the shards that hold
    them into an (N, dim) array. Serving's memory-mapped store reads a sharded checkpoint through it."""

    def __init__(
        self, pieces: list[tuple[int, int, int, int, Any]], rows: int, dim: int, source: MappedSource | None = None
    ):
        self.shape = (rows, dim)
        self.dtype = pieces[0][4].dtype if pieces else np.dtype(np.float32)
        self.source = source  # block reads release the rank files' pages they read (``MappedSource``)
        self._releasable: set[int] = set()
        groups: dict[tuple[int, int], list[tuple[int, int, Any]]] = {}
        for lo, hi, col_lo, col_hi, array in pieces:  # flat rows [lo, hi), columns [col_lo, col_hi)
            groups.setdefault((col_lo, col_hi), []).append((lo, hi, array))
            if source is not None and array.flags.c_contiguous and source.mapped(array.ctypes.data, array.nbytes):
                self._releasable.add(id(array))
        self.groups = []
        for cols, members in sorted(groups.items()):
            members.sort(key=lambda m: m[0])
            starts = np.array([m[0] for m in members], dtype=np.int64)
            self.groups.append((cols, starts, members))

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, rows: np.ndarray | tuple[slice, slice]) -> np.ndarray | torch.Tensor:
        if isinstance(rows, tuple):
            return self._block(*rows)
        rows = np.asarray(rows, dtype=np.int64).reshape(-1)
        if rows.size and (rows.min() < 0 or rows.max() >= self.shape[0]):
            raise IndexError(f"rows outside the table's {self.shape[0]} rows")
        out = np.zeros((len(rows), self.shape[1]), dtype=self.dtype)
        for (col_lo, col_hi), starts, members in self.groups:
            which = np.searchsorted(starts, rows, side="right") - 1
            for k in np.unique(which[which >= 0]):
                lo, hi, array = members[k]
                take = (which == k) & (rows < hi)
                out[take, col_lo:col_hi] = array[rows[take] - lo]
        return out

    def _block(self, rows: slice, cols: slice) -> torch.Tensor:
        """``view[lo:hi, col_lo:col_hi]``: a block (contiguous rows and columns) as a new tensor."""
        lo, hi, step = rows.indices(self.shape[0])
        col_lo, col_hi, col_step = cols.indices(self.shape[1])
        if step != 1 or col_step != 1:
            raise IndexError("a sharded table is read in blocks of contiguous rows and columns")
        out = np.zeros((max(hi - lo, 0), max(col_hi - col_lo, 0)), dtype=self.dtype)
        self.read_block(out, lo, col_lo)
        return torch.from_numpy(out)

    def read_block(self, out: np.ndarray, lo: int, col_lo: int) -> None:
        """Fills ``out`` (R, C) with rows [lo, lo + R) and columns [col_lo, col_lo + C), reading only the
        pieces the block overlaps (rows no piece holds are left as they are)."""
        hi, col_hi = lo + out.shape[0], col_lo + out.shape[1]
        for (c_lo, c_hi), _, members in self.groups:
            a, b = max(col_lo, c_lo), min(col_hi, c_hi)
            if a >= b:
                continue
            for p_lo, p_hi, array in members:
                r_lo, r_hi = max(lo, p_lo), min(hi, p_hi)
                releasable = id(array) in self._releasable
                row_bytes = array.strides[0]
                step = chunk_rows(row_bytes) if releasable else max(r_hi - r_lo, 1)
                for start in range(r_lo, r_hi, step):  # in chunks, each chunk's pages dropped once copied
                    end = min(start + step, r_hi)
                    out[start - lo : end - lo, a - col_lo : b - col_lo] = array[
                        start - p_lo : end - p_lo, a - c_lo : b - c_lo
                    ]
                    if releasable:
                        self.source.release(array.ctypes.data + (start - p_lo) * row_bytes, (end - start) * row_bytes)


def _view(
    pieces: list[tuple[int, int, int, int, torch.Tensor]], rows: int, dim: int, source: MappedSource | None = None
) -> ShardedTableView:
    """A flat table's pieces (from ``_table_pieces``) as a view; each piece stays in its (memory-mapped) file."""
    kept = [(lo, hi, cl, ch, t.detach().numpy()) for lo, hi, cl, ch, t in pieces if (hi - lo) * (ch - cl)]
    return ShardedTableView(kept, rows, dim, source)


def sharded_table_views(ckpt: ShardedManifest, which: str = "model") -> dict[str, ShardedTableView]:
    """The flat tables of a sharded checkpoint as views over its rank files, by their module path
    (e.g. ``embeddings.onehot``); nothing is assembled."""
    parts = [read_rank_file(ckpt, r) for r in range(len(ckpt.shard_files or []))]
    pieces = _table_pieces(ckpt.sharding or {}, parts, which)
    return {prefix: _view(found, rows, dim) for prefix, (rows, dim, found) in pieces.items()}


def key_regions(key: list[list[int]]) -> tuple[int, int, list[tuple[int, int, int, int, int]]]:
    """A table collection's sharding key (``ShardingPlan.key``) read back: its flat rows, its width, and
    each shard in key order as (rank, flat row_lo, flat row_hi, col_lo, col_hi), rows counted in the flat
    (sum of cardinalities, dim) table. A rank's shards, in this order, are its ``shards.0``, ``shards.1``..."""
    shards = [tuple(int(v) for v in x) for x in key[1:]]  # (feature, rank, row_lo, row_hi, col_lo, col_hi)
    cards: dict[int, int] = {}
    for f, _, _, row_hi, _, _ in shards:
        cards[f] = max(cards.get(f, 0), row_hi)
    offsets = {f: sum(cards[g] for g in range(f)) for f in cards}
    regions = [(r, offsets[f] + lo, offsets[f] + hi, col_lo, col_hi) for f, r, lo, hi, col_lo, col_hi in shards]
    return sum(cards.values()), max(s[5] for s in shards), regions


def _table_pieces(
    sharding: dict[str, list], parts: list[dict[str, Any]], which: str
) -> dict[str, tuple[int, int, list[tuple[int, int, int, int, torch.Tensor]]]]:
    """Per flat table (by module path): its rows, its width, and its shards as (flat row_lo, flat row_hi,
    col_lo, col_hi, tensor) read from the rank files' ``which`` state."""
    out = {}
    for name, key in sharding.items():
        rows, dim, regions = key_regions(key)
        seen = [0] * len(parts)
        pieces = []
        for r, lo, hi, col_lo, col_hi in regions:
            pieces.append((lo, hi, col_lo, col_hi, parts[r][which][f"{table_prefix(name)}.shards.{seen[r]}"]))
            seen[r] += 1
        out[table_prefix(name)] = (rows, dim, pieces)
    return out
