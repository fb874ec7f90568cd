"""Synthetic click data in the Criteo shape, with a planted signal a model can learn.

Each categorical feature draws ids from a truncated power law (id 0 most frequent, as frequency-
ordered vocabularies are). The click log-odds are a sum of

* a per-id effect for each feature (what a wide/linear model can learn),
* dot products of per-id latent vectors for a fixed set of feature pairs (what DLRM's dot
  interaction is built for, and a linear model cannot see),
* a nonlinear function of a per-sample hidden state that the numerical features observe with noise,

shifted so the click rate is about 25%, like Criteo's. Labels are Bernoulli draws from those odds,
so the best achievable AUC is below 1; ``oracle_logits`` gives it for comparison.
"""

from __future__ import annotations

import gzip
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ctrkit.data.atomic import atomic_directory, atomic_file
from ctrkit.data.feature_spec import FeatureSpec
from ctrkit.data.spec_builders import criteo_like_spec
from ctrkit.data.split_binary import SplitBinaryWriter
from ctrkit.field_types import FRACTION
from ctrkit.progress import tqdm

# Criteo Kaggle's 26 table sizes, with the huge ones capped near 10^5 so the default model fits
# a laptop; from 3 to 200,000 rows.
CRITEO_LIKE_CARDINALITIES = (
    1460,
    583,
    200000,
    150000,
    305,
    24,
    12517,
    633,
    3,
    93145,
    5683,
    180000,
    3194,
    27,
    14992,
    160000,
    10,
    5652,
    2173,
    4,
    170000,
    18,
    15,
    120000,
    105,
    142572,
)


# Criteo 1TB's tables as the seeds train on them, after a frequency threshold of 15 (NVIDIA's "FL15", the
# setting that fits one GPU): 32.7M rows in all, 16.7 GB at width 128 in fp32
CRITEO_1TB_FL15_CARDINALITIES = (
    7912889, 33823, 17139, 7339, 20046, 4, 7105, 1382, 63, 5554114, 582469, 245828, 11, 2209, 10667, 104, 4, 968, 15,
    8165896, 2675940, 7156453, 302516, 12022, 97, 35,
)  # fmt: skip
# the same data's tables as MLPerf's DLRM trains on it, ids hashed to at most 40M rows a table: 187.8M rows in all
CRITEO_1TB_MLPERF_CARDINALITIES = (
    39884406, 39043, 17289, 7420, 20263, 3, 7120, 1543, 63, 38532951, 2953546, 403346, 10, 2208, 11938, 155, 4, 976,
    14, 39979771, 25641295, 39664984, 585935, 12972, 108, 36,
)  # fmt: skip
TABLE_PRESETS = {
    "criteo-kaggle-like": CRITEO_LIKE_CARDINALITIES,
    "criteo-1tb": CRITEO_1TB_FL15_CARDINALITIES,
    "criteo-1tb-mlperf": CRITEO_1TB_MLPERF_CARDINALITIES,
}


def power_law_ids(rng: np.random.Generator, cardinality: int, n: int, exponent: float) -> np.ndarray:
    """n ids in [0, cardinality) with P(id = k) roughly proportional to (k + 1) ** -exponent."""
    u = rng.random(n)
    if cardinality == 1:
        return np.zeros(n, dtype=np.int64)
    a = 1.0 - exponent  # inverse CDF of a continuous power law on [1, cardinality + 1)
    x = (1.0 + u * ((cardinality + 1.0) ** a - 1.0)) ** (1.0 / a)
    return np.minimum(x.astype(np.int64) - 1, cardinality - 1)


def bias_for_ctr(logits: np.ndarray, ctr: float) -> float:
    """The shift of ``logits`` whose mean click probability is ``ctr`` (bisection)."""
    lo, hi = -20.0, 20.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if np.mean(1.0 / (1.0 + np.exp(-(logits + mid)))) < ctr:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


@dataclass
class Block:
    numerical: np.ndarray  # (n, N) float32, log(count + 3), 0 where missing
    categorical: np.ndarray  # (n, F) int64
    logits: np.ndarray  # (n,) the true click log-odds
    labels: np.ndarray  # (n,) uint8
    counts: np.ndarray  # (n, N) int64 raw counts behind ``numerical``
    missing: np.ndarray  # (n, N) bool, numerical values that are missing


class SyntheticCTR:
    """A fixed random click model; ``sample`` draws i.i.d. rows from it.

    Args:
        cardinalities: table sizes of the categorical features.
        num_numerical: numerical features.
        seed: fixes the model (effects, latent vectors, pairs); sampling takes its own generator.
        exponent: power-law exponent of the id distributions.
        latent_dim: width of the planted latent vectors.
        num_pairs: interacting feature pairs.
        ctr: target click rate.
        effect_scale: upper bound of the per-feature spread of per-id effects (0: none).
        pair_scale: multiplier of the pairwise latent interactions (0: none).
        hidden_scale: multiplier of the effect of the hidden state the numerical features observe.
    """

    def __init__(
        self,
        cardinalities: Sequence[int] = CRITEO_LIKE_CARDINALITIES,
        num_numerical: int = 13,
        seed: int = 0,
        exponent: float = 1.2,
        latent_dim: int = 4,
        num_pairs: int = 12,
        ctr: float = 0.25,
        effect_scale: float = 0.6,
        pair_scale: float = 1.0,
        hidden_scale: float = 1.0,
    ):
        rng = np.random.default_rng([seed, 1])
        self.cardinalities = tuple(int(c) for c in cardinalities)
        self.num_numerical = num_numerical
        self.exponent = exponent
        nf = len(self.cardinalities)
        scales = rng.uniform(0.0, 1.0, nf) * effect_scale
        self.effects = [rng.normal(0.0, s, c).astype(np.float32) for s, c in zip(scales, self.cardinalities)]
        self.latents = [
            rng.normal(0.0, 1.0 / np.sqrt(latent_dim), (c, latent_dim)).astype(np.float32) for c in self.cardinalities
        ]
        pairs: set[tuple[int, int]] = set()
        while nf > 1 and len(pairs) < min(num_pairs, nf * (nf - 1) // 2):
            f, g = rng.choice(nf, 2, replace=False)
            pairs.add((int(min(f, g)), int(max(f, g))))
        self.pairs = sorted(pairs)
        self.pair_weight = 2.4 / np.sqrt(max(len(self.pairs), 1)) * pair_scale
        self.hidden_dim = 3
        self.num_loading = rng.normal(0.0, 1.0, (self.hidden_dim, num_numerical))
        self.num_offset = rng.uniform(0.0, 3.0, num_numerical)
        self.num_missing = rng.uniform(0.0, 0.4, num_numerical)
        self.hidden_weight = rng.normal(0.0, 0.5, self.hidden_dim) * hidden_scale
        self.hidden_scale = hidden_scale
        self.bias = 0.0
        pilot = self.sample(np.random.default_rng([seed, 2]), 50_000, labels=False).logits
        self.bias = bias_for_ctr(pilot, ctr)

    def sample(self, rng: np.random.Generator, n: int, labels: bool = True) -> Block:
        """Draws n rows."""
        cats = np.empty((n, len(self.cardinalities)), dtype=np.int64)  # (n, F)
        logits = np.full(n, self.bias, dtype=np.float64)
        for f, card in enumerate(self.cardinalities):
            cats[:, f] = power_law_ids(rng, card, n, self.exponent)
            logits += self.effects[f][cats[:, f]]
        for f, g in self.pairs:
            logits += self.pair_weight * np.einsum("nk,nk->n", self.latents[f][cats[:, f]], self.latents[g][cats[:, g]])
        hidden = rng.normal(0.0, 1.0, (n, self.hidden_dim))  # (n, H)
        logits += hidden @ self.hidden_weight + 0.8 * self.hidden_scale * np.maximum(hidden[:, 0] * hidden[:, 1], 0.0)
        # numerical features: noisy log-counts of the hidden state, like Criteo's log(x + 3) integers
        noise = rng.normal(0.0, 0.5, (n, self.num_numerical))
        counts = np.floor(np.exp(self.num_offset + 0.6 * hidden @ self.num_loading + noise)).astype(np.int64)
        numerical = np.log(counts + 3.0)
        missing = rng.random((n, self.num_numerical)) < self.num_missing
        numerical[missing] = 0.0  # missing -> 0
        y = (rng.random(n) < 1.0 / (1.0 + np.exp(-logits))).astype(np.uint8) if labels else np.zeros(n, np.uint8)
        return Block(numerical.astype(np.float32), cats, logits, y, counts, missing)


def generate_dataset(
    out_dir: str | os.PathLike,
    rows: int,
    cardinalities: Sequence[int] = CRITEO_LIKE_CARDINALITIES,
    num_numerical: int = 13,
    test_fraction: float = 0.1,
    seed: int = 0,
    chunk_rows: int = 1 << 18,
    overwrite: bool = False,
    progress: bool = True,
    click_model: SyntheticCTR | None = None,
) -> FeatureSpec:
    """Writes a split-binary dataset (``train``/``test`` mappings + feature_spec.yaml) to ``out_dir``.

    The data is written to a temporary directory beside ``out_dir`` and renamed into place at the
    end, so an interrupted run never leaves a directory that looks complete.

    Args:
        out_dir: the dataset directory to create.
        rows: total samples; ``test_fraction`` of them go to the ``test`` mapping.
        cardinalities: table sizes (default: the Criteo-like 26).
        num_numerical: numerical features (default 13).
        test_fraction: share of rows in the test mapping.
        seed: fixes the click model and the samples.
        chunk_rows: rows generated per block (bounds memory).
        overwrite: replace an existing dataset at ``out_dir``.
        progress: show a progress bar.
        click_model: the click model to sample from (default: ``SyntheticCTR(cardinalities,
            num_numerical, seed)``; its cardinalities and numerical count then take precedence).
    """
    if rows < 2:
        raise ValueError(f"`rows` must be at least 2, got {rows}")
    FRACTION.check("test_fraction", test_fraction, integer=False)
    # the files' bytes a row, at most (float16 numbers, a label byte, ids of at most 4 bytes): checked against the free
    # space before anything is written, so a count of rows no disk holds is refused at once
    model = click_model or SyntheticCTR(cardinalities, num_numerical, seed)
    num_numerical = model.num_numerical
    row_bytes = 2 * num_numerical + 1 + 4 * len(model.cardinalities)
    with atomic_directory(out_dir, overwrite, needs=rows * row_bytes) as tmp:
        spec = criteo_like_spec(model.cardinalities, num_numerical)
        spec = FeatureSpec(
            spec.feature_spec,
            spec.source_spec,
            spec.channel_spec,
            {"generator": "ctrkit synth", "seed": seed, "rows": rows},
            tmp,
        )
        n_test = max(1, int(round(rows * test_fraction)))
        rng = np.random.default_rng([seed, 3])
        with tqdm(total=rows, desc="synth", unit="row", unit_scale=True, disable=not progress) as bar:
            for mapping, n in (("train", rows - n_test), ("test", n_test)):
                with SplitBinaryWriter(spec, mapping) as writer:
                    done = 0
                    while done < n:
                        block = model.sample(rng, min(chunk_rows, n - done))
                        writer.append(block.numerical, block.categorical, block.labels)
                        done += len(block.labels)
                        bar.update(len(block.labels))
        spec.to_yaml(tmp / "feature_spec.yaml")
    return FeatureSpec.from_yaml(Path(out_dir) / "feature_spec.yaml")


def write_criteo_tsv(
    out_file: str | os.PathLike,
    rows: int,
    cardinalities: Sequence[int] = CRITEO_LIKE_CARDINALITIES,
    num_numerical: int = 13,
    seed: int = 0,
    chunk_rows: int = 1 << 17,
    overwrite: bool = False,
    progress: bool = True,
) -> Path:
    """Writes raw Criteo-format TSV: label, ``num_numerical`` integer and ``len(cardinalities)`` hashed
    categorical columns per line, empty fields for missing values (``.gz`` names are gzipped).

    The rows come from the same click model as ``generate_dataset`` (power-law ids, planted signal).
    Each categorical id becomes an 8-hex-digit "hash" through a fixed bijection per column; each
    column misses values at its own rate (0-30% for categoricals); the second integer column also
    holds Criteo's small negative values (-1..-3) in about 5% of rows. Written to a temporary file
    and renamed, so an interrupted run leaves no complete-looking file.
    """
    if rows < 1:
        raise ValueError(f"`rows` must be positive, got {rows}")
    out = Path(out_file)
    if out.exists() and not overwrite:
        raise ValueError(f"{out}: file exists; set `overwrite` to replace it")
    out.parent.mkdir(parents=True, exist_ok=True)
    model = SyntheticCTR(cardinalities, num_numerical, seed)
    rng = np.random.default_rng([seed, 4])
    nf = len(model.cardinalities)
    mult = rng.integers(0, 2**31, nf, dtype=np.uint64) * 2 + 1  # odd: a bijection modulo 2^32
    shift = rng.integers(0, 2**32, nf, dtype=np.uint64)
    cat_missing = rng.uniform(0.0, 0.3, nf)
    with atomic_file(out) as tmp:
        opener = gzip.open if out.suffix == ".gz" else open
        with (
            opener(tmp, "wt") as f,
            tqdm(total=rows, desc="synth criteo", unit="row", unit_scale=True, disable=not progress) as bar,
        ):
            done = 0
            while done < rows:
                n = min(chunk_rows, rows - done)
                block = model.sample(rng, n)
                columns = [block.labels.astype(str)]
                ints = block.counts.copy()
                if num_numerical > 1:
                    negative = rng.random(n) < 0.05
                    ints[negative, 1] = -rng.integers(1, 4, int(negative.sum()))
                for j in range(num_numerical):
                    columns.append(np.where(block.missing[:, j], "", ints[:, j].astype(str)))
                for j in range(nf):
                    hashed = (block.categorical[:, j].astype(np.uint64) * mult[j] + shift[j]) % np.uint64(2**32)
                    hexed = np.char.mod("%08x", hashed)
                    columns.append(np.where(rng.random(n) < cat_missing[j], "", hexed))
                f.write("".join("\t".join(fields) + "\n" for fields in zip(*columns)))
                done += n
                bar.update(n)
    return out
