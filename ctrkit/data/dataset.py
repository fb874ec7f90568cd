"""A dataset over one mapping (train/test) of a FeatureSpec, read by contiguous slices."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from ctrkit.data.batch import Batch, MultiHot
from ctrkit.data.feature_spec import FeatureSpec
from ctrkit.data.split_binary import open_mapping
from ctrkit.field_types import FRACTION


class SplitBinaryDataset:
    """Samples of one mapping of a split-binary dataset, sliced into Batches.

    Args:
        path: the dataset directory (holding ``feature_spec.yaml``) or the YAML file itself.
        mapping: which ``source_spec`` mapping to read (``train`` or ``test``).
        check_ids: verify on open that every id lies in ``[0, cardinality)``.

    Example:
        >>> ds = SplitBinaryDataset("data/", "test")
        >>> batch = ds.slice(0, 1024)  # Batch with numerical (1024, 13), categorical (1024, 26), labels (1024,)
    """

    def __init__(self, path: str | os.PathLike | FeatureSpec, mapping: str = "train", check_ids: bool = True):
        self.spec = path if isinstance(path, FeatureSpec) else FeatureSpec.from_yaml(Path(path))
        self.mapping = mapping
        self._data = open_mapping(self.spec, mapping, check_ids=check_ids)

    def __len__(self) -> int:
        return self._data.num_samples

    @property
    def files(self) -> dict[str, Path]:
        return self._data.files

    def slice(self, start: int, stop: int, narrow: bool = False) -> Batch:
        """Samples ``[start, stop)`` as one Batch (float32 dense, int64 sparse, float32 labels); ``narrow``: in the
        files' own dtypes (``narrow_dtypes``), for a device to widen (``Batch.widened``): the same values, half
        the bytes to copy or less."""
        d = self._data
        n = stop - start
        ids, numbers, clicks = self.narrow_dtypes() if narrow else (np.int64, np.float32, np.float32)
        sparse = np.empty((n, len(d.categorical)), dtype=ids)  # (B, F)
        for f, col in enumerate(d.categorical):
            sparse[:, f] = col[start:stop]
        dense = None
        if d.numerical is not None:
            dense = torch.from_numpy(np.array(d.numerical[start:stop], dtype=numbers))  # (B, n_num)
        labels = torch.from_numpy(np.array(d.labels[start:stop], dtype=clicks))  # (B,)
        return Batch(dense, torch.from_numpy(sparse), labels, self._multi_hot(start, stop))

    def narrow_dtypes(self) -> tuple[np.dtype, np.dtype, np.dtype]:
        """The dtypes of a narrow slice: the ids' (the least signed integer type holding every categorical file's
        values: torch has no wide unsigned types), the numerical file's, and the labels' (uint8)."""
        d = self._data
        ids = np.dtype(np.int8)
        for col in d.categorical:
            t = col.dtype if col.dtype.kind == "i" else np.dtype(f"i{min(2 * col.dtype.itemsize, 8)}")
            ids = np.promote_types(ids, t)
        numerical = d.numerical.dtype if d.numerical is not None else np.dtype(np.float32)
        return ids, numerical, np.dtype(np.uint8)

    def _multi_hot(self, start: int, stop: int) -> MultiHot | None:
        """Feature-major bags of the multi-hot features for samples ``[start, stop)``."""
        if not self._data.multi_hot:
            return None
        ids, bounds, total = [], [np.zeros(1, np.int64)], 0
        for values, offsets in self._data.multi_hot:
            o = np.asarray(offsets[start : stop + 1], dtype=np.int64)  # (B + 1,)
            ids.append(np.asarray(values[o[0] : o[-1]], dtype=np.int64))
            bounds.append(o[1:] - o[0] + total)
            total += int(o[-1] - o[0])
        return MultiHot(
            torch.from_numpy(np.concatenate(ids)), torch.from_numpy(np.concatenate(bounds)), len(self._data.multi_hot)
        )

    def groups(self) -> np.ndarray | None:
        """The map channel's (N,) group ids when this mapping stores them, else None."""
        return None if self._data.groups is None else np.asarray(self._data.groups)

    def labels(self) -> np.ndarray:
        """All labels as a (N,) uint8 array."""
        return np.asarray(self._data.labels)


class DatasetRange:
    """Samples ``[start, stop)`` of a dataset, with the dataset's interface (a held-out tail, for example).

    Args:
        dataset: the whole mapping.
        start, stop: the range; ``mapping`` names it, e.g. ``train[90000:100000]``.
    """

    def __init__(self, dataset: SplitBinaryDataset, start: int, stop: int):
        if not 0 <= start <= stop <= len(dataset):
            raise ValueError(
                f"range [{start}, {stop}) does not lie within the {len(dataset)} samples of '{dataset.mapping}'"
            )
        self.base, self.start, self.stop = dataset, start, stop
        self.spec = dataset.spec
        self.mapping = f"{dataset.mapping}[{start}:{stop}]"

    def __len__(self) -> int:
        return self.stop - self.start

    def slice(self, start: int, stop: int, narrow: bool = False) -> Batch:
        return self.base.slice(self.start + start, self.start + stop, narrow)

    def narrow_dtypes(self) -> tuple[np.dtype, np.dtype, np.dtype]:
        return self.base.narrow_dtypes()

    def labels(self) -> np.ndarray:
        return self.base.labels()[self.start : self.stop]

    def groups(self) -> np.ndarray | None:
        groups = self.base.groups()
        return None if groups is None else groups[self.start : self.stop]


LABEL_CHECK_ROWS = 1 << 27  # labels read to check both classes are present (one byte a row)


def one_class_problem(dataset: SplitBinaryDataset | DatasetRange, where: str) -> str | None:
    """A one-line message when ``dataset``'s labels are all one class (none where more rows than
    ``LABEL_CHECK_ROWS`` and the first of them hold both), else None."""
    labels = dataset.labels()[:LABEL_CHECK_ROWS]
    positives = int(np.count_nonzero(labels))
    if 0 < positives < len(labels) or not len(labels):
        return None
    if len(dataset) > LABEL_CHECK_ROWS:
        return None  # the rows read hold one class; the others may not
    label = 1 if positives else 0
    return (
        f"{where}: every one of its {len(labels):,} training labels is {label}; a click model needs clicks and "
        "non-clicks (check the label column and --positive or --label-threshold when preprocessing)"
    )


def split_tail(dataset: SplitBinaryDataset, fraction: float) -> tuple[DatasetRange, DatasetRange]:
    """(head, tail): the last ``fraction`` of the samples held out, at least one on each side.

    Click logs are time-ordered, so the tail is the most recent data: the closest to what a model will
    score once deployed. Deterministic: the same dataset and fraction give the same split.
    """
    n = len(dataset)
    FRACTION.check("validation_fraction", fraction, integer=False)
    if n < 2:
        raise ValueError(f"'{dataset.mapping}' holds {n} samples: too few to hold some out for validation")
    cut = min(max(n - int(round(n * fraction)), 1), n - 1)
    return DatasetRange(dataset, 0, cut), DatasetRange(dataset, cut, n)
