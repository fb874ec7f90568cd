"""Multi-layer perceptron with the initialisation NVIDIA's DLRM uses."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn


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
                    layers.append(nn.Dropout(dropout))
            width = out
        super().__init__(*layers)
        self.out_features = width
