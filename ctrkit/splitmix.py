"""SplitMix64 (Steele, Lea and Flood, 2014), the one 64-bit mixer ctrkit uses wherever it needs a fixed function of
an integer that looks random: dynamic tables' id slots, Outbrain's display split, the embedding tables' draw.

Its *finaliser* is a bijection of 64-bit integers that spreads neighbouring values apart. Its *stream* started at a
state ``s`` gives as its n-th value ``finalise(s + n * GOLDEN)`` (n = 1, 2, ...): any value of it can be computed
alone, with no generator run up to it. Here it is written once for Python integers, numpy's uint64 arrays and
torch's int64 tensors (holding the same 64 bits: torch has no full uint64 arithmetic), which give the same bits;
``ctrkit/native/draw.c`` is the C kernel of the tables' draw, held to these by a test.
"""

from __future__ import annotations

import numpy as np
import torch

GOLDEN = 0x9E3779B97F4A7C15  # 2**64 / the golden ratio, odd: the stream's increment
# the finaliser: z ^= z >> 30; z *= 0xBF58...; z ^= z >> 27; z *= 0x94D0...; z ^= z >> 31
STEPS = ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB), (31, None))
MASK = (1 << 64) - 1


def signed(value: int) -> int:
    """The int64 holding the 64 bits of ``value`` (taken modulo 2**64)."""
    value &= MASK
    return value - (1 << 64) if value >> 63 else value


def finalise_int(z: int) -> int:
    """The finaliser of a Python integer (taken modulo 2**64), as a non-negative integer below 2**64."""
    z &= MASK
    for shift, factor in STEPS:
        z ^= z >> shift
        if factor is not None:
            z = (z * factor) & MASK
    return z


def finalise_numpy(z: np.ndarray, scratch: np.ndarray | None = None) -> np.ndarray:
    """The finaliser applied to the uint64 array ``z`` in place (``scratch``: an array of its size, or None)."""
    scratch = np.empty_like(z) if scratch is None else scratch
    with np.errstate(over="ignore"):
        for shift, factor in STEPS:
            np.right_shift(z, np.uint64(shift), out=scratch)
            z ^= scratch
            if factor is not None:
                z *= np.uint64(factor)
    return z


def finalise_torch(z: torch.Tensor, scratch: torch.Tensor | None = None) -> torch.Tensor:
    """The finaliser applied in place to the int64 tensor ``z`` read as 64 bits (any device): shifts made logical
    by a mask, products taken modulo 2**64 as two's complement multiplication gives them."""
    scratch = torch.empty_like(z) if scratch is None else scratch
    for shift, factor in STEPS:
        torch.bitwise_right_shift(z, shift, out=scratch)
        scratch.bitwise_and_((1 << (64 - shift)) - 1)  # an arithmetic shift's copies of the sign bit cleared
        z.bitwise_xor_(scratch)
        if factor is not None:
            z.mul_(signed(factor))
    return z
