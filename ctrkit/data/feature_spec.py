"""The FeatureSpec: the YAML file that describes a dataset's features, files and model channels.

The format is the one NVIDIA's DeepLearningExamples recommenders share (their "BYO dataset"
Feature Specification), so a ``feature_spec.yaml`` written by their tools loads unchanged:

```yaml
feature_spec:            # feature name -> metadata (dtype, cardinality, anything else is kept)
  cat_0.bin: {dtype: int32, cardinality: 7912889}
  num_0: {dtype: float16}
  label: {dtype: bool}
source_spec:             # mapping (train/test) -> chunks; each chunk: type, features, files
  train:
  - {type: split_binary, features: [num_0], files: [train/numerical.bin]}
channel_spec:            # channel -> feature names the model reads through it
  categorical: [cat_0.bin]
  numerical: [num_0]
  label: [label]
metadata: {}             # free-form
```

File paths in ``source_spec`` are relative to the directory holding the YAML file.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

CATEGORICAL_CHANNEL = "categorical"
NUMERICAL_CHANNEL = "numerical"
LABEL_CHANNEL = "label"
# optional: rows sharing this feature's value (e.g. an Outbrain display id) are ranked together for
# MAP@12; it may be stored in the test mapping only
MAP_CHANNEL = "map"
COMBINERS = ("sum", "mean")
# channel names NVIDIA's recommenders write, read as ctrkit's: Wide & Deep's Outbrain spec
# (onehot_categorical, multihot_categorical) and the FeatureSpec example of its documentation (numeric_inputs,
# categorical_user_inputs, categorical_item_inputs, label_ch); features of a multi-hot channel are
# multi-hot categorical features
CHANNEL_ALIASES = {
    "onehot_categorical": "categorical",
    "multihot_categorical": "categorical",
    "categorical_user_inputs": "categorical",
    "categorical_item_inputs": "categorical",
    "numeric_inputs": "numerical",
    "label_ch": "label",
}
MULTI_HOT_CHANNELS = ("multihot_categorical",)

CHUNK_TYPES = ("split_binary", "csv", "parquet")
MAX_CAPACITY = 2**31 - 1  # rows of a dynamic (raw-id) table at most: its id map holds rows as int32


def check_capacity(capacity: int | None, where: str = "`capacity`") -> None:
    """A one-line ValueError unless ``capacity`` (rows of a raw-id column's table) is None or 2 to MAX_CAPACITY."""
    if capacity is not None and not 2 <= capacity <= MAX_CAPACITY:
        raise ValueError(
            f"{where} must be from 2 rows (the rare row and one id) to {MAX_CAPACITY:,} (a dynamic table's rows are "
            f"int32), got {capacity:,}"
        )


INT_DTYPES = ("int8", "int16", "int32", "int64", "uint8")
FLOAT_DTYPES = ("float16", "float32", "float64")
FILE_DTYPES = INT_DTYPES + FLOAT_DTYPES + ("bool",)  # NumPy's names of a feature's values in its binary file
AUTO = "auto"
# what made a dataset, as the model carries it (``preprocess/transform.py`` writes and reads it)
PREPROCESSING_FILE = "preprocessing.json"
# files that hold raw rows, not a FeatureSpec (a dataset is made of them by ``ctrkit preprocess``)
RAW_TABLE_SUFFIXES = (".csv", ".tsv", ".txt", ".parquet", ".pq", ".gz")


class SpecError(ValueError):
    """A feature spec that is malformed or contradicts itself or the files it describes."""


def normalize_dtype(dtype: Any, where: str) -> str:
    """Returns the canonical dtype name; accepts ``int32``, ``torch.int32`` and ``np.int32`` forms."""
    if not isinstance(dtype, str):
        raise SpecError(f"{where}: dtype must be a string such as 'int32', got {dtype!r}")
    name = dtype.strip()
    for prefix in ("torch.", "np.", "numpy."):
        if name.startswith(prefix):
            name = name[len(prefix) :]
    if name not in FILE_DTYPES:
        raise SpecError(f"{where}: unknown dtype {dtype!r}; expected one of {', '.join(FILE_DTYPES)}")
    return name


def smallest_int_dtype(cardinality: int) -> str:
    """The smallest signed integer dtype that holds ids ``0..cardinality`` (NVIDIA's file convention)."""
    if cardinality <= 2**7 - 1:
        return "int8"
    if cardinality <= 2**15 - 1:
        return "int16"
    if cardinality <= 2**31 - 1:
        return "int32"
    return "int64"


LEGACY_MULTI_HOT_KEY = "multihot"


@dataclass(frozen=True)
class Feature:
    """One feature's metadata.

    Attributes:
        dtype: canonical dtype name of the values on disk (``int32``, ``float16``, ``bool``...).
        cardinality: number of distinct ids of a categorical feature (ids are ``0..cardinality-1``),
            ``"auto"`` when a transcoder is to infer it, ``None`` for non-categorical features.
        extra: any other metadata in the YAML, kept verbatim for the round trip.
    """

    dtype: str
    cardinality: int | str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def multi_hot(self) -> bool:
        """Several ids per sample (metadata ``multi_hot: true``; ``multihot: true``, the spelling of
        datasets written before ctrkit 0.2, is read the same), pooled by ``combiner``."""
        return bool(self.extra.get("multi_hot", self.extra.get(LEGACY_MULTI_HOT_KEY, False)))

    @property
    def dynamic(self) -> bool:
        """Raw 64-bit ids (metadata ``dynamic: true``) rather than vocabulary indices: the model maps them to the
        rows of a table of ``cardinality`` rows (its capacity) as training admits them (``models/dynamic.py``)."""
        return bool(self.extra.get("dynamic", False))

    @property
    def combiner(self) -> str:
        """How a multi-hot feature's embeddings are pooled: ``sum`` or ``mean`` (the default)."""
        return str(self.extra.get("combiner", "mean"))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.extra)
        out["dtype"] = self.dtype
        if self.cardinality is not None:
            out["cardinality"] = self.cardinality
        return out


@dataclass(frozen=True)
class Chunk:
    """A group of features stored together: ``files`` of ``type`` holding ``features`` in order."""

    type: str
    features: tuple[str, ...]
    files: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.type, "features": list(self.features), "files": list(self.files)}


@dataclass(frozen=True)
class FeatureSpec:
    """A parsed ``feature_spec.yaml``.

    Attributes:
        feature_spec: feature name -> Feature.
        source_spec: mapping name (``train``, ``test``) -> chunks.
        channel_spec: channel name -> feature names.
        metadata: free-form metadata.
        base_dir: directory file paths are relative to (the YAML's directory), or None.
    """

    feature_spec: Mapping[str, Feature]
    source_spec: Mapping[str, tuple[Chunk, ...]]
    channel_spec: Mapping[str, tuple[str, ...]]
    metadata: Mapping[str, Any] = field(default_factory=dict)
    base_dir: Path | None = None

    # ----------------------------------------------------------------------------------- loading
    @classmethod
    def from_yaml(cls, path: str | os.PathLike) -> FeatureSpec:
        """Loads and validates a spec; a directory means ``DIR/feature_spec.yaml``."""
        path = Path(path)
        if path.is_dir():
            path = path / "feature_spec.yaml"
        if not path.exists():
            raise SpecError(f"{path}: feature spec not found (expected a feature_spec.yaml file)")
        if path.suffix.lower() in RAW_TABLE_SUFFIXES:
            raise SpecError(
                f"{path}: a raw table, not a dataset; make a dataset of it first: `ctrkit preprocess table {path} "
                f"--out DIR --label COLUMN` (`ctrkit preprocess criteo` for Criteo's TSV files), then pass DIR"
            )
        try:
            with open(path) as f:
                raw = yaml.safe_load(f)
        except yaml.YAMLError as e:
            raise SpecError(f"{path}: not valid YAML: {e}") from None
        try:
            return cls.from_dict(raw, base_dir=path.parent)
        except SpecError as e:
            raise SpecError(f"{path}: {e}") from None

    @classmethod
    def from_dict(cls, raw: Any, base_dir: str | os.PathLike | None = None) -> FeatureSpec:
        """Builds and validates a spec from the YAML's dictionary form."""
        if not isinstance(raw, dict):
            raise SpecError(
                f"expected a mapping with feature_spec, source_spec, channel_spec; got {type(raw).__name__}"
            )
        unknown = set(raw) - {"feature_spec", "source_spec", "channel_spec", "metadata"}
        if unknown:
            raise SpecError(
                f"unknown top-level section(s) {sorted(unknown)}; expected feature_spec, "
                "source_spec, channel_spec and optionally metadata"
            )
        for section in ("feature_spec", "source_spec", "channel_spec"):
            if not isinstance(raw.get(section), dict):
                raise SpecError(f"section '{section}' is missing or not a mapping")

        channels, multi_hot = _canonical_channels(raw["channel_spec"])
        channel_of = {n: c for c, names in channels.items() for n in names}
        implied: set[str] = set()  # features whose dtype the channel implied (no 'dtype' in the YAML)
        features = {}
        for name, meta in raw["feature_spec"].items():
            where = f"feature_spec.{name}"
            if meta is None:
                meta = {}
            if not isinstance(meta, dict):
                raise SpecError(f"{where}: expected a mapping of metadata (dtype, cardinality), got {meta!r}")
            extra = {k: v for k, v in meta.items() if k not in ("dtype", "cardinality")}
            if name in multi_hot:
                extra.setdefault("multi_hot", True)
            dtype = meta.get("dtype") or _implied_dtype(channel_of.get(str(name)), meta.get("cardinality"))
            if dtype is None:
                raise SpecError(f"{where}: missing 'dtype' (only features of a model channel may leave it out)")
            features[str(name)] = Feature(normalize_dtype(dtype, where), meta.get("cardinality"), extra)
            if "dtype" not in meta:
                implied.add(str(name))

        sources = {}
        for mapping, chunks in raw["source_spec"].items():
            where = f"source_spec.{mapping}"
            if not isinstance(chunks, list):
                raise SpecError(f"{where}: expected a list of chunks, got {chunks!r}")
            parsed = []
            for i, chunk in enumerate(chunks):
                cw = f"{where}[{i}]"
                if not isinstance(chunk, dict) or not {"type", "features", "files"} <= set(chunk):
                    raise SpecError(f"{cw}: a chunk needs 'type', 'features' and 'files', got {chunk!r}")
                for key in ("features", "files"):
                    if not isinstance(chunk[key], list) or not all(isinstance(x, str) for x in chunk[key]):
                        raise SpecError(f"{cw}.{key}: expected a list of strings, got {chunk[key]!r}")
                parsed.append(Chunk(str(chunk["type"]), tuple(chunk["features"]), tuple(chunk["files"])))
            sources[str(mapping)] = tuple(parsed)

        for mapping, chunks in sources.items():
            for i, chunk in enumerate(chunks):
                stored = [n for n in chunk.features if n in implied]
                if chunk.type == "split_binary" and stored:
                    raise SpecError(
                        f"feature_spec.{stored[0]}: missing 'dtype'; source_spec.{mapping}[{i}] stores it in "
                        "split_binary files, whose values are read as that dtype"
                    )

        metadata = raw.get("metadata") or {}
        if not isinstance(metadata, dict):
            raise SpecError(f"metadata: expected a mapping, got {metadata!r}")
        spec = cls(features, sources, channels, metadata, Path(base_dir) if base_dir is not None else None)
        spec.validate()
        return spec

    # ---------------------------------------------------------------------------------- saving
    def to_dict(self) -> dict[str, Any]:
        return {
            "channel_spec": {c: list(f) for c, f in self.channel_spec.items()},
            "feature_spec": {n: f.to_dict() for n, f in self.feature_spec.items()},
            "metadata": dict(self.metadata),
            "source_spec": {m: [c.to_dict() for c in chunks] for m, chunks in self.source_spec.items()},
        }

    def to_yaml(self, path: str | os.PathLike) -> None:
        """Writes the spec atomically (temp file in the same directory, then rename)."""
        from ctrkit.data.atomic import atomic_file

        with atomic_file(path) as tmp, open(tmp, "w") as f:
            yaml.safe_dump(self.to_dict(), f, sort_keys=False)

    # ------------------------------------------------------------------------------ validation
    def validate(self) -> None:
        """Checks internal consistency; raises SpecError naming the section, feature and expectation."""
        for name, feat in self.feature_spec.items():
            card = feat.cardinality
            if card is None or card == AUTO:
                continue
            if isinstance(card, bool) or not isinstance(card, int) or card < 1:
                raise SpecError(f"feature_spec.{name}.cardinality: expected a positive integer or 'auto', got {card!r}")
        for channel, names in self.channel_spec.items():
            for n in names:
                if n not in self.feature_spec:
                    raise SpecError(f"channel_spec.{channel}: feature '{n}' is not defined in feature_spec")
        for mapping, chunks in self.source_spec.items():
            seen: dict[str, int] = {}
            for i, chunk in enumerate(chunks):
                where = f"source_spec.{mapping}[{i}]"
                if chunk.type not in CHUNK_TYPES:
                    raise SpecError(
                        f"{where}.type: unknown chunk type '{chunk.type}'; expected one of {', '.join(CHUNK_TYPES)}"
                    )
                if not chunk.files:
                    raise SpecError(f"{where}.files: empty; expected at least one file")
                for n in chunk.features:
                    if n not in self.feature_spec:
                        raise SpecError(f"{where}: feature '{n}' is not defined in feature_spec")
                    if n in seen:
                        raise SpecError(
                            f"{where}: feature '{n}' is already stored in chunk {seen[n]} "
                            "of this mapping; each feature may appear once per mapping"
                        )
                    seen[n] = i
            for channel, names in self.channel_spec.items():
                if channel == MAP_CHANNEL:
                    continue
                for n in names:
                    if n not in seen:
                        raise SpecError(
                            f"source_spec.{mapping}: feature '{n}' of channel '{channel}' is "
                            "not stored in any chunk of this mapping"
                        )
        for n in self.channel_spec.get(CATEGORICAL_CHANNEL, ()):
            feat = self.feature_spec[n]
            if feat.dtype not in INT_DTYPES:
                raise SpecError(
                    f"feature_spec.{n}.dtype: categorical features need an integer dtype, got '{feat.dtype}'"
                )
            if feat.cardinality is None:
                raise SpecError(
                    f"feature_spec.{n}: categorical feature has no 'cardinality' "
                    "(expected a positive integer, or 'auto' before transcoding)"
                )
            if feat.dynamic and (feat.dtype != "int64" or feat.multi_hot):
                raise SpecError(
                    f"feature_spec.{n}: a dynamic feature holds one raw 64-bit id a sample: expected dtype int64 "
                    f"and no multi_hot, got {feat.dtype}{' and multi_hot' if feat.multi_hot else ''}"
                )
            if feat.dynamic and isinstance(feat.cardinality, int) and feat.cardinality < 2:
                raise SpecError(f"feature_spec.{n}.cardinality: a dynamic table needs at least 2 rows (its capacity)")
            if feat.multi_hot and feat.combiner not in COMBINERS:
                raise SpecError(
                    f"feature_spec.{n}.combiner: expected one of {', '.join(COMBINERS)}, got {feat.combiner!r}"
                )
        for name, feat in self.feature_spec.items():
            if feat.multi_hot and name not in self.channel_spec.get(CATEGORICAL_CHANNEL, ()):
                raise SpecError(f"feature_spec.{name}: multi_hot applies to categorical features only")
        groups = self.channel_spec.get(MAP_CHANNEL)
        if groups is not None:
            if len(groups) != 1:
                raise SpecError(
                    f"channel_spec.map: expected exactly one group feature (e.g. a display id), got {list(groups)}"
                )
            if self.feature_spec[groups[0]].dtype not in INT_DTYPES:
                raise SpecError(
                    f"feature_spec.{groups[0]}.dtype: the map channel's group ids need an integer dtype, "
                    f"got '{self.feature_spec[groups[0]].dtype}'"
                )
        labels = self.channel_spec.get(LABEL_CHANNEL)
        if labels is not None and len(labels) != 1:
            raise SpecError(f"channel_spec.label: expected exactly one label feature, got {list(labels)}")

    # ------------------------------------------------------------------------------- accessors
    def channel(self, name: str) -> tuple[str, ...]:
        """Feature names of a channel; an absent channel is empty."""
        return tuple(self.channel_spec.get(name, ()))

    @property
    def categorical_features(self) -> tuple[str, ...]:
        return self.channel(CATEGORICAL_CHANNEL)

    @property
    def numerical_features(self) -> tuple[str, ...]:
        return self.channel(NUMERICAL_CHANNEL)

    @property
    def group_feature(self) -> str | None:
        """The map channel's feature (rows ranked together for MAP@12), or None."""
        groups = self.channel(MAP_CHANNEL)
        return groups[0] if groups else None

    @property
    def label_feature(self) -> str:
        labels = self.channel(LABEL_CHANNEL)
        if not labels:
            raise SpecError("channel_spec has no 'label' channel; training and evaluation need one")
        return labels[0]

    @property
    def cardinalities(self) -> list[int]:
        """Cardinalities of the one-hot categorical features, in channel order."""
        return self._cardinalities(self.onehot_features)

    @property
    def onehot_features(self) -> tuple[str, ...]:
        """Categorical features with one id per sample, in channel order."""
        return tuple(n for n in self.categorical_features if not self.feature_spec[n].multi_hot)

    @property
    def dynamic_features(self) -> tuple[str, ...]:
        """One-hot features of raw 64-bit ids (``Feature.dynamic``), in channel order."""
        return tuple(n for n in self.onehot_features if self.feature_spec[n].dynamic)

    @property
    def multi_hot_features(self) -> tuple[str, ...]:
        """Categorical features with a variable number of ids per sample, in channel order."""
        return tuple(n for n in self.categorical_features if self.feature_spec[n].multi_hot)

    @property
    def multi_hot_cardinalities(self) -> list[int]:
        return self._cardinalities(self.multi_hot_features)

    @property
    def multi_hot_combiners(self) -> list[str]:
        return [self.feature_spec[n].combiner for n in self.multi_hot_features]

    def _cardinalities(self, names: Sequence[str]) -> list[int]:
        out = []
        for n in names:
            card = self.feature_spec[n].cardinality
            if not isinstance(card, int):
                raise SpecError(
                    f"feature_spec.{n}.cardinality is {card!r}; a model needs an integer "
                    "(transcode the data so cardinalities are inferred)"
                )
            out.append(card)
        return out

    def mapping(self, name: str) -> tuple[Chunk, ...]:
        if name not in self.source_spec:
            raise SpecError(f"source_spec has no mapping '{name}'; available: {sorted(self.source_spec)}")
        return self.source_spec[name]

    def path_of(self, file: str) -> Path:
        """Resolves a file named in source_spec against the YAML's directory."""
        p = Path(file)
        if p.is_absolute() or self.base_dir is None:
            return p
        return self.base_dir / p

    def summary(self) -> dict[str, Any]:
        """What a model trained on this spec depends on (stored in checkpoints to catch mismatches)."""
        out = {
            "categorical_features": list(self.onehot_features),
            "cardinalities": self.cardinalities,
            "numerical_features": list(self.numerical_features),
            "label": self.label_feature,
        }
        if self.metadata.get("vocabulary_fingerprint"):  # what the ids mean (``integrity.vocabulary_fingerprint``)
            out["vocabulary"] = str(self.metadata["vocabulary_fingerprint"])
        if self.metadata.get("extends_vocabulary"):  # the vocabularies these extend (``preprocess table --like``)
            out["extends"] = [str(f) for f in self.metadata["extends_vocabulary"]]
        if self.dynamic_features:
            out["dynamic_features"] = list(self.dynamic_features)
        if self.multi_hot_features:
            out["multi_hot_features"] = list(self.multi_hot_features)
            out["multi_hot_cardinalities"] = self.multi_hot_cardinalities
            out["multi_hot_combiners"] = self.multi_hot_combiners
        return out


def _canonical_channels(raw: Mapping[str, Any]) -> tuple[dict[str, tuple[str, ...]], set[str]]:
    """channel_spec with NVIDIA's channel names (CHANNEL_ALIASES) merged into ctrkit's, in the YAML's
    order, and the features of multi-hot channels."""
    channels: dict[str, list[str]] = {}
    multi_hot: set[str] = set()
    for channel, names in raw.items():
        if names is None:
            names = []
        if not isinstance(names, list) or not all(isinstance(x, str) for x in names):
            raise SpecError(f"channel_spec.{channel}: expected a list of feature names, got {names!r}")
        target = CHANNEL_ALIASES.get(str(channel), str(channel))
        merged = channels.setdefault(target, [])
        for n in names:
            if n in merged:
                raise SpecError(f"channel_spec.{channel}: feature '{n}' is already in channel '{target}'")
            merged.append(n)
        if channel in MULTI_HOT_CHANNELS:
            multi_hot.update(names)
    return {c: tuple(n) for c, n in channels.items()}, multi_hot


def _implied_dtype(channel: str | None, cardinality: Any) -> str | None:
    """The dtype a feature without one is read as (NVIDIA's Wide & Deep spec gives parquet columns none):
    ids as the smallest integer type of their cardinality, numericals and labels as float32."""
    if channel == CATEGORICAL_CHANNEL:
        return smallest_int_dtype(cardinality) if isinstance(cardinality, int) and cardinality > 0 else "int64"
    if channel == MAP_CHANNEL:
        return "int64"
    if channel in (NUMERICAL_CHANNEL, LABEL_CHANNEL):
        return "float32"
    return None
