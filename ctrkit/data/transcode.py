"""CSV or Parquet data described by a FeatureSpec -> split binary + a new feature_spec.yaml."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import polars as pl

from ctrkit.data.atomic import atomic_directory
from ctrkit.data.feature_spec import (
    AUTO,
    CATEGORICAL_CHANNEL,
    LABEL_CHANNEL,
    NUMERICAL_CHANNEL,
    Feature,
    FeatureSpec,
    SpecError,
    smallest_int_dtype,
    split_binary_spec,
)
from ctrkit.data.split_binary import DataError, SplitBinaryWriter, check_id_range

READABLE_CHANNELS = (CATEGORICAL_CHANNEL, NUMERICAL_CHANNEL, LABEL_CHANNEL)
WRITE_ROWS = 1 << 20


def _read_chunk_file(path: Path, kind: str, features: tuple[str, ...], floats: set[str]) -> pl.DataFrame:
    if not path.exists():
        raise DataError(f"{path}: file named in the feature spec's source_spec not found")
    schema = {f: pl.Float64 if f in floats else pl.Int64 for f in features}
    try:
        if kind == "csv":
            return pl.read_csv(path, has_header=False, schema=schema)
        df = pl.read_parquet(path, columns=list(features))
        return df.select([pl.col(f).cast(t) for f, t in schema.items()])
    except (pl.exceptions.PolarsError, OSError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise DataError(f"{path}: cannot read the columns {list(features)} as the spec describes: {first}") from None


def _read_mapping(spec: FeatureSpec, mapping: str) -> pl.DataFrame:
    """Every feature of ``mapping`` as one frame: chunks side by side, each chunk's files in order."""
    floats = set(spec.numerical_features) | {spec.label_feature}  # labels may be written 0.0 / 1.0
    parts = []
    for i, chunk in enumerate(spec.mapping(mapping)):
        if chunk.type not in ("csv", "parquet"):
            raise SpecError(f"source_spec.{mapping}[{i}]: transcoding reads csv or parquet chunks, got '{chunk.type}'")
        frames = [_read_chunk_file(spec.path_of(f), chunk.type, chunk.features, floats) for f in chunk.files]
        parts.append((chunk, pl.concat(frames)))
    rows = {len(df) for _, df in parts}
    if len(rows) > 1:
        detail = ", ".join(f"{list(c.files)}: {len(df)}" for c, df in parts)
        raise DataError(f"mapping '{mapping}': its chunks hold different numbers of rows ({detail})")
    return pl.concat([df for _, df in parts], how="horizontal")


def transcode(input_dir: str | os.PathLike, output_dir: str | os.PathLike, overwrite: bool = False) -> FeatureSpec:
    """Converts the CSV/Parquet dataset that ``input_dir/feature_spec.yaml`` describes.

    CSV files have no header and one column per feature of their chunk, in the chunk's order.
    Categorical values must be integer ids in ``[0, cardinality)``; ``cardinality: auto`` becomes
    the largest id seen in any mapping plus one. Labels must be 0 or 1. The output directory (split
    binary files and a new feature_spec.yaml) appears only when complete.
    """
    spec = FeatureSpec.from_yaml(input_dir)
    extra = set(spec.channel_spec) - set(READABLE_CHANNELS)
    if extra:
        raise SpecError(
            f"channel(s) {sorted(extra)} are not ones ctrkit models read; expected {', '.join(READABLE_CHANNELS)}"
        )
    frames = {m: _read_mapping(spec, m) for m in spec.source_spec}
    label = spec.label_feature
    categorical: dict[str, Feature] = {}
    for name in spec.categorical_features:
        feat = spec.feature_spec[name]
        lows = [int(df[name].min()) for df in frames.values() if len(df)]
        highs = [int(df[name].max()) for df in frames.values() if len(df)]
        if any(df[name].null_count() for df in frames.values()):
            raise DataError(f"feature '{name}': empty values; categorical ids must be present in every row")
        card = max(highs) + 1 if feat.cardinality == AUTO else int(feat.cardinality)
        if lows and min(lows) < 0:
            raise DataError(f"feature '{name}': negative id {min(lows)}; ids must lie in [0, cardinality)")
        if highs and max(highs) >= card:
            raise DataError(f"feature '{name}': id {max(highs)} is beyond its cardinality {card} in the feature spec")
        extra_meta = {k: v for k, v in feat.extra.items()}
        categorical[name] = Feature(smallest_int_dtype(card), card, extra_meta)
    for m, df in frames.items():
        bad = df.filter(~pl.col(label).is_in([0.0, 1.0]))
        if len(bad):
            raise DataError(f"mapping '{m}': label '{label}' must be 0 or 1, found {bad[label][0]}")
    nums = list(spec.numerical_features)
    with atomic_directory(output_dir, overwrite) as tmp:
        meta = {**spec.metadata, "transcoded_from": str(Path(input_dir))}
        base = split_binary_spec(categorical, nums, label, tuple(spec.source_spec), meta)
        out = FeatureSpec(base.feature_spec, base.source_spec, base.channel_spec, base.metadata, tmp)
        for m, df in frames.items():
            with SplitBinaryWriter(out, m) as writer:
                for lo in range(0, len(df), WRITE_ROWS):
                    part = df.slice(lo, WRITE_ROWS)
                    numerical = part.select(nums).fill_null(0.0).to_numpy() if nums else None
                    cats = [part[c].to_numpy() for c in categorical]
                    for c, col in zip(categorical, cats):
                        check_id_range(col, categorical[c].cardinality, c, f"mapping '{m}'")
                    writer.append(numerical, cats, part[label].to_numpy().astype(np.uint8))
        out.to_yaml(tmp / "feature_spec.yaml")
    return FeatureSpec.from_yaml(output_dir)


def generate_csv(spec_path: str | os.PathLike, out_dir: str | os.PathLike, rows: int = 1000, seed: int = 0) -> Path:
    """Random CSV files matching a CSV-type spec (ids in range, labels both 0 and 1), plus the spec.

    Every mapping gets ``rows`` rows; a chunk split over several files spreads them evenly.
    ``cardinality: auto`` features draw ids below 100.
    """
    spec = FeatureSpec.from_yaml(spec_path)
    if rows < 2:
        raise ValueError(f"--rows must be at least 2, got {rows}")
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
