"""CSV or Parquet data described by a FeatureSpec -> split binary + a new feature_spec.yaml."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import polars as pl

from ctrkit.columns import label_of
from ctrkit.data.atomic import atomic_directory
from ctrkit.data.feature_spec import (
    AUTO,
    CATEGORICAL_CHANNEL,
    LABEL_CHANNEL,
    MAP_CHANNEL,
    NUMERICAL_CHANNEL,
    Feature,
    FeatureSpec,
    SpecError,
    smallest_int_dtype,
)
from ctrkit.data.spec_builders import split_binary_spec
from ctrkit.data.split_binary import DataError, SplitBinaryWriter
from ctrkit.field_types import ROW_BLOCK

READABLE_CHANNELS = (CATEGORICAL_CHANNEL, NUMERICAL_CHANNEL, LABEL_CHANNEL, MAP_CHANNEL)
DEFAULT_CHUNK_ROWS = 1 << 20
FLOAT16_MAX = float(np.finfo(np.float16).max)  # 65504: larger numericals are stored as float32


def _read_error(path: Path, features: tuple[str, ...], e: Exception) -> DataError:
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return DataError(f"{path}: cannot read the columns {list(features)} as the spec describes: {first}")


def _file_batches(path: Path, kind: str, features: tuple[str, ...], floats: set[str], lists: set[str], rows: int):
    """Frames of at most ``rows`` rows of one CSV or Parquet file, streamed (never the whole file).
    Features in ``lists`` (multi-hot) are parquet list columns of ids."""
    if not path.exists():
        raise DataError(f"{path}: file named in the feature spec's source_spec not found")
    schema = {f: pl.Float64 if f in floats else pl.List(pl.Int64) if f in lists else pl.Int64 for f in features}
    try:
        if kind == "csv":
            listed = [f for f in features if f in lists]
            if listed:
                raise DataError(
                    f"{path}: multi-hot feature '{listed[0]}' cannot be read from CSV; store multi-hot features "
                    "as parquet list columns"
                )
            lazy = pl.scan_csv(path, has_header=False, schema=schema)
        else:
            lazy = pl.scan_parquet(path).select([pl.col(f).cast(t) for f, t in schema.items()])
        yield from lazy.collect_batches(chunk_size=rows)
    except (pl.exceptions.PolarsError, OSError) as e:
        raise _read_error(path, features, e) from None


def _chunk_batches(spec: FeatureSpec, mapping: str, i: int, floats: set[str], lists: set[str], rows: int):
    """Frames of exactly ``rows`` rows (the last may be shorter) over the files of one chunk, in order."""
    chunk = spec.mapping(mapping)[i]
    if chunk.type not in ("csv", "parquet"):
        raise SpecError(f"source_spec.{mapping}[{i}]: transcoding reads csv or parquet chunks, got '{chunk.type}'")
    pending: list[pl.DataFrame] = []
    held = 0
    for f in chunk.files:
        for batch in _file_batches(spec.path_of(f), chunk.type, chunk.features, floats, lists, rows):
            pending.append(batch)
            held += len(batch)
            while held >= rows:
                joined = pl.concat(pending)
                yield joined.head(rows)
                pending, held = [joined.slice(rows)], held - rows
    if held:
        yield pl.concat(pending)


def _mapping_batches(spec: FeatureSpec, mapping: str, rows: int):
    """Every feature of ``mapping``, ``rows`` rows at a time: chunks side by side, each chunk's files in order."""
    floats = set(spec.numerical_features) | {spec.label_feature}  # labels may be written 0.0 / 1.0
    chunks = spec.mapping(mapping)
    lists = set(spec.multi_hot_features)
    streams = [_chunk_batches(spec, mapping, i, floats, lists, rows) for i in range(len(chunks))]
    done = 0
    while True:
        parts = [next(s, None) for s in streams]
        if all(p is None for p in parts):
            return
        if any(p is None or len(p) != len(parts[0]) for p in parts):
            detail = ", ".join(f"{list(c.files)}: {done + (0 if p is None else len(p))}" for c, p in zip(chunks, parts))
            raise DataError(f"mapping '{mapping}': its chunks hold different numbers of rows (at least {detail})")
        done += len(parts[0])
        yield pl.concat(parts, how="horizontal")


class _Stats:
    """What pass 1 learns of each categorical feature (id range, empties) and of the labels."""

    def __init__(self, names: list[str], numerical: list[str], lists: set[str], group: str | None):
        self.lists, self.group = lists, group
        self.low = dict.fromkeys(names)
        self.high = dict.fromkeys(names)
        self.numerical = numerical
        self.largest = 0.0  # the largest |numerical value|

    def update(self, mapping: str, df: pl.DataFrame, label: str, offset: int) -> None:
        for name in self.numerical:
            values = df[name].to_numpy()
            finite = np.isfinite(values) | np.isnan(values) & df[name].is_null().to_numpy()  # empty: missing, 0
            if not finite.all():
                row = int(np.argmin(finite))
                raise DataError(
                    f"numerical feature '{name}' is {values[row]} in mapping '{mapping}' row {offset + row}; "
                    "numerical values must be finite (leave a value empty for missing)"
                )
            if len(values):
                self.largest = max(self.largest, float(np.nanmax(np.abs(values), initial=0.0)))
        for name in self.low:
            if name in self.lists:  # multi-hot: a missing list is an empty one
                ids, _ = _flatten(df[name])
                if len(ids):
                    lo, hi = int(ids.min()), int(ids.max())
                    self.low[name] = lo if self.low[name] is None else min(self.low[name], lo)
                    self.high[name] = hi if self.high[name] is None else max(self.high[name], hi)
                continue
            if df[name].null_count():
                row = offset + int(df[name].is_null().arg_max())
                raise DataError(
                    f"feature '{name}': empty value in mapping '{mapping}' row {row}; categorical ids must be "
                    "present in every row"
                )
            lo, hi = int(df[name].min()), int(df[name].max())
            self.low[name] = lo if self.low[name] is None else min(self.low[name], lo)
            self.high[name] = hi if self.high[name] is None else max(self.high[name], hi)
        if self.group is not None and self.group in df.columns and df[self.group].null_count():
            row = offset + int(df[self.group].is_null().arg_max())
            raise DataError(f"map-channel feature '{self.group}': empty value in mapping '{mapping}' row {row}")
        problems = df.select(label_of(pl.col(label), f"mapping '{mapping}': label '{label}'")[1]).to_series()
        if problems.null_count() != len(problems):
            raise DataError(problems.drop_nulls()[0])


def transcode(
    input_dir: str | os.PathLike,
    output_dir: str | os.PathLike,
    overwrite: bool = False,
    chunk_size: int = DEFAULT_CHUNK_ROWS,
) -> FeatureSpec:
    """Converts the CSV/Parquet dataset that ``input_dir/feature_spec.yaml`` describes.

    CSV files have no header and one column per feature of their chunk, in the chunk's order.
    Categorical values must be integer ids in ``[0, cardinality)``; ``cardinality: auto`` becomes
    the largest id seen in any mapping plus one. Labels must be 0 or 1. The input is read twice
    (ranges, then writing), ``chunk_size`` rows at a time, so memory does not grow with the data.
    The output directory (split binary files and a new feature_spec.yaml) appears only when complete.
    """
    ROW_BLOCK.check("chunk_size", chunk_size)
    spec = FeatureSpec.from_yaml(input_dir)
    extra = set(spec.channel_spec) - set(READABLE_CHANNELS)
    if extra:
        raise SpecError(
            f"channel(s) {sorted(extra)} are not ones ctrkit models read; expected {', '.join(READABLE_CHANNELS)}"
        )
    label = spec.label_feature
    lists, group = set(spec.multi_hot_features), spec.group_feature
    stats = _Stats(list(spec.categorical_features), list(spec.numerical_features), lists, group)
    for m in spec.source_spec:
        offset = 0
        for df in _mapping_batches(spec, m, chunk_size):
            stats.update(m, df, label, offset)
            offset += len(df)
    categorical: dict[str, Feature] = {}
    for name in spec.categorical_features:
        feat = spec.feature_spec[name]
        low, high = stats.low[name], stats.high[name]
        card = (high or 0) + 1 if feat.cardinality == AUTO else int(feat.cardinality)
        if low is not None and low < 0:
            raise DataError(f"feature '{name}': negative id {low}; ids must lie in [0, cardinality)")
        if high is not None and high >= card:
            raise DataError(f"feature '{name}': id {high} is beyond its cardinality {card} in the feature spec")
        categorical[name] = Feature(smallest_int_dtype(card), card, dict(feat.extra))
    nums = list(spec.numerical_features)
    with atomic_directory(output_dir, overwrite) as tmp:
        meta = {**spec.metadata, "transcoded_from": str(Path(input_dir))}
        numerical_dtype = "float16" if stats.largest <= FLOAT16_MAX else "float32"
        stored_in = [m for m in spec.source_spec if any(group in c.features for c in spec.mapping(m))]
        groups = (group, Feature("int64"), stored_in) if group is not None else None
        base = split_binary_spec(categorical, nums, label, tuple(spec.source_spec), meta, numerical_dtype, groups)
        out = FeatureSpec(base.feature_spec, base.source_spec, base.channel_spec, base.metadata, tmp)
        onehot, multi_hot = out.onehot_features, out.multi_hot_features
        for m in spec.source_spec:
            with SplitBinaryWriter(out, m) as writer:  # it range-checks every id it writes
                for part in _mapping_batches(spec, m, chunk_size):
                    numerical = part.select(nums).fill_null(0.0).to_numpy() if nums else None
                    cats = [part[c].to_numpy() for c in onehot]
                    multi = [_flatten(part[c]) for c in multi_hot]
                    ids = part[group].to_numpy() if group is not None and m in stored_in else None
                    writer.append(numerical, cats, part[label].to_numpy().astype(np.uint8), multi, ids)
        out.to_yaml(tmp / "feature_spec.yaml")
    return FeatureSpec.from_yaml(output_dir)


def _flatten(column: pl.Series) -> tuple[np.ndarray, np.ndarray]:
    """A list column's ids, concatenated, and each row's count (a missing list counts as empty)."""
    column = column.list.drop_nulls()
    lengths = column.list.len().fill_null(0).to_numpy().astype(np.int64)
    values = column.explode().drop_nulls().to_numpy().astype(np.int64)
    return values, lengths


def generate_csv(spec_path: str | os.PathLike, out_dir: str | os.PathLike, rows: int = 1000, seed: int = 0) -> Path:
    """Random CSV files matching a CSV-type spec (ids in range, labels both 0 and 1), plus the spec.

    Every mapping gets ``rows`` rows; a chunk split over several files spreads them evenly.
    ``cardinality: auto`` features draw ids below 100.
    """
    spec = FeatureSpec.from_yaml(spec_path)
    if rows < 2:
        raise ValueError(f"`rows` must be at least 2, got {rows}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    numerical, label = set(spec.numerical_features), spec.label_feature
    for mapping, chunks in spec.source_spec.items():
        labels = rng.permutation(np.arange(rows) % 2)  # both classes, shuffled
        for i, chunk in enumerate(chunks):
            if chunk.type != "csv":
                raise SpecError(f"source_spec.{mapping}[{i}]: gen-csv writes csv chunks, got '{chunk.type}'")
            columns = {}
            for f in chunk.features:
                if f == label:
                    columns[f] = labels
                elif f in numerical:
                    columns[f] = np.round(rng.normal(0.0, 1.0, rows), 4)
                else:
                    card = spec.feature_spec[f].cardinality
                    columns[f] = rng.integers(0, 100 if card in (AUTO, None) else int(card), rows)
            frame = pl.DataFrame(columns)
            bounds = np.linspace(0, rows, len(chunk.files) + 1).astype(int)
            for file, lo, hi in zip(chunk.files, bounds[:-1], bounds[1:]):
                path = out / file
                path.parent.mkdir(parents=True, exist_ok=True)
                frame.slice(int(lo), int(hi - lo)).write_csv(path, include_header=False)
    spec.to_yaml(out / "feature_spec.yaml")
    return out
