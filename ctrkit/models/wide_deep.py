"""Wide & Deep: a linear model over all features plus an MLP over embeddings and numerical features."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ctrkit.models.dynamic import dynamic_ids
from ctrkit.models.inputs import (
    TRAIN_DEFAULTS,
    InputsConfig,
    LinearTerm,
    WideParameters,
    deep_embeddings,
)
from ctrkit.models.mlp import MLP
from ctrkit.models.numerical import NumericalNormalizer
from ctrkit.models.registry import register_model
from ctrkit.models.storage import IN_MEMORY, TableStorage


@dataclass(frozen=True)
class WideDeepConfig(InputsConfig):
    """Wide & Deep hyper-parameters (the input fields are InputsConfig's; the deep tower as NVIDIA's:
    five layers of 1024, dropout 0.1).

    Attributes:
        deep_mlp: hidden widths of the deep tower (a final layer to one logit is added).
        dropout: dropout after each hidden layer of the deep tower.
    """

    deep_mlp: tuple[int, ...] = (1024, 1024, 1024, 1024, 1024)
    dropout: float = 0.1

    def validate(self) -> None:
        super().validate()
        if not self.deep_mlp or any(w < 1 for w in self.deep_mlp):
            raise ValueError(f"deep_mlp must be a non-empty list of positive widths, got {list(self.deep_mlp)}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must lie in [0, 1), got {self.dropout}")


# Wide & Deep's embeddings learn at 3e-3, which beat 1e-2 on most of the accuracy panel
# (docs/decisions/optimizers.md).
@register_model("wide_deep", WideDeepConfig, {**TRAIN_DEFAULTS, "embedding_lr": 3e-3})
class WideDeep(WideParameters, nn.Module):
    """Wide & Deep (Cheng et al., 2016) from a WideDeepConfig.

    Wide: one weight per id (dim-1 embeddings) summed over features, plus a linear map of the
    numerical features. Deep: [embeddings, numerical] through the MLP to one logit. The output is
    their sum (the click probability is its sigmoid). With B the batch, F the categorical features
    and N the numerical ones: numerical (B, N) float, categorical (B, F) int64, multi_hot (Fm
    features) or None -> logits (B,).
    """

    def __init__(self, config: WideDeepConfig, storage: TableStorage = IN_MEMORY):
        super().__init__()
        self.config = config
        self.dynamic_ids = dynamic_ids(config)  # raw ids -> rows of the dynamic features (None: none)
        self.numerical_norm = NumericalNormalizer(config.num_numerical)
        self.wide_embeddings, self.wide_dense, self.wide_buckets = LinearTerm.build(config, storage)
        self.embeddings = deep_embeddings(config, storage)
        width = self.embeddings.output_width + config.num_numerical
        self.deep = MLP(width, tuple(config.deep_mlp) + (1,), relu_last=False, dropout=config.dropout)

    @property
    def output_layer(self) -> nn.Linear:
        """The last linear layer (to the logit) of the deep part."""
        return self.deep[-1]

    def forward(self, numerical: torch.Tensor | None, categorical: torch.Tensor, multi_hot=None) -> torch.Tensor:
        categorical, numerical, raw = self.model_inputs(numerical, categorical)
        wide = self.wide_logit(numerical, categorical, multi_hot, raw)  # (B,)
        emb = self.embeddings(categorical, multi_hot).flatten(1)  # (B, F*D; the sum of the widths)
        if numerical is not None and self.config.num_numerical:
            emb = torch.cat([emb.to(numerical.dtype), numerical], 1)  # (B, F*D + N)
        return wide + self.deep(emb).squeeze(1).to(wide.dtype)  # (B,)
