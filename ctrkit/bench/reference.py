"""The reachable reference of the planted family: the generator's own model form, told which feature pairs interact,
fitted on the training rows the models train on.

``synth planted`` draws click log-odds as a bias, one effect per frequent id of every feature, a latent product
``<v_f[id_f], v_g[id_g]>`` for each interacting pair (f, g) (one latent vector per id and feature, shared by the
pairs the feature is in) and a function of a hidden state that the numerical features observe through noisy counts.
Its Bayes AUC ranks the rows by the true odds, which no learner of the columns reaches; ``observable_test_auc`` knows
every effect's value. What a learner that knows the structure reaches from the rows is this fit:

* the same form: a bias, a 1-wide table per feature, a ``latent_dim``-wide table per feature that is in a pair and a
  learned scale per pair, plus a small MLP (two layers of ``HIDDEN``) of the standardised numerical features for the
  hidden state's term;
* fitted by Adam (``LR``, batches of ``BATCH``) on the binary log loss plus an L2 penalty on every table row (a
  Gaussian prior: an id with many rows is held as they say, a rare one stays near 0), with early stopping on the
  validation AUC (evaluated each epoch, stopped after ``PATIENCE`` epochs without a gain, at most ``EPOCHS``);
* the L2 strength chosen from ``L2_GRID`` by validation AUC; the test rows scored once, by the chosen fit.

Its budget: ``len(L2_GRID)`` fits of at most ``EPOCHS`` epochs each. The accuracy panel reads a model's test AUC as
its share of the gap from logistic regression to this fit.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from ctrkit.eval.baselines import Table, read_table
from ctrkit.metrics import log_loss_from_logits, roc_auc

HIDDEN = 32  # width of the numerical MLP's two layers
LR = 3e-3
BATCH = 1024
EPOCHS = 30  # at most, per fit
PATIENCE = 2  # epochs without a validation AUC gain before a fit stops
# the tables' L2 (a Gaussian prior on every row, added to the log loss summed over the training rows): chosen on
# validation among these (at 360k planted rows: 10 -> 0.7986, 30 -> 0.7993, 100 -> 0.7949 test AUC; 1 -> 0.7921)
L2_GRID = (10.0, 30.0, 100.0)
INIT_SCALE = 0.1  # standard deviation of the latent tables' start


class PlantedForm(nn.Module):
    """The planted click model's form: numerical (B, N) float, categorical (B, F) int64 -> logits (B,)."""

    def __init__(self, cardinalities: Sequence[int], pairs: Sequence[tuple[int, int]], latent_dim: int,
                 num_numerical: int):  # fmt: skip
        super().__init__()
        self.pairs = [(int(f), int(g)) for f, g in pairs]
        self.bias = nn.Parameter(torch.zeros(()))
        self.effects = nn.ModuleList(nn.Embedding(c, 1) for c in cardinalities)
        for table in self.effects:
            nn.init.zeros_(table.weight)
        self.in_pairs = sorted({f for pair in self.pairs for f in pair})
        self.latents = nn.ModuleDict({str(f): nn.Embedding(cardinalities[f], latent_dim) for f in self.in_pairs})
        for table in self.latents.values():
            nn.init.normal_(table.weight, std=INIT_SCALE)
        self.pair_scale = nn.Parameter(torch.ones(len(self.pairs)))
        self.numeric = (
            nn.Sequential(
                nn.Linear(num_numerical, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, 1)
            )  # fmt: skip
            if num_numerical
            else None
        )

    def forward(self, numerical: torch.Tensor, categorical: torch.Tensor) -> torch.Tensor:
        """Logits (B,)."""
        looked = [table(categorical[:, f]) for f, table in enumerate(self.effects)]  # (B, 1) each
        vectors = {f: self.latents[str(f)](categorical[:, f]) for f in self.in_pairs}  # (B, k) each
        logits = self.bias + torch.cat(looked, 1).sum(1)
        if self.pairs:
            products = torch.stack([(vectors[f] * vectors[g]).sum(1) for f, g in self.pairs], 1)  # (B, pairs)
            logits = logits + products @ self.pair_scale
        if self.numeric is not None:
            logits = logits + self.numeric(numerical).squeeze(1)
        return logits


def _tensors(t: Table, mean: np.ndarray, sd: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    numerical = torch.from_numpy(((t.numerical.astype(np.float32) - mean) / sd).astype(np.float32))
    return numerical, torch.from_numpy(t.categorical.astype(np.int64)), torch.from_numpy(t.labels.astype(np.float32))


@torch.no_grad()
def _logits(model: PlantedForm, numerical: torch.Tensor, categorical: torch.Tensor) -> np.ndarray:
    model.eval()
    out = [model(numerical[a : a + 65536], categorical[a : a + 65536]) for a in range(0, len(categorical), 65536)]
    model.train()
    return torch.cat(out).double().numpy()


def _fit(train, validation, form: dict[str, Any], l2: float, seed: int) -> tuple[PlantedForm, float, int]:
    """One fit with early stopping: (the best epoch's model, its validation AUC, epochs run)."""
    torch.manual_seed(seed)
    model = PlantedForm(**form)
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    generator = torch.Generator().manual_seed(seed)
    numerical, categorical, labels = train
    best, best_state, since, epochs = -1.0, None, 0, 0
    loss_fn = nn.BCEWithLogitsLoss()
    tables = [*model.effects, *model.latents.values()]
    for epoch in range(EPOCHS):
        order = torch.randperm(len(labels), generator=generator)
        for a in range(0, len(order), BATCH):
            rows = order[a : a + BATCH]
            logits = model(numerical[rows], categorical[rows])
            prior = sum((t.weight * t.weight).sum() for t in tables)  # the tables' Gaussian prior, whole
            loss = loss_fn(logits, labels[rows]) + l2 * prior / len(labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        epochs = epoch + 1
        auc = roc_auc(validation[2].numpy(), _logits(model, validation[0], validation[1]))
        if auc > best:
            best, since = auc, 0
            best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        else:
            since += 1
            if since >= PATIENCE:
                break
    model.load_state_dict(best_state)
    return model, best, epochs


def fitted_reference(train, validation, test) -> dict[str, Any] | None:
    """The planted form fitted on ``train`` (datasets as the trainer reads them, ``eval.baselines.read_table``),
    early-stopped and its L2 chosen on ``validation``, scored on ``test``; None where the data set records no
    planted structure (its spec's metadata lacks ``pairs``)."""
    meta = train.spec.metadata
    if "pairs" not in meta:
        return None
    start = time.perf_counter()
    tr, va, te = read_table(train), read_table(validation), read_table(test)
    mean = tr.numerical.mean(0) if tr.numerical.shape[1] else np.zeros(0, np.float32)
    sd = tr.numerical.std(0) + 1e-6 if tr.numerical.shape[1] else np.ones(0, np.float32)
    sets = [_tensors(t, mean, sd) for t in (tr, va, te)]
    form = {"cardinalities": list(train.spec.cardinalities), "pairs": [tuple(p) for p in meta["pairs"]],
            "latent_dim": int(meta["latent_dim"]), "num_numerical": tr.numerical.shape[1]}  # fmt: skip
    fits = {l2: _fit(sets[0], sets[1], form, l2, seed=0) for l2 in L2_GRID}
    l2 = max(fits, key=lambda k: fits[k][1])
    model, validation_auc, epochs = fits[l2]
    logits = _logits(model, sets[2][0], sets[2][1])
    labels = te.labels
    return {"auc": roc_auc(labels, logits), "logloss": log_loss_from_logits(labels, logits),
            "validation_auc": validation_auc, "chosen": {"l2": l2, "epochs": epochs},
            "seconds": time.perf_counter() - start}  # fmt: skip
