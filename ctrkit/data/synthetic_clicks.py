"""A raw click log as a team has one (a CSV of impressions): a timestamp, text ids, integer codes, an amount and a
0/1 click, with missing values, for trying and testing the path from raw rows to a served model (``preprocess
table``, ``predict --input``, raw-value requests)."""

from __future__ import annotations

import numpy as np
import polars as pl

COLUMNS = ("ts", "country", "device", "ad_id", "category", "age", "price", "position", "clicked")


def click_log(rows: int, seed: int = 0, first_row: int = 0) -> pl.DataFrame:
    """``rows`` impressions (rows ``first_row``.. of one log: timestamps increase with the row): country, device,
    ad (a power law over 400 ads) and category as text, age and position as integers, price as an amount; about
    5% of countries, ages and prices missing; the click drawn from a logistic model of device, position, ad and
    price."""
    rng = np.random.default_rng([seed, first_row])
    country = rng.choice(["BR", "US", "DE", "FR", "IN", "JP"], rows, p=[0.3, 0.3, 0.1, 0.1, 0.1, 0.1])
    device = rng.choice(["mobile", "desktop", "tablet"], rows)
    ad = rng.zipf(1.6, rows) % 400
    age = rng.integers(18, 70, rows)
    price = np.round(rng.gamma(2.0, 10.0, rows), 2)
    position = rng.integers(1, 6, rows)
    logit = -1.5 + 0.8 * (device == "mobile") - 0.25 * position + 0.6 * (ad % 5 == 0) - 0.01 * price
    clicked = (rng.random(rows) < 1 / (1 + np.exp(-logit))).astype(np.int64)
    index = np.arange(first_row, first_row + rows)
    seconds = index * 7  # one impression every 7 seconds
    ts = pl.Series(seconds * 1_000_000).cast(pl.Datetime("us")).dt.offset_by("56y").dt.strftime("%Y-%m-%dT%H:%M:%S")
    return pl.DataFrame(
        {
            "ts": ts,
            "country": pl.Series(country).set(pl.Series(rng.random(rows) < 0.05), None),
            "device": device,
            "ad_id": pl.Series(ad).cast(pl.String).str.zfill(4).str.replace(r"^", "ad_"),
            "category": rng.choice(["shoes", "books", "games"], rows),
            "age": pl.Series(age).set(pl.Series(rng.random(rows) < 0.05), None),
            "price": pl.Series(price).set(pl.Series(rng.random(rows) < 0.05), None),
            "position": position,
            "clicked": clicked,
        }
    )
