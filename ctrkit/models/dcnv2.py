"""DCNv2: bottom MLP and embeddings concatenated, a cross network, and an MLP (stacked or parallel)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ctrkit.models.embeddings import CategoricalEmbeddings
from ctrkit.models.interaction import CrossNetwork
from ctrkit.models.mlp import MLP
from ctrkit.models.registry import register_model
from ctrkit.models.validation import check_bottom_top, check_inputs, check_multihot

STRUCTURES = ("stacked", "parallel")


@dataclass(frozen=True)
class DCNv2Config:
    """DCNv2 hyper-parameters; widths default to the Criteo-Kaggle DLRM shape for comparison.

    Attributes:
        num_numerical: numerical input features.
        cardinalities: rows of each categorical feature's table.
        embedding_dim: D; the bottom MLP's last layer must output D.
        bottom_mlp: layer widths of the bottom MLP over numerical features.
        top_mlp: widths of the deep MLP; the last must be 1 (the logit). In the parallel structure
            the layers before the last form the deep tower and the last is the final projection.
        cross_layers: cross layers.
        cross_projection_dim: rank r of each cross layer's U/V factorisation; 0 for full rank.
        structure: "stacked" (cross network, then the MLP, as NVIDIA's DCNv2) or "parallel"
            (cross network and deep tower side by side, concatenated, then one linear layer).
        sparse_gradients: embeddings produce sparse gradients.
        multihot_cardinalities: rows of each multi-hot feature's table (several ids per sample).
        multihot_combiners: "sum" or "mean" pooling per multi-hot feature.
    """

    num_numerical: int
    cardinalities: tuple[int, ...]
    embedding_dim: int = 16
    bottom_mlp: tuple[int, ...] = (512, 256, 64, 16)
    top_mlp: tuple[int, ...] = (512, 256, 1)
    cross_layers: int = 3
    cross_projection_dim: int = 512
    structure: str = "stacked"
    sparse_gradients: bool = True
    multihot_cardinalities: tuple[int, ...] = ()
    multihot_combiners: tuple[str, ...] = ()

    def validate(self) -> None:
        check_inputs(self.num_numerical, self.cardinalities, self.embedding_dim)
        check_multihot(self.multihot_cardinalities, self.multihot_combiners)
        check_bottom_top(self.num_numerical, self.embedding_dim, self.bottom_mlp, self.top_mlp)
        if self.cross_layers < 1:
            raise ValueError(f"cross_layers must be >= 1, got {self.cross_layers}")
        if self.cross_projection_dim < 0:
            raise ValueError(f"cross_projection_dim must be >= 0 (0: full rank), got {self.cross_projection_dim}")
        if self.structure not in STRUCTURES:
            raise ValueError(f"structure must be one of {', '.join(STRUCTURES)}, got {self.structure!r}")


# Adam on both parts, as the DCNv2 seed recipe uses Adam; the rates are the ones that trained best
# in one epoch on 300k synthetic Criteo-like rows at batch 1024 (see README).
DCNV2_TRAIN_DEFAULTS = {
    "optimizer": "adam",
    "lr": 1e-3,
    "embedding_optimizer": "adam",
    "embedding_lr": 1e-2,
    "batch_size": 1024,
}


@register_model("dcnv2", DCNv2Config, DCNV2_TRAIN_DEFAULTS)
class DCNv2(nn.Module):
    """Deep & Cross Network v2 (Wang et al., 2021).

    Shape letters: B batch, F categorical features, D embedding dim, N numerical features,
    d = D * (F + 1) (or D * F without numerical features) the width of x0.

    Args:
        config: DCNv2Config.

    Shapes: dense (B, N) float, sparse (B, F) int64, multi_hot (Fm features) or None -> logits (B,).
    """

    def __init__(self, config: DCNv2Config):
        super().__init__()
        self.config = config
        d = config.embedding_dim
        self.bottom_mlp = MLP(config.num_numerical, config.bottom_mlp) if config.num_numerical else None
        self.embeddings = CategoricalEmbeddings.from_config(config, d)
        num_features = self.embeddings.num_features
        width = d * (num_features + (1 if self.bottom_mlp is not None else 0))
        self.cross = CrossNetwork(width, config.cross_layers, config.cross_projection_dim)
        if config.structure == "stacked":
            self.deep = None
            self.top_mlp = MLP(width, config.top_mlp, relu_last=False)
        else:
            self.deep = MLP(width, config.top_mlp[:-1]) if len(config.top_mlp) > 1 else None
            deep_width = self.deep.out_features if self.deep is not None else 0
            self.top_mlp = MLP(width + deep_width, (1,), relu_last=False)

    def forward(self, dense: torch.Tensor | None, sparse: torch.Tensor, multi_hot=None) -> torch.Tensor:
        emb = self.embeddings(sparse, multi_hot).flatten(1)  # (B, F*D)
        if self.bottom_mlp is None:
            x0 = emb  # (B, d)
        else:
            bottom = self.bottom_mlp(dense)  # (B, D), bf16 under autocast
            x0 = torch.cat([bottom, emb.to(bottom.dtype)], 1)  # (B, d), one dtype: mixed products are slow
        crossed = self.cross(x0)  # (B, d)
        if self.deep is not None:
            crossed = torch.cat([crossed, self.deep(x0)], 1)  # (B, d + deep)
        return self.top_mlp(crossed).squeeze(1)  # (B,)
