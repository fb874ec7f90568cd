"""The embedding tables' initial values: drawn by a counter-based generator, so that any rows and columns of any
table can be drawn alone, where they train, and equal the same part of the whole table.

Table ``feature``'s value at (row, col) is U(-b, b), b = 1/sqrt(cardinality): the n-th value of the SplitMix64
stream (``ctrkit.splitmix``) started at the table's key, n = row * dim + col + 1. The key is a function of the
collection's seed, the feature and the draw (``table_key``). The stream's top 25 bits, made odd, less 2**24, are an
odd integer j in (-2**24, 2**24); the value is j times b / 2**24 rounded to float32, one correctly rounded float32
product. Integer steps and that product give the same bits everywhere: the C kernel (``ctrkit/native/draw.c``) on
the CPU, torch's operations on a GPU (the GPU draws its own tables) and on a CPU where the kernel is not built.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ctrkit import native, splitmix

# values drawn at once by torch's operations (six int64 or float32 tensors of this size): a block that stays in a
# CPU's cache, or a few hundred MB of a GPU's memory
CHUNK_VALUES = {"cpu": 1 << 14, "other": 1 << 24}


def table_key(seed: int, feature: int, draw: int = 0) -> int:
    """The 64-bit key of ``feature``'s table in draw ``draw`` of a collection seeded ``seed``."""
    key = splitmix.finalise_int(seed + splitmix.GOLDEN)
    key = splitmix.finalise_int(key ^ feature)
    return splitmix.finalise_int(key ^ draw)


def scale_of(bound: float) -> float:
    """``bound`` / 2**24 rounded to float32 (as a Python float): what each drawn integer is multiplied by."""
    return torch.tensor(bound / (1 << 24), dtype=torch.float32).item()


def draw_uniform(out: torch.Tensor, key: int, row0: int, col0: int, dim: int, bound: float) -> torch.Tensor:
    """Writes into ``out`` (rows, cols) the values at rows ``row0``.. and columns ``col0``.. of the table of ``dim``
    columns keyed ``key``, U(-bound, bound); returns ``out``. Any device and dtype (values drawn in float32)."""
    rows, cols = out.shape
    if rows == 0 or cols == 0:
        return out
    scale = scale_of(bound)
    lib = native.library() if out.device.type == "cpu" and out.dtype == torch.float32 else None
    if lib is not None and (out.stride(1) == 1 or cols == 1):
        lib.ctrkit_draw_uniform_f32(out.data_ptr(), rows, cols, out.stride(0), key, row0, col0, dim, scale)
        return out
    return _draw_with_torch(out, key, row0, col0, dim, scale)


@torch.no_grad()
def _draw_with_torch(out: torch.Tensor, key: int, row0: int, col0: int, dim: int, scale: float) -> torch.Tensor:
    """``draw_uniform`` in torch's operations on ``out``'s device, ``CHUNK_VALUES`` values at a time, in buffers
    allocated once."""
    rows, cols = out.shape
    device = out.device
    step = max(1, min(rows, CHUNK_VALUES["cpu" if device.type == "cpu" else "other"] // max(cols, 1)))
    columns = torch.arange(cols, device=device, dtype=torch.int64)
    factor = torch.tensor(scale, dtype=torch.float32, device=device)
    starts_buf = torch.empty(step, dtype=torch.int64, device=device)
    z_buf, scratch_buf = (torch.empty(step, cols, dtype=torch.int64, device=device) for _ in range(2))
    values_buf = torch.empty(step, cols, dtype=torch.float32, device=device)
    for lo in range(0, rows, step):
        hi = min(lo + step, rows)
        starts, z, values = starts_buf[: hi - lo], z_buf[: hi - lo], values_buf[: hi - lo]
        torch.arange(row0 + lo, row0 + hi, out=starts).mul_(dim).add_(col0 + 1)
        torch.add(starts.unsqueeze(1), columns, out=z).mul_(splitmix.signed(splitmix.GOLDEN)).add_(splitmix.signed(key))
        splitmix.finalise_torch(z, scratch_buf[: hi - lo])
        z.bitwise_right_shift_(39).bitwise_and_((1 << 25) - 1).bitwise_or_(1).sub_(1 << 24)
        out[lo:hi].copy_(values.copy_(z).mul_(factor))
    return out


@dataclass(frozen=True)
class TableInit:
    """How a collection's tables are drawn: enough to redraw any rows and columns of any table anywhere (a
    hybrid-parallel rank keeps this instead of the whole tables)."""

    seed: int
    zero: bool
    cardinalities: tuple[int, ...]
    dim: int

    def fill(
        self,
        out: torch.Tensor,
        feature: int,
        row_lo: int,
        row_hi: int,
        col_lo: int = 0,
        col_hi: int | None = None,
        draw: int = 0,
    ) -> torch.Tensor:
        """Writes rows [row_lo, row_hi) and columns [col_lo, col_hi) of ``feature``'s initial table into
        ``out`` (row_hi - row_lo, col_hi - col_lo); returns it. ``draw`` 0 is the initial table, each
        other value an independent redraw (``reinit_embeddings`` draws epoch e's tables with e)."""
        col_hi = self.dim if col_hi is None else col_hi
        if tuple(out.shape) != (row_hi - row_lo, col_hi - col_lo):
            raise ValueError(f"out is {tuple(out.shape)}, not the {row_hi - row_lo} x {col_hi - col_lo} block drawn")
        if self.zero:
            return out.zero_()
        bound = 1.0 / math.sqrt(self.cardinalities[feature])
        key = table_key(self.seed, feature, draw)
        with torch.no_grad():  # the tables are parameters
            return draw_uniform(out, key, row_lo, col_lo, self.dim, bound)
