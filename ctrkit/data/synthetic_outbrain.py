"""Synthetic Outbrain-like data: displays of 2-12 ads with exactly one click each.

A display is one page view (request-level features: user, platform, geography, the page's
document and its topics); each ad shown in it is one row (item-level features: ad, advertiser,
campaign, the ad's topics, two numerical signals). Which ad is clicked is drawn from a softmax over
the display's ads of a planted score: a per-ad appeal, a user x advertiser affinity (dot product of
latent vectors), a bonus for every topic the ad shares with the page, and a platform x campaign
effect. Rows of a display are stored together; the test mapping also stores the display id in the
``map`` channel, so ``evaluate`` reports MAP@12 as the Outbrain challenge defines it.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ctrkit.data.atomic import atomic_directory
from ctrkit.data.feature_spec import Chunk, Feature, FeatureSpec, smallest_int_dtype
from ctrkit.data.split_binary import SplitBinaryWriter
from ctrkit.data.synthetic import power_law_ids
from ctrkit.field_types import FRACTION
from ctrkit.progress import tqdm

# one-hot features: request level, then item level
ONEHOT = {
    "user_id": 20000,
    "platform": 3,
    "geo": 200,
    "document_id": 5000,
    "ad_id": 20000,
    "advertiser_id": 800,
    "campaign_id": 3000,
}
MULTI_HOT = {"document_topics": 300, "ad_topics": 300}
NUMERICAL = ("ad_popularity", "document_age")


def display_spec(
    onehot: dict[str, int],
    multi_hot: dict[str, int],
    numerical: tuple[str, ...],
    combiner: str,
    metadata: dict,
    base: Path | None = None,
) -> FeatureSpec:
    """Feature spec of a dataset of displays for MAP@12: one-hot and multi-hot features (name ->
    cardinality), float16 numerical features, a `clicked` label, and the display id (the `map`
    channel) in the test mapping only."""
    features: dict[str, Feature] = {}
    for name, card in {**onehot, **multi_hot}.items():
        extra = {"multi_hot": True, "combiner": combiner} if name in multi_hot else {}
        features[name] = Feature(smallest_int_dtype(card), card, extra)
    for name in numerical:
        features[name] = Feature("float16")
    features["clicked"] = Feature("bool")
    features["display_id"] = Feature("int32")
    sources = {}
    for m in ("train", "test"):
        chunks = [
            Chunk("split_binary", numerical, (f"{m}/numerical.bin",)),
            Chunk("split_binary", ("clicked",), (f"{m}/label.bin",)),
        ]
        chunks += [Chunk("split_binary", (n,), (f"{m}/{n}.bin",)) for n in onehot]
        chunks += [Chunk("split_binary", (n,), (f"{m}/{n}.bin", f"{m}/{n}.offsets.bin")) for n in multi_hot]
        if m == "test":
            chunks.append(Chunk("split_binary", ("display_id",), (f"{m}/display_id.bin",)))
        sources[m] = tuple(chunks)
    channels = {
        "categorical": tuple(onehot) + tuple(multi_hot),
        "numerical": numerical,
        "label": ("clicked",),
        "map": ("display_id",),
    }
    spec = FeatureSpec(features, sources, channels, metadata, base)
    spec.validate()
    return spec


def outbrain_spec() -> FeatureSpec:
    """Feature spec of the synthetic Outbrain-like dataset (display id in the test mapping only)."""
    return display_spec(ONEHOT, MULTI_HOT, NUMERICAL, "mean", {"generator": "ctrkit synth outbrain"})


class SyntheticOutbrain:
    """A fixed random click model over displays; ``sample`` draws whole displays."""

    def __init__(self, seed: int = 0, latent_dim: int = 4):
        rng = np.random.default_rng([seed, 11])
        self.ad_appeal = rng.normal(0.0, 1.0, ONEHOT["ad_id"])
        self.ad_advertiser = rng.integers(0, ONEHOT["advertiser_id"], ONEHOT["ad_id"])
        self.ad_campaign = rng.integers(0, ONEHOT["campaign_id"], ONEHOT["ad_id"])
        self.user_vec = rng.normal(0.0, 1.0, (ONEHOT["user_id"], latent_dim))
        self.advertiser_vec = rng.normal(0.0, 1.0, (ONEHOT["advertiser_id"], latent_dim)) / np.sqrt(latent_dim)
        self.platform_campaign = rng.normal(0.0, 0.7, (ONEHOT["platform"], ONEHOT["campaign_id"]))
        self.doc_topics = [
            np.unique(rng.integers(0, MULTI_HOT["document_topics"], rng.integers(1, 5)))
            for _ in range(ONEHOT["document_id"])
        ]
        self.ad_topics = [
            np.unique(rng.integers(0, MULTI_HOT["ad_topics"], rng.integers(0, 4))) for _ in range(ONEHOT["ad_id"])
        ]
        self.doc_age = rng.exponential(1.0, ONEHOT["document_id"])

    def sample(self, rng: np.random.Generator, displays: int, first_display: int) -> dict:
        """Rows of ``displays`` displays, numbered from ``first_display``."""
        sizes = rng.integers(2, 13, displays)  # 2..12 ads per display
        n = int(sizes.sum())
        display = np.repeat(np.arange(first_display, first_display + displays), sizes)
        user = np.repeat(power_law_ids(rng, ONEHOT["user_id"], displays, 1.05), sizes)
        platform = np.repeat(rng.choice(3, displays, p=[0.5, 0.35, 0.15]), sizes)
        geo = np.repeat(power_law_ids(rng, ONEHOT["geo"], displays, 1.3), sizes)
        doc = np.repeat(power_law_ids(rng, ONEHOT["document_id"], displays, 1.1), sizes)
        ad = power_law_ids(rng, ONEHOT["ad_id"], n, 1.05)
        advertiser, campaign = self.ad_advertiser[ad], self.ad_campaign[ad]
        shared = np.array(
            [len(np.intersect1d(self.doc_topics[d], self.ad_topics[a], assume_unique=True)) for d, a in zip(doc, ad)]
        )
        score = (
            self.ad_appeal[ad]
            + np.einsum("nk,nk->n", self.user_vec[user], self.advertiser_vec[advertiser])
            + 0.8 * shared
            + self.platform_campaign[platform, campaign]
        )
        # exactly one click per display: a softmax draw over its ads (Gumbel-max)
        noisy = score + rng.gumbel(size=n)
        starts = np.r_[0, np.cumsum(sizes)[:-1]]
        best = np.maximum.reduceat(noisy, starts)
        clicked = (noisy == np.repeat(best, sizes)).astype(np.uint8)
        popularity = np.log1p(np.exp(self.ad_appeal[ad] + rng.normal(0.0, 1.0, n)))  # a noisy hint of appeal
        numerical = np.stack([popularity, self.doc_age[doc]], axis=1).astype(np.float32)
        doc_topics = [self.doc_topics[d] for d in doc]
        ad_topics = [self.ad_topics[a] for a in ad]
        onehot = np.stack([user, platform, geo, doc, ad, advertiser, campaign], axis=1)
        multi_hot = [
            (np.concatenate(t) if t else np.zeros(0, np.int64), np.array([len(x) for x in t]))
            for t in (doc_topics, ad_topics)
        ]
        return {"numerical": numerical, "onehot": onehot, "labels": clicked, "multi_hot": multi_hot, "display": display}


def generate_outbrain(
    out_dir: str | os.PathLike,
    rows: int,
    test_fraction: float = 0.2,
    seed: int = 0,
    overwrite: bool = False,
    progress: bool = True,
    displays_per_block: int = 20_000,
) -> FeatureSpec:
    """Writes an Outbrain-like split-binary dataset of about ``rows`` rows (whole displays).

    Displays are split between ``train`` and ``test`` (about ``test_fraction`` of them in test); the
    test mapping also stores each row's display id (the ``map`` channel). The directory appears
    only when complete (written to a temporary directory, then renamed).
    """
    if rows < 20:
        raise ValueError(f"`rows` must be at least 20 for displays of 2-12 ads, got {rows}")
    FRACTION.check("test_fraction", test_fraction, integer=False)
    with atomic_directory(out_dir, overwrite) as tmp:
        model = SyntheticOutbrain(seed)
        base = outbrain_spec()
        spec = FeatureSpec(
            base.feature_spec, base.source_spec, base.channel_spec, {**base.metadata, "seed": seed, "rows": rows}, tmp
        )
        displays = max(2, rows // 7)  # 7 ads per display on average
        n_test = max(1, int(round(displays * test_fraction)))
        rng = np.random.default_rng([seed, 12])
        next_display = 0
        with tqdm(total=displays, desc="synth outbrain", unit="display", unit_scale=True, disable=not progress) as bar:
            for mapping, count in (("train", displays - n_test), ("test", n_test)):
                with SplitBinaryWriter(spec, mapping) as writer:
                    done = 0
                    while done < count:
                        k = min(displays_per_block, count - done)
                        block = model.sample(rng, k, next_display)
                        writer.append(
                            block["numerical"],
                            block["onehot"],
                            block["labels"],
                            block["multi_hot"],
                            block["display"] if mapping == "test" else None,
                        )
                        done += k
                        next_display += k
                        bar.update(k)
        spec.to_yaml(tmp / "feature_spec.yaml")
    return FeatureSpec.from_yaml(Path(out_dir) / "feature_spec.yaml")
