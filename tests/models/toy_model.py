"""A fourth model, registered as ``toy`` when this module is imported: ``pytest -p tests.models.toy_model`` runs the
contract suite (tests/models/test_contract.py) over it beside the three built in, with no test edited."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ctrkit.models.dynamic import dynamic_ids
from ctrkit.models.inputs import TRAIN_DEFAULTS, InputsConfig, WideParameters, deep_embeddings
from ctrkit.models.numerical import NumericalNormalizer
from ctrkit.models.registry import register_model
from ctrkit.models.storage import IN_MEMORY, TableStorage


@dataclass(frozen=True)
class ToyConfig(InputsConfig):
    """The embeddings and numerical inputs through one hidden layer of ``hidden`` units."""

    hidden: int = 8


@register_model("toy", ToyConfig, TRAIN_DEFAULTS)
class Toy(WideParameters, nn.Module):
    """Embeddings and numerical inputs -> ReLU(hidden) -> one logit; no first-order term."""

    def __init__(self, config: ToyConfig, storage: TableStorage = IN_MEMORY):
        super().__init__()
        self.config = config
        self.dynamic_ids = dynamic_ids(config)
        self.numerical_norm = NumericalNormalizer(config.num_numerical)
        self.wide_embeddings = self.wide_dense = self.wide_buckets = None
        self.embeddings = deep_embeddings(config, storage)
        self.hidden = nn.Linear(self.embeddings.output_width + config.num_numerical, config.hidden)
        self.head = nn.Linear(config.hidden, 1)

    @property
    def output_layer(self) -> nn.Linear:
        return self.head

    def forward(self, numerical: torch.Tensor | None, categorical: torch.Tensor, multi_hot=None) -> torch.Tensor:
        if self.dynamic_ids is not None:
            categorical = self.dynamic_ids(categorical)
        numerical = self.numerical_norm(numerical)
        x = self.embeddings(categorical, multi_hot).flatten(1)
        if numerical is not None and self.config.num_numerical:
            x = torch.cat([x.to(numerical.dtype), numerical], 1)
        return self.head(torch.relu(self.hidden(x))).squeeze(1)
