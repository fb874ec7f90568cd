"""Raw files in the Kaggle Outbrain Click Prediction schema, drawn from a planted click model.

``ctrkit synth outbrain-raw`` writes ``clicks_train.csv``, ``events.csv``, ``promoted_content.csv``,
``documents_meta.csv``, ``documents_topics.csv``, ``documents_entities.csv``,
``documents_categories.csv`` and ``page_views.csv`` with the real files' columns and value formats
(timestamps in ms from the dataset's epoch, 1465876799998 = 2016-06-14 04:00 UTC; geo strings such as
``US>CA>807``; ``\\N`` for a missing platform; 32-hex-digit entity ids; confidence levels), so the whole
path raw files -> ``ctrkit preprocess outbrain`` -> Wide & Deep -> MAP@12 runs on them.

The click model: each display (one page view of a document) shows 2-12 distinct ads and exactly one is
clicked, drawn by a softmax over a score (Gumbel-max). The score adds the ad's appeal, the topic
overlap of the page's and the ad's documents, an advertiser-by-country effect and a campaign-by-platform
effect. ``truth.json`` records the MAP@12 of ranking each display's ads by that score, the ranking
quality no model can beat on average, and the MAP@12 of ranking by the ad's appeal alone.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import polars as pl

from ctrkit.data.atomic import atomic_directory
from ctrkit.data.synthetic import power_law_ids

TIMESTAMP_EPOCH_MS = 1465876799998  # the Outbrain files' timestamps count ms from here
DAYS = 15
COUNTRIES = ("US", "CA", "GB", "AU", "IN", "PH", "DE", "SG", "FR", "BR")
PLATFORMS = (1, 2, 3)


def _hex(gen: np.random.Generator, n: int, digits: int) -> list[str]:
    raw = gen.integers(0, 256, (n, digits // 2), dtype=np.uint8)
    return [bytes(r).hex() for r in raw]


def _map12(scores: np.ndarray, clicked: np.ndarray, sizes: np.ndarray) -> float:
    """MAP@12 of ranking each display's ads by ``scores`` (one click per display: 1 / rank, 0 past 12)."""
    display = np.repeat(np.arange(len(sizes)), sizes)
    click_score = np.repeat(scores[clicked == 1], sizes)
    above = np.bincount(display, weights=(scores > click_score).astype(np.float64), minlength=len(sizes))
    rank = above + 1
    return float(np.mean(np.where(rank <= 12, 1.0 / rank, 0.0)))


def generate_outbrain_raw(
    out_dir: str | os.PathLike, clicks: int, seed: int = 0, overwrite: bool = False, page_views_per_display: float = 3.0
) -> dict:
    """Writes about ``clicks`` rows of ``clicks_train.csv`` (whole displays) and the other raw files;
    returns what ``truth.json`` records. The directory appears only when complete."""
    # one job: one world drawn from one generator, file after file; each file's rows depend on the draws of the ones
    # before (documents, ads, displays, views), in this order
    if clicks < 100:
        raise ValueError(f"`rows` must be at least 100 clicks rows for outbrain-raw, got {clicks}")
    gen = np.random.default_rng([seed, 31])
    displays = max(20, clicks // 7)
    n_docs = max(300, clicks // 30)
    n_ads = max(200, clicks // 25)
    n_campaigns = max(40, n_ads // 6)
    n_advertisers = max(10, n_campaigns // 4)
    n_sources = max(20, n_docs // 25)
    n_publishers = max(10, n_sources // 3)
    n_topics, n_entities = 300, max(500, n_docs // 4)
    n_users = max(50, displays // 2)

    # documents: source, publisher, publish time, topics / entities / categories with confidences
    doc_ids = np.arange(1, n_docs + 1)
    doc_source = gen.integers(1, n_sources + 1, n_docs)
    source_publisher = gen.integers(1, n_publishers + 1, n_sources + 1)
    doc_age_days = gen.exponential(200.0, n_docs)
    doc_topics = [np.unique(power_law_ids(gen, n_topics, int(gen.integers(1, 5)), 1.1)) for _ in range(n_docs)]
    topic_vectors = np.zeros((n_docs, n_topics), np.float32)
    topic_conf = []
    for d, t in enumerate(doc_topics):
        c = gen.uniform(0.05, 0.9, len(t))
        topic_conf.append(c)
        topic_vectors[d, t] = c
    topic_vectors /= np.linalg.norm(topic_vectors, axis=1, keepdims=True)

    # ads: each links to a document and belongs to a campaign of an advertiser
    ad_doc = power_law_ids(gen, n_docs, n_ads, 1.05)  # 0-based document rows
    campaign_advertiser = gen.integers(1, n_advertisers + 1, n_campaigns + 1)
    ad_campaign = gen.integers(1, n_campaigns + 1, n_ads)
    ad_appeal = gen.normal(0.0, 1.0, n_ads)
    country_advertiser = gen.normal(0.0, 0.6, (len(COUNTRIES), n_advertisers + 1))
    platform_campaign = gen.normal(0.0, 0.6, (len(PLATFORMS), n_campaigns + 1))

    # displays: a page view of a document, in time order
    sizes = gen.integers(2, 13, displays)
    n = int(sizes.sum())
    t_ms = np.sort(gen.integers(0, DAYS * 86_400_000, displays))
    display_doc = power_law_ids(gen, n_docs, displays, 1.1)
    platform = gen.choice(3, displays, p=[0.45, 0.4, 0.15])
    country = power_law_ids(gen, len(COUNTRIES), displays, 1.5)
    user = power_law_ids(gen, n_users, displays, 1.05)
    # each display's ads: distinct, power-law popular (a few duplicates redrawn at the end)
    ads = power_law_ids(gen, n_ads, n, 1.02)
    row_display = np.repeat(np.arange(displays), sizes)
    key = row_display.astype(np.int64) * n_ads + ads
    _, first = np.unique(key, return_index=True)
    dup = np.ones(n, bool)
    dup[first] = False
    for i in np.flatnonzero(dup):  # rare: redraw until distinct within the display
        lo = int(np.searchsorted(row_display, row_display[i]))
        taken = set(ads[lo : lo + sizes[row_display[i]]].tolist())
        a = int(gen.integers(0, n_ads))
        while a in taken:
            a = int(gen.integers(0, n_ads))
        ads[i] = a
    doc_of_row = display_doc[row_display]
    similarity = np.einsum("nk,nk->n", topic_vectors[doc_of_row], topic_vectors[ad_doc[ads]])
    advertiser = campaign_advertiser[ad_campaign[ads]]
    score = (
        ad_appeal[ads]
        + 2.0 * similarity
        + country_advertiser[country[row_display], advertiser]
        + platform_campaign[platform[row_display], ad_campaign[ads]]
    )
    noisy = score + gen.gumbel(size=n)
    starts = np.r_[0, np.cumsum(sizes)[:-1]]
    best = np.maximum.reduceat(noisy, starts)
    clicked = (noisy == np.repeat(best, sizes)).astype(np.int8)
    truth = {
        "clicks_rows": n,
        "displays": int(displays),
        "true_score_map12": _map12(score, clicked, sizes),
        "ad_appeal_map12": _map12(ad_appeal[ads], clicked, sizes),
        "seed": seed,
        "generator": "ctrkit synth outbrain-raw",
    }

    with atomic_directory(out_dir, overwrite) as tmp:
        pl.DataFrame({"display_id": row_display + 1, "ad_id": ads + 1, "clicked": clicked}).write_csv(
            tmp / "clicks_train.csv"
        )
        geo = []
        for c, u in zip(country, gen.integers(0, 1000, displays)):
            name = COUNTRIES[c]
            geo.append(f"{name}>{'CA' if name == 'US' else 'H9'}>{500 + u % 300}" if u % 4 else f"{name}>{u % 60:02d}")
        platform_text = np.array([str(p) for p in PLATFORMS])[platform].astype(object)
        platform_text[gen.random(displays) < 0.002] = "\\N"
        uuids = np.array(_hex(gen, n_users, 14))
        pl.DataFrame(
            {"display_id": np.arange(1, displays + 1), "uuid": uuids[user], "document_id": display_doc + 1,
             "timestamp": t_ms, "platform": platform_text.tolist(), "geo_location": geo}
        ).write_csv(tmp / "events.csv")  # fmt: skip
        pl.DataFrame(
            {"ad_id": np.arange(1, n_ads + 1), "document_id": ad_doc + 1, "campaign_id": ad_campaign,
             "advertiser_id": campaign_advertiser[ad_campaign]}
        ).write_csv(tmp / "promoted_content.csv")  # fmt: skip
        published = (
            np.datetime64("2016-06-14T04:00:00")
            - (doc_age_days * 86400).astype("timedelta64[s]")
        ).astype("datetime64[s]")  # fmt: skip
        publish_text: list[str | None] = [str(p).replace("T", " ") for p in published]
        publish_text = [p if gen.random() > 0.05 else None for p in publish_text]
        publisher = source_publisher[doc_source].astype(object)
        publisher[gen.random(n_docs) < 0.03] = None
        pl.DataFrame(
            {"document_id": doc_ids, "source_id": doc_source, "publisher_id": publisher.tolist(),
             "publish_time": publish_text},
            schema={"document_id": pl.Int64, "source_id": pl.Int64, "publisher_id": pl.Int64, "publish_time": pl.Utf8},
        ).write_csv(tmp / "documents_meta.csv")  # fmt: skip
        lens = [len(t) for t in doc_topics]
        pl.DataFrame(
            {"document_id": np.repeat(doc_ids, lens), "topic_id": np.concatenate(doc_topics),
             "confidence_level": np.round(np.concatenate(topic_conf), 6)}
        ).write_csv(tmp / "documents_topics.csv")  # fmt: skip
        cat_lens = gen.integers(1, 3, n_docs)
        n_cat = int(cat_lens.sum())
        pl.DataFrame(
            {"document_id": np.repeat(doc_ids, cat_lens),
             "category_id": 1000 + 100 * gen.integers(1, 20, n_cat) + gen.integers(0, 5, n_cat),
             "confidence_level": np.round(gen.uniform(0.05, 0.95, int(cat_lens.sum())), 6)}
        ).unique(["document_id", "category_id"], keep="first", maintain_order=True).write_csv(
            tmp / "documents_categories.csv"
        )  # fmt: skip
        entity_names = np.array(_hex(gen, n_entities, 32))
        ent_lens = gen.integers(0, 5, n_docs)
        pl.DataFrame(
            {"document_id": np.repeat(doc_ids, ent_lens),
             "entity_id": entity_names[power_law_ids(gen, n_entities, int(ent_lens.sum()), 1.1)],
             "confidence_level": np.round(gen.uniform(0.05, 0.95, int(ent_lens.sum())), 6)}
        ).unique(["document_id", "entity_id"], keep="first", maintain_order=True).write_csv(
            tmp / "documents_entities.csv"
        )  # fmt: skip
        views = int(displays * page_views_per_display)
        view_doc = np.concatenate([display_doc, power_law_ids(gen, n_docs, views - displays, 1.1)])
        pl.DataFrame(
            {"uuid": uuids[power_law_ids(gen, n_users, views, 1.05)], "document_id": view_doc + 1,
             "timestamp": gen.integers(0, DAYS * 86_400_000, views), "platform": gen.integers(1, 4, views),
             "geo_location": np.array(COUNTRIES)[power_law_ids(gen, len(COUNTRIES), views, 1.5)],
             "traffic_source": gen.integers(1, 4, views)}
        ).write_csv(tmp / "page_views.csv")  # fmt: skip
        (tmp / "truth.json").write_text(json.dumps(truth, indent=1) + "\n")
    return truth


def read_truth(raw_dir: str | os.PathLike) -> dict:
    return json.loads((Path(raw_dir) / "truth.json").read_text())
