"""NVIDIA's split-binary dataset format: one headerless binary column file per feature group.

Per mapping (``train/``, ``test/``): ``label.bin`` (one byte per sample), ``numerical.bin``
(row-major ``[N, n_numerical]``, float16), and one file per categorical feature whose dtype is the
one its ``feature_spec`` entry names (int8/int16/int32/int64). Files are memory-mapped, never read
whole, and checked on open: sizes must agree and ids must lie in ``[0, cardinality)``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ctrkit.data.feature_spec import INT_DTYPES, FeatureSpec, SpecError

_LABEL_DTYPES = ("bool", "int8", "uint8")


class DataError(ValueError):
    """A data file that is missing, truncated, or holds values its spec forbids."""


@dataclass
class SplitBinaryMapping:
    """The memory-mapped columns of one mapping.

    Attributes:
        num_samples: N.
        labels: (N,) one-byte labels.
        numerical: (N, n_numerical) float array, or None when the spec has no numerical features.
        categorical: one (N,) integer array per categorical feature, in channel order.
        files: every file used, by feature group, for messages.
        groups: (N,) group ids of the map channel when this mapping stores them, else None.
        multi_hot: per multi-hot feature (channel order): its (nnz,) ids and (N + 1,) int64 offsets;
            sample i's ids are ``values[offsets[i]:offsets[i + 1]]``.
    """

    num_samples: int
    labels: np.ndarray
    numerical: np.ndarray | None
    categorical: list[np.ndarray]
    files: dict[str, Path]
    groups: np.ndarray | None = None
    multi_hot: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)


def _memmap(path: Path, dtype: np.dtype, width: int, what: str) -> np.ndarray:
    if not path.exists():
        raise DataError(f"{path}: file of {what} not found (named in the feature spec's source_spec)")
    size = path.stat().st_size
    row = dtype.itemsize * width
    if size % row:
        raise DataError(
            f"{path}: {size} bytes is not a whole number of rows of {what} "
            f"({width} x {dtype.name} = {row} bytes per sample); the file is truncated "
            "or its dtype in the feature spec is wrong"
        )
    n = size // row
    if n == 0:
        return np.zeros((0, width) if width > 1 else (0,), dtype=dtype)
    arr = np.memmap(path, dtype=dtype, mode="r", shape=(n, width) if width > 1 else (n,))
    return arr


def open_mapping(spec: FeatureSpec, mapping: str, check_ids: bool = True) -> SplitBinaryMapping:
    """Opens a split-binary mapping of ``spec`` and checks it against the spec.

    Args:
        spec: the dataset's FeatureSpec (file paths resolve against its directory).
        mapping: ``train`` or ``test`` (any mapping in ``source_spec``).
        check_ids: scan every categorical file once for ids outside ``[0, cardinality)``, and the
            numerical file for NaN and infinite values.

    Raises:
        SpecError: the spec's layout is not a split-binary one this reader supports.
        DataError: a file is missing, mis-sized, of a different length than the others, or holds an
            id outside its feature's range.
    """
    # one job: a mapping opened channel by channel (label, numbers, ids, multi-hot, groups), each with its spec's
    # check, then the channels checked against each other
    chunks = spec.mapping(mapping)
    cats = spec.onehot_features
    multi = set(spec.multi_hot_features)
    nums = spec.numerical_features
    label = spec.label_feature
    chunk_of: dict[str, int] = {}
    for i, chunk in enumerate(chunks):
        where = f"source_spec.{mapping}[{i}]"
        if chunk.type != "split_binary":
            raise SpecError(
                f"{where}: chunk type '{chunk.type}' cannot be read directly; expected "
                "'split_binary' (convert CSV/Parquet data with a transcoder first)"
            )
        expected_files = 2 if len(chunk.features) == 1 and chunk.features[0] in multi else 1
        if len(chunk.files) != expected_files:
            what = "two files (values, offsets) for a multi-hot feature" if expected_files == 2 else "exactly one file"
            raise SpecError(f"{where}: split_binary chunks hold {what}, got {list(chunk.files)}")
        for f in chunk.features:
            chunk_of[f] = i

    files: dict[str, Path] = {}
    columns: dict[str, np.ndarray] = {}

    # labels: one chunk of its own
    lchunk = chunks[chunk_of[label]]
    if lchunk.features != (label,):
        raise SpecError(
            f"source_spec.{mapping}: the label '{label}' must be alone in its chunk, found with {list(lchunk.features)}"
        )
    ldtype = spec.feature_spec[label].dtype
    if ldtype not in _LABEL_DTYPES:
        raise SpecError(
            f"feature_spec.{label}.dtype: labels are one byte per sample, expected one of "
            f"{_LABEL_DTYPES}, got '{ldtype}'"
        )
    files["label"] = spec.path_of(lchunk.files[0])
    columns["label"] = _memmap(files["label"], np.dtype(np.uint8), 1, f"label '{label}'")

    # numerical: all in one chunk, in channel order
    numerical = None
    if nums:
        idx = {chunk_of[n] for n in nums}
        nchunk = chunks[next(iter(idx))]
        if len(idx) != 1 or nchunk.features != nums:
            raise SpecError(
                f"source_spec.{mapping}: all numerical features must be stored in one "
                f"split_binary chunk in channel_spec order {list(nums)}"
            )
        dtypes = {spec.feature_spec[n].dtype for n in nums}
        if len(dtypes) != 1 or next(iter(dtypes)) not in ("float16", "float32"):
            raise SpecError(
                f"feature_spec: numerical features must all be float16 (or all float32), got {sorted(dtypes)}"
            )
        files["numerical"] = spec.path_of(nchunk.files[0])
        numerical = _memmap(files["numerical"], np.dtype(dtypes.pop()), len(nums), "numerical features")
        if len(nums) == 1:
            numerical = numerical.reshape(-1, 1)
        columns["numerical"] = numerical

    categorical = []
    for name in cats:
        chunk = chunks[chunk_of[name]]
        if chunk.features != (name,):
            raise SpecError(
                f"source_spec.{mapping}: categorical feature '{name}' must be alone in its "
                f"chunk, found with {list(chunk.features)}"
            )
        dtype = spec.feature_spec[name].dtype
        if dtype not in INT_DTYPES:
            raise SpecError(f"feature_spec.{name}.dtype: expected an integer type, got '{dtype}'")
        files[name] = spec.path_of(chunk.files[0])
        arr = _memmap(files[name], np.dtype(dtype), 1, f"categorical feature '{name}'")
        columns[name] = arr
        categorical.append(arr)

    multi_hot = []
    for name in spec.multi_hot_features:
        chunk = chunks[chunk_of[name]]
        if chunk.features != (name,):
            raise SpecError(
                f"source_spec.{mapping}: multi-hot feature '{name}' must be alone in its chunk, "
                f"found with {list(chunk.features)}"
            )
        values_path, offsets_path = spec.path_of(chunk.files[0]), spec.path_of(chunk.files[1])
        files[name] = values_path
        values = _memmap(values_path, np.dtype(spec.feature_spec[name].dtype), 1, f"multi-hot feature '{name}'")
        offsets = _memmap(offsets_path, np.dtype(np.int64), 1, f"offsets of multi-hot feature '{name}'")
        _check_offsets(offsets, len(values), name, offsets_path)
        files[f"{name} offsets"] = offsets_path
        columns[f"{name} offsets"] = offsets[1:]  # N entries, for the sample-count check
        multi_hot.append((values, offsets))

    group = spec.group_feature
    if group is not None and group in chunk_of:
        chunk = chunks[chunk_of[group]]
        if chunk.features != (group,):
            raise SpecError(
                f"source_spec.{mapping}: the map channel's feature '{group}' must be alone in its "
                f"chunk, found with {list(chunk.features)}"
            )
        files["map"] = spec.path_of(chunk.files[0])
        columns["map"] = _memmap(files["map"], np.dtype(spec.feature_spec[group].dtype), 1, f"group ids '{group}'")

    counts = {k: len(v) for k, v in columns.items()}
    n = counts["label"]
    if len(set(counts.values())) != 1:
        detail = ", ".join(f"{files[k]}: {c}" for k, c in counts.items() if c != n)
        raise DataError(
            f"mapping '{mapping}': files hold different numbers of samples; {files['label']} has {n}, but {detail}"
        )

    if n and len(columns["label"]):
        lmax = int(columns["label"].max())
        if lmax > 1:
            pos = int(np.argmax(columns["label"] > 1))
            raise DataError(f"{files['label']}: sample {pos} has label {lmax}; labels must be 0 or 1")
    if check_ids and n and numerical is not None:
        check_finite(numerical, nums, files["numerical"])
    if check_ids and n:
        for name, arr in zip(cats, categorical):
            if not spec.feature_spec[name].dynamic:  # raw ids: any 64-bit value
                check_id_range(arr, spec.feature_spec[name].cardinality, name, files[name])
        for name, (values, _) in zip(spec.multi_hot_features, multi_hot):
            if len(values):
                check_id_range(values, spec.feature_spec[name].cardinality, name, files[name])
    return SplitBinaryMapping(n, columns["label"], numerical, categorical, files, columns.get("map"), multi_hot)


def _check_offsets(offsets: np.ndarray, num_values: int, name: str, where: Path) -> None:
    """CSR offsets: N + 1 non-decreasing int64 from 0 to the number of values."""
    if len(offsets) == 0:
        raise DataError(f"{where}: offsets of '{name}' are empty; expected N + 1 int64 values starting at 0")
    if offsets[0] != 0 or offsets[-1] != num_values:
        raise DataError(
            f"{where}: offsets of '{name}' run from {int(offsets[0])} to {int(offsets[-1])}; expected 0 to "
            f"{num_values}, the number of ids in its values file"
        )
    if len(offsets) > 1 and (np.diff(offsets) < 0).any():
        pos = int(np.argmax(np.diff(offsets) < 0))
        raise DataError(f"{where}: offsets of '{name}' decrease at sample {pos}; lengths cannot be negative")


def check_finite(numerical: np.ndarray, names: Sequence[str], where: os.PathLike | str, rows: int = 1 << 20) -> None:
    """Raises DataError at the first NaN or infinite value of the (N, n_numerical) ``numerical`` (read
    ``rows`` samples at a time, so memory stays bounded)."""
    for start in range(0, len(numerical), rows):
        block = np.asarray(numerical[start : start + rows])
        if not np.isfinite(block).all():
            row, col = np.argwhere(~np.isfinite(block))[0]
            raise DataError(
                f"{where}: numerical feature '{names[col]}' is {block[row, col]} at sample {start + row}; "
                "numerical values must be finite (NaN and infinity are refused)"
            )


def check_id_range(ids: np.ndarray, cardinality: int, name: str, where: os.PathLike | str) -> None:
    """Raises DataError if any id is negative or not below ``cardinality`` (one pass: min and max)."""
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0:
        pos = int(np.argmax(ids < 0))
        raise DataError(
            f"{where}: feature '{name}' has a negative id {int(ids[pos])} at sample {pos}; "
            f"ids must lie in [0, {cardinality})"
        )
    if hi >= cardinality:
        pos = int(np.argmax(ids >= cardinality))
        raise DataError(
            f"{where}: feature '{name}' has id {int(ids[pos])} at sample {pos}, beyond its "
            f"cardinality {cardinality} in the feature spec (ids must lie in [0, {cardinality}))"
        )


class SplitBinaryWriter:
    """Appends samples to the split-binary files of one mapping of a spec.

    Values are range-checked and cast to the dtypes the spec names, so what is written always reads
    back. Use as a context manager, or call ``close()``.
    """

    def __init__(self, spec: FeatureSpec, mapping: str):
        self.spec = spec
        self.mapping = mapping
        chunks = spec.mapping(mapping)
        by_feature = {f: spec.path_of(c.files[0]) for c in chunks for f in c.features}
        offsets_of = {c.features[0]: spec.path_of(c.files[1]) for c in chunks if len(c.files) == 2}
        self._cats = spec.onehot_features
        self._multi = spec.multi_hot_features
        self._multi_cards = spec.multi_hot_cardinalities
        self._multi_dtypes = [np.dtype(spec.feature_spec[c].dtype) for c in self._multi]
        self._nums = spec.numerical_features
        # None: a dynamic feature's raw ids, any 64-bit value
        self._cards = [None if spec.feature_spec[c].dynamic else n for c, n in zip(self._cats, spec.cardinalities)]
        self._cat_dtypes = [np.dtype(spec.feature_spec[c].dtype) for c in self._cats]
        self._num_dtype = np.dtype(spec.feature_spec[self._nums[0]].dtype) if self._nums else None
        paths = [by_feature[spec.label_feature]] + [by_feature[c] for c in self._cats + self._multi]
        if self._nums:
            paths.append(by_feature[self._nums[0]])
        for p in paths:
            p.parent.mkdir(parents=True, exist_ok=True)
        self._label_f = open(by_feature[spec.label_feature], "wb")
        self._num_f = open(by_feature[self._nums[0]], "wb") if self._nums else None
        self._cat_f = [open(by_feature[c], "wb") for c in self._cats]
        self._multi_f = [(open(by_feature[c], "wb"), open(offsets_of[c], "wb")) for c in self._multi]
        self._multi_total = [0] * len(self._multi)
        group = spec.group_feature
        self._group_f = open(by_feature[group], "wb") if group is not None and group in by_feature else None
        self._group_dtype = np.dtype(spec.feature_spec[group].dtype) if self._group_f is not None else None
        for _, off_f in self._multi_f:
            off_f.write(np.zeros(1, np.int64).tobytes())  # offsets start at 0
        self.num_samples = 0

    def append(
        self,
        numerical: np.ndarray | None,
        categorical: np.ndarray | Sequence[np.ndarray],
        labels: np.ndarray,
        multi_hot: Sequence[tuple[np.ndarray, np.ndarray]] | None = None,
        groups: np.ndarray | None = None,
    ) -> None:
        """Writes a block of samples.

        Args:
            numerical: (n, n_numerical) floats, or None when the spec has no numerical features.
            categorical: (n, n_onehot) ids, or one (n,) array per one-hot categorical feature.
            labels: (n,) zeros and ones.
            multi_hot: per multi-hot feature (channel order): its ids, concatenated over the block's
                samples, and the (n,) number of ids of each sample.
            groups: (n,) group ids of the map channel, when this mapping stores them.
        """
        labels = np.asarray(labels)
        n = len(labels)
        if labels.size and (labels.min() < 0 or labels.max() > 1):
            raise DataError(f"mapping '{self.mapping}': labels must be 0 or 1")
        cols = (
            [categorical[:, i] for i in range(categorical.shape[1])]
            if isinstance(categorical, np.ndarray)
            else list(categorical)
        )
        if len(cols) != len(self._cats):
            raise DataError(f"expected {len(self._cats)} categorical columns, got {len(cols)}")
        for name, col, card in zip(self._cats, cols, self._cards):
            if len(col) != n:
                raise DataError(f"feature '{name}': {len(col)} values for {n} labels")
            if n and card is not None:  # None: a dynamic feature's raw ids, any 64-bit value
                check_id_range(np.asarray(col), card, name, f"mapping '{self.mapping}'")
        if self._num_f is not None:
            numerical = np.asarray(numerical)
            if numerical.shape != (n, len(self._nums)):
                raise DataError(f"numerical block has shape {numerical.shape}, expected ({n}, {len(self._nums)})")
            stored = np.ascontiguousarray(numerical, dtype=self._num_dtype)
            if not np.isfinite(stored).all():
                row, col = np.argwhere(~np.isfinite(stored))[0]
                value = np.asarray(numerical)[row, col]
                why = f"beyond {self._num_dtype.name}'s range" if np.isfinite(value) else "not finite"
                raise DataError(
                    f"mapping '{self.mapping}': numerical feature '{self._nums[col]}' is {value} at sample "
                    f"{self.num_samples + row}, {why}; numerical values must be finite"
                    + (" (store numericals as float32)" if np.isfinite(value) else "")
                )
            self._num_f.write(stored)
        multi_hot = list(multi_hot or [])
        if len(multi_hot) != len(self._multi):
            raise DataError(f"expected {len(self._multi)} multi-hot features, got {len(multi_hot)}")
        for name, (values, lengths), card in zip(self._multi, multi_hot, self._multi_cards):
            values, lengths = np.asarray(values), np.asarray(lengths)
            if len(lengths) != n or (lengths < 0).any() or lengths.sum() != len(values):
                raise DataError(
                    f"multi-hot feature '{name}': expected {n} non-negative lengths summing to its "
                    f"{len(values)} ids, got {len(lengths)} summing to {int(lengths.sum())}"
                )
            if len(values):
                check_id_range(values, card, name, f"mapping '{self.mapping}'")
        if (groups is None) != (self._group_f is None) or (groups is not None and len(groups) != n):
            raise DataError(
                f"mapping '{self.mapping}' {'stores' if self._group_f else 'does not store'} map-channel group "
                f"ids; pass {'(n,) groups' if self._group_f else 'no groups'}"
            )
        if self._group_f is not None:
            self._group_f.write(np.ascontiguousarray(groups, dtype=self._group_dtype))
        self._label_f.write(np.ascontiguousarray(labels, dtype=np.uint8))
        for f, col, dtype in zip(self._cat_f, cols, self._cat_dtypes):
            f.write(np.ascontiguousarray(col, dtype=dtype))  # arrays write without a bytes copy
        for k, ((values, lengths), (val_f, off_f), dtype) in enumerate(
            zip(multi_hot, self._multi_f, self._multi_dtypes)
        ):
            val_f.write(np.ascontiguousarray(values, dtype=dtype))
            off_f.write(self._multi_total[k] + np.cumsum(lengths, dtype=np.int64))
            self._multi_total[k] += int(np.sum(lengths))
        self.num_samples += n

    def close(self) -> None:
        multi = (f for pair in self._multi_f for f in pair)
        for f in [self._label_f, self._num_f, self._group_f, *self._cat_f, *multi]:
            if f is not None and not f.closed:
                f.close()

    def __enter__(self) -> SplitBinaryWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
