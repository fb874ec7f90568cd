"""Synthetic click data with a known best achievable AUC, for measuring models against baselines.

A click model unlike ``ctrkit synth``'s (whose planted odds the defaults were once tuned on):
categorical ids follow long-tailed power laws over vocabularies of 5 to 200,000 ids, and only the
frequent ids carry signal (the rare ones are noise a model can overfit to, as hashed ids in real logs
are). The click log-odds are a sum of

* first-order per-id effects of the frequent ids (what logistic regression can learn),
* pairwise latent interactions between the frequent ids of a set of feature pairs (what it cannot),
* a nonlinear function of a hidden state that a few numerical features observe with noise,

shifted to a 20% click rate. Labels are Bernoulli draws, so the true log-odds rank the test rows at
the Bayes-optimal AUC, which the dataset's metadata records (``bayes_test_auc``). The hidden state is seen only
through noisy counts, so no model of the columns reaches that AUC: the metadata also records the best any can
(``observable_test_auc``), each row's click probability given what it holds, with every effect known.

``PlantedTabular`` is a second family, where the signal is mostly in the numerical features, as in
tabular logs with prices, positions or times: standard-normal features whose log-odds terms are a
step, a periodic function, a product of two features and a hinge, plus per-id effects of a few
long-tailed categorical features and one numerical x categorical interaction (what gradient-boosted
trees find easily and logistic regression cannot).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ctrkit.data.atomic import atomic_directory
from ctrkit.data.feature_spec import FeatureSpec
from ctrkit.data.spec_builders import criteo_like_spec
from ctrkit.data.split_binary import SplitBinaryWriter
from ctrkit.data.synthetic import Block, bias_for_ctr, power_law_ids
from ctrkit.field_types import FRACTION
from ctrkit.progress import tqdm

PLANTED_CARDINALITIES = (5, 12, 40, 100, 300, 800, 2_000, 5_000, 10_000, 20_000, 50_000, 100_000, 200_000, 30, 3_000,
                         60_000, 7, 500, 15_000, 150_000)  # fmt: skip


class PlantedCTR:
    """A fixed random click model with signal on frequent ids only; ``sample`` draws i.i.d. rows.

    Args:
        cardinalities: vocabulary sizes of the categorical features.
        num_numerical: numerical features.
        seed: fixes the model.
        head_share: the share of a vocabulary (at least 3 ids, at most 2,000) whose ids carry signal:
            the most frequent ones.
        num_pairs: interacting feature pairs.
        latent_dim: width of the planted latent vectors.
        interaction_scale: multiplier of the pairwise interactions.
        ctr: target click rate.
    """

    # numerical feature j is log(count_j + 3), count_j = floor(exp(COUNT_SHIFT + COUNT_SCALE * (hidden_j + noise_j))),
    # noise_j ~ N(0, COUNT_NOISE^2)
    COUNT_SHIFT, COUNT_SCALE, COUNT_NOISE = 1.5, 0.8, 0.4

    def __init__(
        self,
        cardinalities: Sequence[int] = PLANTED_CARDINALITIES,
        num_numerical: int = 6,
        seed: int = 0,
        head_share: float = 0.05,
        num_pairs: int = 16,
        latent_dim: int = 4,
        interaction_scale: float = 1.0,
        ctr: float = 0.2,
    ):
        rng = np.random.default_rng([seed, 101])
        self.cardinalities = tuple(int(c) for c in cardinalities)
        self.num_numerical = num_numerical
        nf = len(self.cardinalities)
        self.exponents = rng.uniform(1.05, 1.35, nf)
        self.heads = [int(np.clip(round(c * head_share), min(3, c), 2_000)) for c in self.cardinalities]
        spread = rng.uniform(0.1, 0.6, nf)
        self.effects = [np.zeros(c, np.float32) for c in self.cardinalities]
        self.latents = [np.zeros((c, latent_dim), np.float32) for c in self.cardinalities]
        for f, head in enumerate(self.heads):
            self.effects[f][:head] = rng.normal(0.0, spread[f], head)
            self.latents[f][:head] = rng.normal(0.0, 1.0 / np.sqrt(latent_dim), (head, latent_dim))
        pairs: set[tuple[int, int]] = set()
        while nf > 1 and len(pairs) < min(num_pairs, nf * (nf - 1) // 2):
            f, g = sorted(int(x) for x in rng.choice(nf, 2, replace=False))
            pairs.add((f, g))
        self.pairs = sorted(pairs)
        self.pair_weight = 2.0 * interaction_scale / np.sqrt(max(len(self.pairs), 1))
        self.num_weight = rng.normal(0.0, 0.4, num_numerical)
        self.bias = 0.0
        pilot = self.sample(np.random.default_rng([seed, 102]), 50_000, labels=False).logits
        self.bias = bias_for_ctr(pilot, ctr)

    def sample(self, rng: np.random.Generator, n: int, labels: bool = True) -> Block:
        """Draws n rows (the true log-odds in ``logits``)."""
        cats = np.empty((n, len(self.cardinalities)), dtype=np.int64)  # (n, F)
        for f, card in enumerate(self.cardinalities):
            cats[:, f] = power_law_ids(rng, card, n, self.exponents[f])
        logits = self.id_logits(cats)
        hidden = rng.normal(0.0, 1.0, (n, self.num_numerical))  # (n, N)
        if self.num_numerical:
            logits += self._hidden_effect(hidden)
        seen = hidden + rng.normal(0.0, self.COUNT_NOISE, hidden.shape)
        counts = np.floor(np.exp(self.COUNT_SHIFT + self.COUNT_SCALE * seen)).astype(np.int64)
        numerical = np.log(counts + 3.0).astype(np.float32)  # as the Criteo recipe transforms counts
        y = (rng.random(n) < 1 / (1 + np.exp(-logits))).astype(np.uint8) if labels else np.zeros(n, np.uint8)
        return Block(numerical, cats, logits, y, counts, np.zeros_like(counts, dtype=bool))

    def id_logits(self, cats: np.ndarray) -> np.ndarray:
        """The bias plus the ids' log-odds terms (per-id effects, the pairs' latent products), (n, F) -> (n,)."""
        logits = np.full(len(cats), self.bias, dtype=np.float64)
        for f in range(len(self.cardinalities)):
            logits += self.effects[f][cats[:, f]]
        for f, g in self.pairs:
            logits += self.pair_weight * np.einsum("nk,nk->n", self.latents[f][cats[:, f]], self.latents[g][cats[:, g]])
        return logits

    def _hidden_effect(self, hidden: np.ndarray) -> np.ndarray:
        """The log-odds term of the hidden state, (..., N) -> (...)."""
        return hidden @ self.num_weight + 0.5 * np.tanh(2.0 * hidden[..., 0]) * hidden[..., -1]

    def observable_probability(self, block: Block, rng: np.random.Generator, draws: int = 256) -> np.ndarray:
        """Each row's click probability given what it holds (ids and counts), every effect of the model known: the
        best prediction any model of the columns can make. The hidden state is integrated over its posterior
        given the counts by Monte Carlo (``draws`` a row): a count fixes an interval of hidden + noise, drawn
        from its truncated normal, then the hidden state given that sum."""
        import torch

        n = len(block.labels)
        known = self.id_logits(block.categorical)
        if not self.num_numerical:
            return 1.0 / (1.0 + np.exp(-known))
        seen_var = 1.0 + self.COUNT_NOISE**2  # hidden ~ N(0, 1), seen = hidden + noise
        sd = np.sqrt(seen_var)
        counts = torch.from_numpy(block.counts.astype(np.float64))  # (n, N)
        # the count's interval of hidden + noise, as the normal CDF of hidden + noise at its ends
        first = torch.where(counts > 0, (counts.log() - self.COUNT_SHIFT) / self.COUNT_SCALE, -torch.inf)
        past = ((counts + 1.0).log() - self.COUNT_SHIFT) / self.COUNT_SCALE
        cdf_low, cdf_high = torch.special.ndtr(first / sd).numpy(), torch.special.ndtr(past / sd).numpy()
        out = np.empty(n)
        chunk = max(1, (1 << 21) // (self.num_numerical * draws))
        for lo in range(0, n, chunk):
            part = slice(lo, lo + chunk)
            low, high = cdf_low[part, :, None], cdf_high[part, :, None]
            u = np.clip(low + (high - low) * rng.random((len(out[part]), self.num_numerical, draws)), 1e-300, 1 - 1e-16)
            seen = sd * torch.special.ndtri(torch.from_numpy(u)).numpy()  # (n, N, draws), within each count's interval
            hidden = seen / seen_var + np.sqrt(1.0 - 1.0 / seen_var) * rng.standard_normal(seen.shape)
            logits = known[part, None] + self._hidden_effect(np.moveaxis(hidden, 1, -1))  # (n, draws)
            out[part] = (1.0 / (1.0 + np.exp(-logits))).mean(1)
        return out


TABULAR_CARDINALITIES = (1_000, 200, 50, 10)


class PlantedTabular:
    """A fixed random click model whose signal is mostly nonlinear in the numerical features.

    Log-odds: ``a0 * (|x0| > 1) + a1 * sin(2 x1) + a2 * x2 * x3 + a4 * max(x4, 0) + a5 * (x5 > 0.5) *
    [the last categorical id is even]`` plus a N(0, 0.5) effect per id of every categorical feature
    (ids drawn from power laws), shifted to a 25% click rate; each ``a`` is drawn from the seed.

    Args:
        cardinalities: vocabulary sizes of the categorical features (at least one).
        seed: fixes the model.
        ctr: target click rate.
    """

    num_numerical = 6

    def __init__(self, cardinalities: Sequence[int] = TABULAR_CARDINALITIES, seed: int = 0, ctr: float = 0.25):
        if not cardinalities:
            raise ValueError("`cardinalities`: expected at least one categorical feature")
        rng = np.random.default_rng([seed, 201])
        self.cardinalities = tuple(int(c) for c in cardinalities)
        self.exponents = rng.uniform(1.1, 1.4, len(self.cardinalities))
        self.effects = [rng.normal(0.0, 0.5, c).astype(np.float32) for c in self.cardinalities]
        self.weights = rng.uniform(0.6, 1.4, 6) * np.array([1.2, 1.0, 0.6, 0.4, 1.0, 0.8])
        self.bias = 0.0
        pilot = self.sample(np.random.default_rng([seed, 202]), 50_000, labels=False).logits
        self.bias = bias_for_ctr(pilot, ctr)

    def sample(self, rng: np.random.Generator, n: int, labels: bool = True) -> Block:
        """Draws n rows (the true log-odds in ``logits``)."""
        x = rng.normal(0.0, 1.0, (n, self.num_numerical))  # (n, 6)
        cats = np.stack([power_law_ids(rng, c, n, e) for c, e in zip(self.cardinalities, self.exponents)], 1)
        a = self.weights  # a[3] is drawn and unused: kept so that each seed's data stay as benchmarked
        logits = self.bias + a[0] * (np.abs(x[:, 0]) > 1) + a[1] * np.sin(2 * x[:, 1]) + a[2] * x[:, 2] * x[:, 3]
        logits = logits + a[4] * np.maximum(x[:, 4], 0.0) + a[5] * (x[:, 5] > 0.5) * (cats[:, -1] % 2 == 0)
        for f in range(len(self.cardinalities)):
            logits = logits + self.effects[f][cats[:, f]]
        y = (rng.random(n) < 1 / (1 + np.exp(-logits))).astype(np.uint8) if labels else np.zeros(n, np.uint8)
        zeros = np.zeros((n, self.num_numerical), np.int64)
        return Block(x.astype(np.float32), cats.astype(np.int64), logits, y, zeros, zeros.astype(bool))


def generate_planted(
    out_dir: str | os.PathLike,
    rows: int,
    test_fraction: float = 1 / 6,
    seed: int = 0,
    overwrite: bool = False,
    progress: bool = True,
    chunk_rows: int = 1 << 18,
    family: str = "interactions",
    **model_options,
) -> FeatureSpec:
    """Writes ``rows`` samples of a PlantedCTR as a split-binary dataset (train, then test), with the
    test rows' Bayes-optimal AUC in the spec's metadata.

    Args:
        out_dir: the dataset directory to create.
        rows: train + test samples.
        test_fraction: share of the rows in the test mapping.
        seed: fixes the model and the samples.
        overwrite: replace an existing dataset at ``out_dir``.
        progress: show a progress bar.
        chunk_rows: rows generated per block (bounds memory).
        family: "interactions" (``PlantedCTR``), "tabular" (``PlantedTabular``) or "amounts"
            (``PlantedAmounts``).
        model_options: the model's other arguments.
    """
    from ctrkit.metrics import roc_auc

    if rows < 2:
        raise ValueError(f"`rows` must be at least 2, got {rows}")
    FRACTION.check("test_fraction", test_fraction, integer=False)
    if family not in FAMILIES:
        raise ValueError(f"`family`: expected {' or '.join(FAMILIES)}, got {family!r}")
    model = FAMILIES[family](seed=seed, **model_options)
    n_test = max(1, int(round(rows * test_fraction)))
    rng = np.random.default_rng([seed, 103 if family == "interactions" else 203])
    with atomic_directory(out_dir, overwrite) as tmp:
        base = criteo_like_spec(
            model.cardinalities, model.num_numerical, numerical_dtype=getattr(model, "numerical_dtype", "float16")
        )
        spec = FeatureSpec(base.feature_spec, base.source_spec, base.channel_spec, {}, tmp)
        test_labels, test_logits, test_observable = [], [], []
        # where the columns show only part of the click model: the best AUC of any model of them
        observable = getattr(model, "observable_probability", None)
        observable_rng = np.random.default_rng([seed, 104])  # its own draws: the rows stay those of the seed
        with tqdm(
            total=rows, desc=f"synth {GENERATORS[family]}", unit="row", unit_scale=True, disable=not progress
        ) as bar:
            for mapping, n in (("train", rows - n_test), ("test", n_test)):
                with SplitBinaryWriter(spec, mapping) as writer:
                    for lo in range(0, n, chunk_rows):
                        block = model.sample(rng, min(chunk_rows, n - lo))
                        writer.append(block.numerical, block.categorical, block.labels)
                        if mapping == "test":
                            test_labels.append(block.labels)
                            test_logits.append(block.logits)
                            if observable is not None:
                                test_observable.append(observable(block, observable_rng))
                        bar.update(len(block.labels))
        labels = np.concatenate(test_labels)
        meta = {
            "generator": f"ctrkit synth {GENERATORS[family]}",
            "seed": seed,
            "rows": rows,
            "bayes_test_auc": round(roc_auc(labels, np.concatenate(test_logits)), 6),
        }
        if observable is not None:
            meta["observable_test_auc"] = round(roc_auc(labels, np.concatenate(test_observable)), 6)
        if hasattr(model, "pairs"):  # the form's structure, for the fitted reference (``bench.reference``)
            meta["pairs"] = [list(p) for p in model.pairs]
            meta["latent_dim"] = int(model.latents[0].shape[1])
        spec = FeatureSpec(spec.feature_spec, spec.source_spec, spec.channel_spec, meta, tmp)
        spec.to_yaml(tmp / "feature_spec.yaml")
    return FeatureSpec.from_yaml(Path(out_dir) / "feature_spec.yaml")


class PlantedAmounts(PlantedTabular):
    """``PlantedTabular``'s click model with its numerical features written as raw amounts, as prices,
    counts or durations come: feature j is ``exp(1.5 x_j) * 10**j`` (heavy-tailed, from about 1 to 1e5
    and beyond), float32. Every transform is monotone, so trees and the Bayes AUC are unchanged; a model
    that feeds the values straight into an MLP is not."""

    numerical_dtype = "float32"

    def sample(self, rng: np.random.Generator, n: int, labels: bool = True) -> Block:
        block = super().sample(rng, n, labels)
        scale = 10.0 ** np.arange(self.num_numerical)
        amounts = (np.exp(1.5 * block.numerical.astype(np.float64)) * scale).astype(np.float32)
        return dataclasses.replace(block, numerical=amounts)


FAMILIES = {"interactions": PlantedCTR, "tabular": PlantedTabular, "amounts": PlantedAmounts}
# the `ctrkit synth` kind of each
GENERATORS = {"interactions": "planted", "tabular": "planted-tabular", "amounts": "planted-amounts"}
