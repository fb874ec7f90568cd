"""DLRM: bottom MLP over numerical features, embeddings, dot interaction, top MLP."""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

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
from ctrkit.models.interaction import DotInteraction
from ctrkit.models.mlp import MLP
from ctrkit.models.numerical import NumericalNormalizer
from ctrkit.models.registry import register_model
from ctrkit.models.storage import IN_MEMORY, TableStorage


@dataclass(frozen=True)
class DLRMConfig(BottomTopConfig):
    """DLRM hyper-parameters (the input and MLP fields are InputsConfig's and BottomTopConfig's): the
    Criteo-Kaggle shape, but 64-wide embeddings (the Kaggle recipe's are 16), which ranked best on the
    accuracy panel's planted interaction data (docs/decisions/dlrm-width.md). DCNv2 and Wide & Deep keep 16.

    Attributes:
        self_interaction: include each vector's dot with itself in the interaction.
    """

    embedding_dim: int = 64
    bottom_mlp: tuple[int, ...] = (512, 256, 64)
    self_interaction: bool = False

    def validate(self) -> None:
        if self.mixed_widths:
            raise ValueError(
                f"DLRM's dot interaction needs one embedding width for every feature (embedding_dim "
                f"{self.embedding_dim}), got per-feature widths {sorted(set(self.feature_dims))}: give one width, "
                "or train dcnv2 or wide_deep, which concatenate the embeddings"
            )
        super().validate()


@register_model("dlrm", DLRMConfig, TRAIN_DEFAULTS)
class DLRM(WideParameters, nn.Module):
    """Deep Learning Recommendation Model (Naumov et al., 2019), built from a DLRMConfig.

    Shapes (B batch, F categorical features, D embedding dim, N numerical features): numerical (B, N)
    float, categorical (B, F) int64 and multi_hot (Fm features) or None in; logits (B,) out.
    """

    def __init__(self, config: DLRMConfig, storage: TableStorage = IN_MEMORY):
        super().__init__()
        self.config = config
        self.dynamic_ids = dynamic_ids(config)  # raw ids -> rows of the dynamic features (None: none)
        self.numerical_norm = NumericalNormalizer(config.num_numerical)
        self.bottom_mlp, self.embeddings, num_vectors = input_layers(config, storage)
        linear = LinearTerm.build(config, storage) if config.linear else (None, None, None)
        self.wide_embeddings, self.wide_dense, self.wide_buckets = linear
        self.interaction = DotInteraction(
            num_vectors, config.embedding_dim, config.self_interaction, with_dense=self.bottom_mlp is not None
        )
        self.top_mlp = MLP(self.interaction.out_features, config.top_mlp, relu_last=False)

    @property
    def output_layer(self) -> nn.Linear:
        """The last linear layer (to the logit) of the deep part."""
        return cast(nn.Linear, self.top_mlp[-1])

    def forward(self, numerical: torch.Tensor | None, categorical: torch.Tensor, multi_hot=None) -> torch.Tensor:
        categorical, numerical, raw = self.model_inputs(numerical, categorical)
        emb = self.embeddings(categorical, multi_hot)  # (B, F, D), F counting multi-hot features
        bottom = self.bottom_mlp(numerical) if self.bottom_mlp is not None else None  # (B, D)
        logits = self.top_mlp(self.interaction(bottom, emb)).squeeze(1)  # (B,)
        return self.plus_wide(logits, numerical, categorical, multi_hot, raw)
