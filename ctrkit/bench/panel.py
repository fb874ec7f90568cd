"""The accuracy benchmark's panel: real CTR samples and planted synthetic data turned into datasets.

Real samples are read from a directory laid out as the project's ``shared/data`` (their terms forbid
redistribution, so nothing here copies them anywhere but the benchmark's scratch directory):

* ``criteo``: Criteo Kaggle ``train_head_10k.txt`` -> ``sample_late_va.rx.csv`` (a later day), through
  ``ctrkit preprocess criteo`` with frequency threshold 2;
* ``avazu``: the Avazu head, in file order (time order), the last 20% as test;
* ``movielens``: MovieLens 100k, rating >= 4 as a click, user/item/gender/occupation/age features and
  the item's genres as a multi-hot feature, each user's last 20% of ratings (by time) as test;
* ``planted-<rows>-s<seed>``: ``synthetic_planted`` data with its Bayes-optimal test AUC;
* ``tabular-<rows>-s<seed>``: the same module's tabular family (nonlinear numerical effects);
* ``amounts-<rows>-s<seed>``: the tabular family's data with its numerical features as raw amounts;
* ``shop-<sum|mean>-<rows>-s<seed>``: ``synthetic_shop`` e-commerce logs (a timestamp, users, tags whose effects add
  or average) as CSV through ``ctrkit preprocess table`` with its defaults, the last tenth as test;
* ``outbrain-<rows>-s<seed>``: ``ctrkit synth outbrain-raw`` files (``<rows>`` clicks rows) through
  ``ctrkit preprocess outbrain``: one-hot, multi-hot and CTR features, the evaluation days as test.

Categorical values get ids as the Criteo recipe gives them: 0 missing or unseen in train, 1 seen fewer
than ``threshold`` times in train, 2.. by descending train frequency (ties by value).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import numpy as np
import polars as pl

from ctrkit.bench.config import REAL_SAMPLES
from ctrkit.data.atomic import atomic_directory
from ctrkit.data.feature_spec import Feature, FeatureSpec, smallest_int_dtype
from ctrkit.data.spec_builders import split_binary_spec
from ctrkit.data.split_binary import SplitBinaryWriter


@dataclass(frozen=True)
class PanelEntry:
    """One data set of the panel: its name, dataset directory and what is known of it: the test AUC of the true
    click odds (``bayes_auc``) and, where the columns show only part of them, the best test AUC any model of the
    columns can reach (``observable_auc``). ``group``: a generated data set's family at its size, the name of the
    data sets its other seeds draw (None for one drawn once)."""

    name: str
    path: Path
    note: str
    bayes_auc: float | None = None
    observable_auc: float | None = None
    group: str | None = None


def _ids(train: pl.Series, others: Sequence[pl.Series], threshold: int) -> tuple[list[np.ndarray], int]:
    """Recipe ids of a categorical column in train and each other split (train's first), and the cardinality."""
    counts = train.drop_nulls().cast(pl.Utf8).value_counts(name="n").sort(["n", train.name], descending=[True, False])
    kept = counts.filter(pl.col("n") >= threshold)[train.name].to_list()
    index = {v: i + 2 for i, v in enumerate(kept)}
    seen = set(counts[train.name].to_list())

    def encode(col: pl.Series) -> np.ndarray:
        values = col.cast(pl.Utf8).to_list()
        return np.array([0 if v is None else index.get(v, 1 if v in seen else 0) for v in values], np.int64)

    return [encode(train), *(encode(o) for o in others)], len(kept) + 2


def write_tabular(
    out: str | os.PathLike,
    train: pl.DataFrame,
    test: pl.DataFrame,
    label: str,
    categorical: Sequence[str],
    numerical: Sequence[str] = (),
    multi_hot: dict[str, int] | None = None,
    threshold: int = 2,
    metadata: dict | None = None,
    overwrite: bool = True,
    validation: pl.DataFrame | None = None,
) -> FeatureSpec:
    """A split-binary dataset (train, test and, when given, validation) from frames.

    Args:
        out: dataset directory to create.
        train, test: the splits, train in time order.
        label: 0/1 column.
        categorical: columns of categorical values (any type; null is missing).
        numerical: float columns, already transformed as the model should see them.
        multi_hot: list-of-int columns of ids in [0, cardinality), with their cardinality.
        threshold: values seen fewer times in train share the rare id.
        metadata: the spec's metadata.
        overwrite: replace an existing dataset.
        validation: the validation split (its ids encoded as test's), for a split the trainer's held-out
            tail of train would not mirror.
    """
    multi_hot = multi_hot or {}
    frames = {"train": train, "test": test, **({"validation": validation} if validation is not None else {})}
    encoded = {c: _ids(train[c], [f[c] for f in list(frames.values())[1:]], threshold) for c in categorical}
    features = {c: Feature(smallest_int_dtype(card), card) for c, (_, card) in encoded.items()}
    for c, card in multi_hot.items():
        features[c] = Feature(smallest_int_dtype(card), card, {"multi_hot": True, "combiner": "mean"})
    with atomic_directory(out, overwrite) as tmp:
        base = split_binary_spec(features, list(numerical), "label", tuple(frames), metadata)
        spec = FeatureSpec(base.feature_spec, base.source_spec, base.channel_spec, base.metadata, tmp)
        for side, (mapping, frame) in enumerate(frames.items()):
            nums = frame.select(numerical).to_numpy().astype(np.float32) if numerical else None
            bags = []
            for c in multi_hot:
                lists = frame[c].to_list()
                bags.append((np.array([i for ids in lists for i in ids], np.int64), np.array([len(x) for x in lists])))
            with SplitBinaryWriter(spec, mapping) as writer:
                cats = [encoded[c][0][side] for c in categorical]
                writer.append(nums, cats, frame[label].to_numpy().astype(np.uint8), bags or None)
        spec.to_yaml(tmp / "feature_spec.yaml")
    return FeatureSpec.from_yaml(Path(out) / "feature_spec.yaml")


def build_criteo(src: Path, out: Path) -> PanelEntry:
    """The Criteo sample from ``src`` (``shared/data/criteo_kaggle``)."""
    from ctrkit.preprocess.criteo import CriteoRecipe
    from ctrkit.preprocess.polars_engine import preprocess_criteo

    late = pl.read_csv(src / "sample_late_va.rx.csv", infer_schema_length=0)  # every column as text
    tsv = out.parent / f"{out.name}.late.tsv"
    late.drop("Id").write_csv(tsv, separator="\t", include_header=False, null_value="")
    preprocess_criteo([src / "train_head_10k.txt"], out, CriteoRecipe(frequency_threshold=2), test_files=[tsv],
                      overwrite=True, progress=False)  # fmt: skip
    tsv.unlink()
    return PanelEntry("criteo", out, "Criteo Kaggle: first 10,000 rows -> 1,999 rows of a later day")


def build_avazu(src: Path, out: Path) -> PanelEntry:
    """The Avazu sample from ``src`` (``shared/data/avazu``)."""
    frame = pl.read_csv(src / "train_head_10k.csv", infer_schema_length=0)
    cut = int(round(len(frame) * 0.8))
    cats = [c for c in frame.columns if c not in ("id", "click", "hour")]
    frame = frame.with_columns(pl.col("click").cast(pl.Int64))
    write_tabular(out, frame[:cut], frame[cut:], "click", cats, metadata={"source": "avazu head 10k"})
    return PanelEntry("avazu", out, "Avazu: first 9,999 rows in file order, the last 20% as test")


def build_movielens(src: Path, out: Path) -> PanelEntry:
    """MovieLens 100k from ``src`` (``shared/data/movielens``)."""
    src = src / "ml-100k"
    ratings = pl.read_csv(src / "u.data", separator="\t", has_header=False,
                          new_columns=["user", "item", "rating", "time"])  # fmt: skip
    users = pl.read_csv(src / "u.user", separator="|", has_header=False,
                        new_columns=["user", "age", "gender", "occupation", "zip"], infer_schema_length=0)  # fmt: skip
    users = users.with_columns(pl.col("user").cast(pl.Int64), pl.col("age").cast(pl.Int64))
    items = pl.read_csv(src / "u.item", separator="|", has_header=False, encoding="utf8-lossy",
                        infer_schema_length=0)  # fmt: skip
    genre_cols = items.columns[5:24]
    items = items.select(
        pl.col(items.columns[0]).cast(pl.Int64).alias("item"),
        pl.col(items.columns[2]).str.slice(-4).cast(pl.Float64, strict=False).alias("year"),
        pl.concat_list([pl.when(pl.col(c) == "1").then(pl.lit(i)) for i, c in enumerate(genre_cols)])
        .list.drop_nulls()
        .alias("genres"),
    )
    data = (
        ratings.join(users, on="user")
        .join(items, on="item")
        .with_columns(
            (pl.col("rating") >= 4).cast(pl.Int64).alias("click"),
            (pl.col("age") // 10).alias("age_band"),
            pl.col("zip").str.slice(0, 1).alias("zip1"),
            (pl.col("age").cast(pl.Float64).log1p()).alias("log_age"),
            ((pl.col("year").fill_null(1990.0) - 1990.0) / 10.0).alias("year_z"),
        )
    )
    data = data.sort(["user", "time", "item"]).with_columns(
        pl.int_range(pl.len()).over("user").alias("k"), pl.len().over("user").alias("n_user")
    )
    # the same per-user time split for validation as for test: the trainer's default (the last rows of
    # train in time) would hold out mostly the users who joined last, whose ids train has barely seen
    is_test = pl.col("k") >= (pl.col("n_user") * 0.8).ceil().cast(pl.Int64)
    is_validation = ~is_test & (pl.col("k") >= (pl.col("n_user") * 0.7).ceil().cast(pl.Int64))
    order = ["time", "user", "item"]
    train = data.filter(~is_test & ~is_validation).sort(order)
    validation, test = data.filter(is_validation).sort(order), data.filter(is_test).sort(order)
    cats = ["user", "item", "gender", "occupation", "age_band", "zip1"]
    write_tabular(out, train, test, "click", cats, ["log_age", "year_z"], {"genres": len(genre_cols)},
                  metadata={"source": "movielens 100k"}, validation=validation)  # fmt: skip
    return PanelEntry("movielens", out, "MovieLens 100k: rating >= 4; each user's last 20% of ratings as test, "
                      "the 10% before as validation")  # fmt: skip


def build_planted(out: Path, rows: int, seed: int, family: str = "interactions") -> PanelEntry:
    from ctrkit.data.synthetic_planted import generate_planted

    spec = generate_planted(out, rows, seed=seed, overwrite=True, progress=False, family=family)
    n_test = int(round(rows / 6))
    what = {"interactions": "planted interactions", "tabular": "planted nonlinear numerical effects",
            "amounts": "planted nonlinear effects of raw amounts"}[family]  # fmt: skip
    return PanelEntry(out.name, out, f"{what}, {rows - n_test:,} train rows, seed {seed}",
                      spec.metadata["bayes_test_auc"], spec.metadata.get("observable_test_auc"))  # fmt: skip


def build_outbrain(out: Path, rows: int, seed: int) -> PanelEntry:
    """Draws the raw files into ``<out>.raw`` (left there to look at) and preprocesses them into ``out``."""
    from ctrkit.data.synthetic_outbrain_raw import generate_outbrain_raw
    from ctrkit.preprocess.outbrain import preprocess_outbrain

    raw = out.with_name(out.name + ".raw")
    truth = generate_outbrain_raw(raw, rows, seed=seed, overwrite=True)
    summary = preprocess_outbrain(raw, out, overwrite=True, progress=False)
    note = (f"synth outbrain-raw -> preprocess outbrain, {summary['rows']['train']:,} train rows, seed {seed}; "
            f"MAP@12 of the true scores {truth['true_score_map12']:.4f}")  # fmt: skip
    return PanelEntry(out.name, out, note)


def build_shop(out: Path, rows: int, seed: int, tags: str) -> PanelEntry:
    """Draws a shop log into ``<out>.csv`` (left there to look at) and preprocesses it into ``out`` as a user would:
    the tags named multi-hot, the rows ordered by their timestamp, the integer position a number."""
    from ctrkit.data.synthetic_shop import shop_log
    from ctrkit.metrics import roc_auc
    from ctrkit.preprocess.table import preprocess_table
    from ctrkit.preprocess.table_recipe import TableRecipe

    frame, logit = shop_log(rows, seed, tags)
    csv = out.with_name(out.name + ".csv")
    frame.write_csv(csv)
    recipe = TableRecipe(label="clicked", multi_hot=("tags",), order_by="ts", integers="numerical")
    summary = preprocess_table([csv], out, recipe, overwrite=True)
    n_test = summary["test_rows"]  # the log is in time order: the test rows are its last
    bayes = roc_auc(frame["clicked"].to_numpy()[-n_test:], logit[-n_test:])
    return PanelEntry(out.name, out, f"synthetic shop log, tags' effects {'added' if tags == 'sum' else 'averaged'}, "
                      f"{summary['train_rows']:,} train rows, seed {seed}", bayes)  # fmt: skip


# Each generated family: the data sets it draws at a size (``rows``), as (group, build) where ``group`` names the family
# at that size and ``build(directory, seed=seed)`` writes one seed's data set.
GENERATED: dict[str, Callable[[int], list[tuple[str, Callable[..., PanelEntry]]]]] = {
    "planted": lambda rows: [(f"planted-{rows // 1000}k", partial(build_planted, rows=rows))],
    "tabular": lambda rows: [(f"tabular-{rows // 1000}k", partial(build_planted, rows=rows, family="tabular"))],
    "amounts": lambda rows: [(f"amounts-{rows // 1000}k", partial(build_planted, rows=rows, family="amounts"))],
    "outbrain": lambda rows: [(f"outbrain-{rows // 1000}k", partial(build_outbrain, rows=rows))],
    "shop": lambda rows: [
        (f"shop-{tags}-{rows // 1000}k", partial(build_shop, rows=rows, tags=tags)) for tags in ("sum", "mean")
    ],  # fmt: skip
}
# Each real sample: its directory under the shared data, and the builder that reads it (``build(directory, out)``).
REAL_BUILDERS: dict[str, tuple[str, Callable[[Path, Path], PanelEntry]]] = {
    "criteo": ("criteo_kaggle", build_criteo), "avazu": ("avazu", build_avazu),
    "movielens": ("movielens", build_movielens)}  # fmt: skip


def build_panel(
    work: Path,
    shared: Path | None,
    families: Sequence[str],
    rows: Mapping[str, Sequence[int]],
    seeds: Sequence[int] = (0,),
) -> list[PanelEntry]:
    """Builds the data sets of ``families`` under ``work``: each real sample (``REAL_SAMPLES``) where ``shared``
    holds its directory, and each generated family (``GENERATED``) at each of its sizes in ``rows`` (family -> rows,
    for every generated family named; a ValueError names one left out), once per seed. Families named but neither
    real nor generated (``independent``, ``none``) are left to the caller. The order is ``REAL_SAMPLES``' then
    ``GENERATED``'s, whatever ``families``'."""
    unsized = [f for f in GENERATED if f in families and f not in rows]
    if unsized:
        raise ValueError(f"build_panel: no rows given for the generated families {unsized}")
    work.mkdir(parents=True, exist_ok=True)
    entries = []
    for name in REAL_SAMPLES:
        directory, build = REAL_BUILDERS[name]
        if name in families and shared is not None and (shared / directory).exists():
            entries.append(build(shared / directory, work / name))
    for family, draws in GENERATED.items():
        if family not in families:
            continue
        for size in rows[family]:
            for seed in seeds:
                entries.extend(_seeded(work, group, seed, build) for group, build in draws(size))
    return entries


def _seeded(work: Path, group: str, seed: int, build: Callable[..., PanelEntry]) -> PanelEntry:
    """One seed's data set of ``group`` (a family at one size), built by ``build(directory, seed=seed)`` into
    ``<work>/<group>-s<seed>``."""
    return replace(build(work / f"{group}-s{seed}", seed=seed), group=group)
