"""An e-commerce click log with a known best AUC, as a team's raw rows: for choosing the defaults on the kind of log a
user brings (``preprocess table`` with a multi-valued column and a timestamp), where the best possible ranking is
known.

Each row is an impression: a timestamp (one every 20 seconds, so 60,000 rows span about two weeks), a user (20,000,
drawn by a power law: a few return often, most are seen once or twice), the category shown (10 categories, each
written in the user's one of four languages), a device, 1 to 6 tags of 60 (a multi-valued text column, ``|``
between values), a price (5% missing) and a position. The click's log-odds are a sum of

* per-value effects of the user, the category and the device;
* the tags' effects, added (``tags="sum"``: each tag moves the odds by its own amount, however many there are) or
  averaged (``tags="mean"``: the tags describe the item together, and a long list does not add up);
* a smooth effect of the price (its logarithm) and a falling effect of the position;
* the time: an evening bump (18:00-22:00) and a weekend shift, which only a model that reads the hour and the day
  of the week can learn;

shifted to a click rate near 10%. Labels are Bernoulli draws from those log-odds, so ranking rows by them reaches the
best AUC any model can: ``shop_log`` returns them beside the rows.
"""

from __future__ import annotations

import datetime as dt

import numpy as np
import polars as pl

COLUMNS = ("ts", "user", "category", "device", "tags", "price", "position", "clicked")
USERS = 20_000
TAGS = 60
SECONDS_APART = 20
START = dt.datetime(2026, 3, 2)  # a Monday
_CATEGORIES = (
    ("shoes", "books", "games", "garden", "toys", "music", "kitchen", "sports", "beauty", "phones"),
    ("Schuhe", "Bücher", "Spiele", "Garten", "Spielzeug", "Musik", "Küche", "Sport", "Schönheit", "Telefone"),
    ("chaussures", "livres", "jeux", "jardin", "jouets", "musique", "cuisine", "sport", "beauté", "téléphones"),
    ("zapatos", "libros", "juegos", "jardín", "juguetes", "música", "cocina", "deportes", "belleza", "teléfonos"),
)
_DEVICES = ("mobile", "desktop", "tablet")


def _effects(seed: int) -> dict[str, np.ndarray]:
    """The click model's fixed per-value effects (the same for every slice of one seed's log)."""
    rng = np.random.default_rng([seed, 1])
    return {
        "user": rng.normal(0.0, 0.7, USERS),
        "category": rng.normal(0.0, 0.4, len(_CATEGORIES[0])),
        "device": np.array([0.3, -0.2, 0.0]),
        "tag": rng.normal(0.0, 0.45, TAGS),
        "user_p": (p := 1.0 / np.arange(1, USERS + 1) ** 0.9) / p.sum(),
        "tag_p": (q := 1.0 / np.arange(1, TAGS + 1) ** 0.7) / q.sum(),
    }


def _tags(rng: np.random.Generator, counts: np.ndarray, p: np.ndarray, chunk: int = 100_000) -> np.ndarray:
    """Each row's ``counts[i]`` distinct tags drawn by ``p`` without replacement (the Gumbel top-k draw), as a
    (rows, TAGS) boolean matrix."""
    has = np.zeros((len(counts), len(p)), dtype=bool)
    for lo in range(0, len(counts), chunk):
        keys = np.log(p) - np.log(-np.log(rng.random((min(chunk, len(counts) - lo), len(p)))))
        rank = np.argsort(-keys, axis=1).argsort(axis=1)
        has[lo : lo + chunk] = rank < counts[lo : lo + chunk, None]
    return has


def shop_log(rows: int, seed: int = 0, tags: str = "sum", first_row: int = 0) -> tuple[pl.DataFrame, np.ndarray]:
    """Rows ``first_row``.. of seed ``seed``'s log (``COLUMNS``; timestamps increase with the row) and each row's
    true click log-odds. ``tags``: how the tags' effects combine, "sum" or "mean"."""
    if tags not in ("sum", "mean"):
        raise ValueError(f"tags is 'sum' or 'mean', got {tags!r}")
    eff = _effects(seed)
    rng = np.random.default_rng([seed, 2, first_row])
    user = rng.choice(USERS, rows, p=eff["user_p"])
    language = user % len(_CATEGORIES)
    category = rng.integers(0, len(_CATEGORIES[0]), rows)
    device = rng.choice(len(_DEVICES), rows, p=[0.55, 0.35, 0.1])
    counts = rng.integers(1, 7, rows)
    has = _tags(rng, counts, eff["tag_p"])  # (rows, TAGS): which tags each row holds
    tag_effect = has @ eff["tag"]
    if tags == "mean":
        tag_effect = tag_effect / counts * 2.0  # the mean of the tags' effects, on the sum's scale at 2 tags
    price = np.round(rng.lognormal(3.0, 0.8, rows), 2)
    position = rng.integers(1, 11, rows)
    seconds = np.arange(first_row, first_row + rows) * SECONDS_APART + rng.integers(0, SECONDS_APART, rows)
    hour = (seconds // 3600) % 24
    weekday = (seconds // 86400) % 7  # START is a Monday: 5, 6 the weekend
    logit = (
        eff["user"][user] + eff["category"][category] + eff["device"][device] + tag_effect
        - 0.5 * (np.log(price) - 3.0) - 0.15 * (position - 1)
        + 0.7 * ((hour >= 18) & (hour < 22)) + 0.3 * (weekday >= 5)
    )  # fmt: skip
    logit = logit - 2.3
    clicked = (rng.random(rows) < 1.0 / (1.0 + np.exp(-logit))).astype(np.int64)
    missing_price = rng.random(rows) < 0.05
    names = np.array([f"t{t:02d}" for t in range(TAGS)])
    tag_lists = pl.Series([names[row] for row in has]) if rows else pl.Series([], dtype=pl.List(pl.String))
    ts = (pl.Series(seconds * 1_000_000).cast(pl.Duration("us")) + START).dt.strftime("%Y-%m-%dT%H:%M:%S")
    frame = pl.DataFrame(
        {
            "ts": ts,
            "user": pl.Series(user).cast(pl.String).str.zfill(5).str.replace(r"^", "u"),
            "category": np.array([c for lang in _CATEGORIES for c in lang])[language * len(_CATEGORIES[0]) + category],
            "device": np.array(_DEVICES)[device],
            "tags": tag_lists.list.join("|"),
            "price": pl.Series(price).set(pl.Series(missing_price), None),
            "position": position,
            "clicked": clicked,
        }
    )
    return frame, logit
