"""DLRM: bottom MLP over numerical features, embeddings, dot interaction, top MLP."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ctrkit.models.embeddings import CategoricalEmbeddings
from ctrkit.models.interaction import DotInteraction
from ctrkit.models.mlp import MLP
from ctrkit.models.registry import register_model
from ctrkit.models.validation import check_bottom_top, check_inputs, check_multihot


@dataclass(frozen=True)
class DLRMConfig:
    """DLRM hyper-parameters. The defaults are the Criteo-Kaggle shape, which trains well on CPU.

    Attributes:
        num_numerical: numerical input features (13 for Criteo).
        cardinalities: rows of each categorical feature's table.
        embedding_dim: D; the bottom MLP's last layer must output D.
        bottom_mlp: layer widths of the bottom MLP.
        top_mlp: layer widths of the top MLP; the last must be 1 (the logit).
        self_interaction: include each vector's dot with itself in the interaction.
        sparse_gradients: embeddings produce sparse gradients (keep True for speed).
        multihot_cardinalities: rows of each multi-hot feature's table (several ids per sample).
        multihot_combiners: "sum" or "mean" pooling per multi-hot feature.
    """

    num_numerical: int
    cardinalities: tuple[int, ...]
    embedding_dim: int = 16
    bottom_mlp: tuple[int, ...] = (512, 256, 64, 16)
    top_mlp: tuple[int, ...] = (512, 256, 1)
    self_interaction: bool = False
    sparse_gradients: bool = True
    multihot_cardinalities: tuple[int, ...] = ()
    multihot_combiners: tuple[str, ...] = ()

    def validate(self) -> None:
        check_inputs(self.num_numerical, self.cardinalities, self.embedding_dim)
        check_multihot(self.multihot_cardinalities, self.multihot_combiners)
        check_bottom_top(self.num_numerical, self.embedding_dim, self.bottom_mlp, self.top_mlp)


# Plain SGD on everything, as the reference DLRM; lr 1.0 at batch 128 trained best on 300k synthetic rows.
DLRM_TRAIN_DEFAULTS = {"optimizer": "sgd", "lr": 1.0, "embedding_optimizer": "sgd", "batch_size": 128}


@register_model("dlrm", DLRMConfig, DLRM_TRAIN_DEFAULTS)
class DLRM(nn.Module):
    """Deep Learning Recommendation Model (Naumov et al., 2019).

    Shape letters: B batch, F categorical features, D embedding dim, N numerical features.

    Args:
        config: DLRMConfig.

    Shapes: dense (B, N) float, sparse (B, F) int64, multi_hot (Fm features) or None -> logits (B,).
    """

    def __init__(self, config: DLRMConfig):
        super().__init__()
        self.config = config
        d = config.embedding_dim
        self.bottom_mlp = MLP(config.num_numerical, config.bottom_mlp) if config.num_numerical else None
        self.embeddings = CategoricalEmbeddings.from_config(config, d)
        num_features = self.embeddings.num_features
        num_vectors = num_features + (1 if self.bottom_mlp is not None else 0)
        self.interaction = DotInteraction(
            num_vectors, d, config.self_interaction, with_dense=self.bottom_mlp is not None
        )
        self.top_mlp = MLP(self.interaction.out_features, config.top_mlp, relu_last=False)

    def forward(self, dense: torch.Tensor | None, sparse: torch.Tensor, multi_hot=None) -> torch.Tensor:
        emb = self.embeddings(sparse, multi_hot)  # (B, F, D), F counting multi-hot features
        bottom = self.bottom_mlp(dense) if self.bottom_mlp is not None else None  # (B, D)
        return self.top_mlp(self.interaction(bottom, emb)).squeeze(1)  # (B,)
