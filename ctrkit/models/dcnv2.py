"""DCNv2: bottom MLP and embeddings concatenated, a cross network, and an MLP (stacked or parallel)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ctrkit.models.dynamic import dynamic_ids
from ctrkit.models.inputs import (
    TRAIN_DEFAULTS,
    BottomTopConfig,
    LinearTerm,
    WideParameters,
    input_layers,
)
from ctrkit.models.interaction import CrossNetwork
from ctrkit.models.mlp import MLP
from ctrkit.models.numerical import NumericalNormalizer
from ctrkit.models.registry import register_model
from ctrkit.models.storage import IN_MEMORY, TableStorage

STRUCTURES = ("stacked", "parallel")


@dataclass(frozen=True)
class DCNv2Config(BottomTopConfig):
    """DCNv2 hyper-parameters (the input and MLP fields are InputsConfig's and BottomTopConfig's);
    widths default to the Criteo-Kaggle DLRM shape for comparison. In the parallel structure the
    top MLP's layers before the last form the deep tower and the last is the final projection.

    Attributes:
        cross_layers: cross layers.
        cross_projection_dim: rank r of each cross layer's U/V factorisation; 0 for full rank.
        structure: "stacked" (cross network, then the MLP, as NVIDIA's DCNv2) or "parallel"
            (cross network and deep tower side by side, concatenated, then one linear layer).
    """

    cross_layers: int = 3
    cross_projection_dim: int = 512
    structure: str = "stacked"

    def validate(self) -> None:
        super().validate()
        if self.cross_layers < 1:
            raise ValueError(f"cross_layers must be >= 1, got {self.cross_layers}")
        if self.cross_projection_dim < 0:
            raise ValueError(f"cross_projection_dim must be >= 0 (0: full rank), got {self.cross_projection_dim}")
        if self.structure not in STRUCTURES:
            raise ValueError(f"structure must be one of {', '.join(STRUCTURES)}, got {self.structure!r}")


@register_model("dcnv2", DCNv2Config, TRAIN_DEFAULTS)
class DCNv2(WideParameters, nn.Module):
    """Deep & Cross Network v2 (Wang et al., 2021) from a DCNv2Config: the cross network over
    x0 = [bottom MLP output, embeddings], of width d = D * (F + 1) (D * F without numerical features).

    Takes numerical (B, N) float, categorical (B, F) int64 and multi_hot (Fm features) or None, and
    returns logits (B,); B is the batch, F the categorical features, D the embedding dim.
    """

    def __init__(self, config: DCNv2Config, storage: TableStorage = IN_MEMORY):
        super().__init__()
        self.config = config
        self.dynamic_ids = dynamic_ids(config)  # raw ids -> rows of the dynamic features (None: none)
        self.numerical_norm = NumericalNormalizer(config.num_numerical)
        self.bottom_mlp, self.embeddings, _ = input_layers(config, storage)
        linear = LinearTerm.build(config, storage) if config.linear else (None, None, None)
        self.wide_embeddings, self.wide_dense, self.wide_buckets = linear
        bottom_width = config.embedding_dim if self.bottom_mlp is not None else 0
        width = bottom_width + self.embeddings.output_width  # D * num_vectors at one width
        self.cross = CrossNetwork(width, config.cross_layers, config.cross_projection_dim)
        if config.structure == "stacked":
            self.deep = None
            self.top_mlp = MLP(width, config.top_mlp, relu_last=False)
        else:
            self.deep = MLP(width, config.top_mlp[:-1]) if len(config.top_mlp) > 1 else None
            deep_width = self.deep.out_features if self.deep is not None else 0
            self.top_mlp = MLP(width + deep_width, (1,), relu_last=False)

    @property
    def output_layer(self) -> nn.Linear:
        """The last linear layer (to the logit) of the deep part."""
        return self.top_mlp[-1]

    def forward(self, numerical: torch.Tensor | None, categorical: torch.Tensor, multi_hot=None) -> torch.Tensor:
        categorical, numerical, raw = self.model_inputs(numerical, categorical)
        emb = self.embeddings(categorical, multi_hot).flatten(1)  # (B, F*D; the sum of the widths)
        if self.bottom_mlp is None:
            x0 = emb  # (B, d)
        else:
            bottom = self.bottom_mlp(numerical)  # (B, D), bf16 under autocast
            x0 = torch.cat([bottom, emb.to(bottom.dtype)], 1)  # (B, d), one dtype: mixed products are slow
        crossed = self.cross(x0)  # (B, d)
        if self.deep is not None:
            crossed = torch.cat([crossed, self.deep(x0)], 1)  # (B, d + deep)
        return self.plus_wide(self.top_mlp(crossed).squeeze(1), numerical, categorical, multi_hot, raw)  # (B,)
