"""Feature specs built in code: a split-binary dataset's spec from its features, and the Criteo-shaped spec of
synthetic data."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ctrkit.data.feature_spec import (
    CATEGORICAL_CHANNEL,
    LABEL_CHANNEL,
    MAP_CHANNEL,
    NUMERICAL_CHANNEL,
    Chunk,
    Feature,
    FeatureSpec,
    smallest_int_dtype,
)


def split_binary_spec(
    categorical: Mapping[str, Feature],
    numerical: Sequence[str],
    label: str = "label",
    mappings: Sequence[str] = ("train", "test"),
    metadata: Mapping[str, Any] | None = None,
    numerical_dtype: str = "float16",
    group: tuple[str, Feature, Sequence[str]] | None = None,
) -> FeatureSpec:
    """A spec in NVIDIA's split-binary layout: per mapping, ``numerical.bin`` (all numerical features,
    ``numerical_dtype``: float16 as NVIDIA's, or float32), ``label.bin`` and one file per categorical
    feature named after it (``.bin`` appended unless the name ends with it).

    Args:
        categorical: categorical feature name -> Feature (dtype and cardinality), in channel order.
        numerical: numerical feature names, in channel order.
        label: the label feature's name.
        mappings: the mappings to lay out.
        metadata: the spec's metadata section.
        group: the map channel's feature (rows ranked together for MAP@12): its name, Feature and the
            mappings that store it (``{name}.bin``).
    """
    features: dict[str, Feature] = dict(categorical)
    for name in numerical:
        features[name] = Feature(numerical_dtype)
    features[label] = Feature("bool")
    file_of = {c: c if c.endswith(".bin") else f"{c}.bin" for c in categorical}
    sources = {}
    for m in mappings:
        chunks = []
        if numerical:
            chunks.append(Chunk("split_binary", tuple(numerical), (f"{m}/numerical.bin",)))
        chunks.append(Chunk("split_binary", (label,), (f"{m}/label.bin",)))
        for c, feature in categorical.items():  # a multi-hot feature's ids, then its offsets
            offsets = (f"{m}/{c}.offsets.bin",) if feature.multi_hot else ()
            chunks.append(Chunk("split_binary", (c,), (f"{m}/{file_of[c]}", *offsets)))
        if group is not None and m in group[2]:
            chunks.append(Chunk("split_binary", (group[0],), (f"{m}/{group[0]}.bin",)))
        sources[m] = tuple(chunks)
    channels = {CATEGORICAL_CHANNEL: tuple(categorical), NUMERICAL_CHANNEL: tuple(numerical), LABEL_CHANNEL: (label,)}
    if group is not None:
        features[group[0]] = group[1]
        channels[MAP_CHANNEL] = (group[0],)
    spec = FeatureSpec(features, sources, channels, dict(metadata or {}))
    spec.validate()
    return spec


def criteo_like_spec(
    cardinalities: Sequence[int],
    num_numerical: int,
    mappings: Sequence[str] = ("train", "test"),
    numerical_dtype: str = "float16",
) -> FeatureSpec:
    """A split-binary spec laid out as NVIDIA's Criteo datasets are (``cat_i.bin``, ``num_i``, ``label``)."""
    categorical = {f"cat_{i}.bin": Feature(smallest_int_dtype(c), int(c)) for i, c in enumerate(cardinalities)}
    names = [f"num_{i}" for i in range(num_numerical)]
    return split_binary_spec(categorical, names, "label", mappings, numerical_dtype=numerical_dtype)
