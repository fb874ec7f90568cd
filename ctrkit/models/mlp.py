"""Multi-layer perceptron with the initialisation NVIDIA's DLRM uses."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn


class _CpuDropout(torch.autograd.Function):
    """Dropout's training forward and backward for CPU tensors. The mask is drawn as 15 random bits per
    element (two elements per int32 from ``random_``, whose values lie in [0, 2^31)) against a threshold,
    so each element is kept with probability 1 - p to within 2^-15: on the CPU this costs about half of
    ``F.dropout``'s per-element Bernoulli draws. The mask is kept as ones and zeros in the input's dtype and
    applied by a product, then the scale: ``where`` with a scalar took about 2.5x as long as the product on
    the CPU. Kept values come out as ``where``'s did (x * 1, then the scale); dropped ones are zeros (-0.0
    for a negative value)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, p: float) -> torch.Tensor:
        n = x.numel()
        bits = torch.empty((n + 1) // 2, dtype=torch.int32).random_().view(torch.int16)[:n]
        keep = (bits.bitwise_and_(0x7FFF) >= round(p * 2**15)).view(x.shape).to(x.dtype)
        ctx.save_for_backward(keep)
        ctx.scale = 1.0 / (1.0 - p)
        return (x * keep).mul_(ctx.scale)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        (keep,) = ctx.saved_tensors
        return (grad * keep).mul_(ctx.scale), None


class Dropout(nn.Module):
    """``nn.Dropout`` (inverted dropout: kept values scaled by 1 / (1 - p), identity in evaluation) with
    a faster training path on the CPU (``_CpuDropout``); other devices use ``F.dropout``."""

    def __init__(self, p: float):
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout must lie in [0, 1), got {p}")
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        if x.device.type != "cpu":
            return F.dropout(x, self.p, training=True)
        return _CpuDropout.apply(x, self.p)

    def extra_repr(self) -> str:
        return f"p={self.p}"


class MLP(nn.Sequential):
    """Linear layers with ReLU between them.

    Weights are drawn from N(0, sqrt(2 / (fan_in + fan_out))) and biases from N(0, sqrt(1 / fan_out)),
    as in the reference DLRM.

    Args:
        in_features: width of the input.
        sizes: output width of each layer.
        relu_last: apply ReLU after the last layer too (bottom MLP) or not (a top MLP ending in a logit).
        dropout: dropout probability after each ReLU (0: none).

    Shapes: (B, in_features) -> (B, sizes[-1]).
    """

    def __init__(self, in_features: int, sizes: Sequence[int], relu_last: bool = True, dropout: float = 0.0):
        layers: list[nn.Module] = []
        width = in_features
        for i, out in enumerate(sizes):
            linear = nn.Linear(width, out)
            with torch.no_grad():
                linear.weight.normal_(0.0, math.sqrt(2.0 / (width + out)))
                linear.bias.normal_(0.0, math.sqrt(1.0 / out))
            layers.append(linear)
            if relu_last or i < len(sizes) - 1:
                layers.append(nn.ReLU(inplace=True))
                if dropout > 0:
                    layers.append(Dropout(dropout))
            width = out
        super().__init__(*layers)
        self.out_features = width
