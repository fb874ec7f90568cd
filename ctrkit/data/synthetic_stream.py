"""A drifting stream of click logs, day by day, with raw 64-bit ids: what dynamic tables are measured on.

``write_stream(out, days)`` writes ``out/day_1`` ... ``out/day_N``, each a split-binary dataset (``train``,
``validation``, ``test``) in the Criteo shape whose categorical features are *dynamic* (raw 64-bit ids, a table of
``capacity`` rows each), and ``out/day_k/truth/<mapping>.f32``: every row's true click probability.

Each feature has a universe of ids, each with a random 64-bit name, a birth day, a base popularity (a power law
within its cohort) and an effect on the click log-odds. On day d an id born on day b is drawn with weight
``popularity x 2^-((d - b) / half_life)``: ids fade, and every day ``churn`` x (the feature's vocabulary) new ids
are born, as new ads, users and pages are. Features with fewer than ``STABLE_BELOW`` ids (devices, countries) keep
theirs. Some ids' effects drift: a per-id trend adds to the log-odds day by day. Feature pairs interact through
per-id latent vectors, and the numerical features observe a hidden per-row state with a nonlinear effect, as
``synthetic.SyntheticCTR``'s.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ctrkit.data.atomic import atomic_directory
from ctrkit.data.feature_spec import Feature, FeatureSpec, check_capacity
from ctrkit.data.spec_builders import split_binary_spec
from ctrkit.data.split_binary import SplitBinaryWriter
from ctrkit.metrics import roc_auc
from ctrkit.progress import tqdm

# ids alive on a day per feature: a Criteo-like mix of small and large vocabularies
STREAM_VOCABULARIES = (1000, 500, 40000, 30000, 300, 24, 8000, 600, 3, 20000, 4000, 36000, 2000, 27, 10000, 32000,
                       10, 4000, 1500, 4, 34000, 18, 15, 24000, 100, 28000)  # fmt: skip
STABLE_BELOW = 200  # features with fewer ids neither churn nor fade
MAPPINGS = (("train", 0.8), ("validation", 0.1), ("test", 0.1))


def _logistic(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


class DriftingStream:
    """The stream's click model (fixed by ``seed``); ``sample(day, rows, rng)`` draws one day's rows.

    Args:
        vocabularies: ids alive on a day, per categorical feature.
        days: days of the stream.
        churn: new ids born each day, a share of the feature's vocabulary.
        half_life: days in which an id's popularity halves.
        drift: spread of the per-day trend of the drifting ids' effects (log-odds a day).
        num_numerical: numerical features.
    """

    def __init__(self, vocabularies: Sequence[int] = STREAM_VOCABULARIES, days: int = 7, seed: int = 0,
                 churn: float = 0.3, half_life: float = 1.5, drift: float = 0.1, num_numerical: int = 13,
                 exponent: float = 1.1, latent_dim: int = 4, num_pairs: int = 10, ctr: float = 0.25):  # fmt: skip
        rng = np.random.default_rng([seed, 57])
        self.vocabularies, self.days, self.half_life = tuple(int(v) for v in vocabularies), days, half_life
        self.num_numerical, self.exponent = num_numerical, exponent
        self.names, self.birth, self.popularity, self.effect, self.trend, self.latent = [], [], [], [], [], []
        for v in self.vocabularies:
            stable = v < STABLE_BELOW
            per_day = 0 if stable else max(1, int(round(churn * v)))
            total = v + per_day * (days - 1)
            self.names.append(rng.integers(-(2**63), 2**63 - 1, size=total, dtype=np.int64))
            self.birth.append(np.concatenate([np.zeros(v, np.int64), 1 + np.arange(total - v) // max(per_day, 1)]))
            ranks = np.concatenate([rng.permutation(v), rng.permutation(total - v) % max(per_day, 1)])
            self.popularity.append((ranks + 1.0) ** -exponent)
            self.effect.append(rng.normal(0.0, rng.uniform(0.05, 0.4), total))
            drifting = rng.random(total) < 0.3
            self.trend.append(np.where(drifting, rng.normal(0.0, drift, total), 0.0))
            self.latent.append(rng.normal(0.0, 1.0 / np.sqrt(latent_dim), (total, latent_dim)))
            if stable:
                self.birth[-1][:] = -(10**6)  # never fades
        nf = len(self.vocabularies)
        pairs: set[tuple[int, int]] = set()
        while nf > 1 and len(pairs) < min(num_pairs, nf * (nf - 1) // 2):
            a, b = sorted(rng.choice(nf, 2, replace=False).tolist())
            pairs.add((a, b))
        self.pairs = sorted(pairs)
        self.loadings = rng.normal(0.0, 1.0, (3, num_numerical))
        self.bias = float(np.log(ctr / (1 - ctr)))

    def sample(self, day: int, rows: int, rng: np.random.Generator):
        """Day ``day``'s (1-based) rows: numerical (rows, N) float32, raw ids (rows, F) int64, labels, and the true
        click probabilities."""
        d = day - 1
        idx = []
        for f in range(len(self.vocabularies)):
            alive = np.flatnonzero(self.birth[f] <= d)
            age = d - np.maximum(self.birth[f][alive], 0) if self.vocabularies[f] >= STABLE_BELOW else 0 * alive
            w = self.popularity[f][alive] * np.exp2(-age / self.half_life)
            idx.append(alive[rng.choice(len(alive), size=rows, p=w / w.sum())])
        logit = np.full(rows, self.bias)
        for f, k in enumerate(idx):
            age = d - np.maximum(self.birth[f][k], 0)
            logit += self.effect[f][k] + self.trend[f][k] * age
        for a, b in self.pairs:
            logit += (self.latent[a][idx[a]] * self.latent[b][idx[b]]).sum(1)
        hidden = rng.normal(size=(rows, 3))
        logit += np.sin(2 * hidden[:, 0]) + 0.5 * hidden[:, 1] * hidden[:, 2]
        numerical = (hidden @ self.loadings + rng.normal(0, 0.5, (rows, self.num_numerical))).astype(np.float32)
        p = _logistic(logit)
        labels = (rng.random(rows) < p).astype(np.int8)
        ids = np.stack([self.names[f][k] for f, k in enumerate(idx)], 1)
        return numerical, ids, labels, p.astype(np.float32)


def stream_spec(capacities: Sequence[int], num_numerical: int, metadata: dict) -> FeatureSpec:
    """The spec of one day: dynamic int64 features ``cat_i`` with tables of ``capacities[i]`` rows."""
    categorical = {f"cat_{i}.bin": Feature("int64", int(c), {"dynamic": True}) for i, c in enumerate(capacities)}
    names = [f"num_{i}" for i in range(num_numerical)]
    return split_binary_spec(categorical, names, "label", [m for m, _ in MAPPINGS], metadata,
                             numerical_dtype="float32")  # fmt: skip


def write_stream(out: str | os.PathLike, days: int, rows: int, vocabularies: Sequence[int] = STREAM_VOCABULARIES,
                 capacity: float = 1.0, seed: int = 0, overwrite: bool = False, progress: bool = True,
                 num_numerical: int = 13) -> list[Path]:  # fmt: skip
    """Writes ``days`` days of ``rows`` rows each (80% train, 10% validation, 10% test) under ``out``; each dynamic
    table holds ``capacity`` x the feature's vocabulary rows (at least 2). Returns the day directories."""
    if days < 1 or rows < 30:
        raise ValueError(f"a stream needs at least 1 day of at least 30 rows, got {days} days of {rows}")
    if not 0 < capacity < float("inf"):
        raise ValueError(f"`capacity` must be a positive share of each feature's vocabulary, got {capacity}")
    model = DriftingStream(vocabularies, days, seed, num_numerical=num_numerical)
    capacities = [max(2, int(round(capacity * v)) + 1) for v in model.vocabularies]
    for v, table_rows in zip(model.vocabularies, capacities):
        check_capacity(table_rows, f"`capacity` {capacity:g} x a vocabulary of {v:,} ids")
    rng = np.random.default_rng([seed, 58])
    with (
        atomic_directory(out, overwrite) as tmp,
        tqdm(total=days * rows, desc="synth stream", unit="row", unit_scale=True, disable=not progress) as bar,
    ):
        for day in range(1, days + 1):
            meta = {"generator": "ctrkit synth stream", "seed": seed, "day": day, "days": days}
            spec = stream_spec(capacities, num_numerical, meta)
            d = tmp / f"day_{day}"
            spec = FeatureSpec(spec.feature_spec, spec.source_spec, spec.channel_spec, spec.metadata, d)
            truth = {}
            for mapping, share in MAPPINGS:
                n = max(1, int(round(rows * share)))
                numerical, ids, labels, p = model.sample(day, n, rng)
                with SplitBinaryWriter(spec, mapping) as writer:
                    writer.append(numerical, ids, labels)
                (d / "truth").mkdir(parents=True, exist_ok=True)
                p.tofile(d / "truth" / f"{mapping}.f32")
                truth[mapping] = (labels, p)
                bar.update(n)
            labels, p = truth["test"]
            meta["bayes_test_auc"] = round(roc_auc(labels, p), 6) if 0 < labels.sum() < len(labels) else None
            done = FeatureSpec(spec.feature_spec, spec.source_spec, spec.channel_spec, meta, d)
            done.to_yaml(d / "feature_spec.yaml")
        (tmp / "stream.json").write_text(json.dumps({"days": days, "rows_per_day": rows, "seed": seed,
                                                     "capacities": capacities}, indent=1) + "\n")  # fmt: skip
    return [Path(out) / f"day_{day}" for day in range(1, days + 1)]
