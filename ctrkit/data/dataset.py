"""A dataset over one mapping (train/test) of a FeatureSpec, read by contiguous slices."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from ctrkit.data.batch import Batch, MultiHot
from ctrkit.data.feature_spec import FeatureSpec
from ctrkit.data.split_binary import open_mapping


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

    def slice(self, start: int, stop: int) -> Batch:
        """Samples ``[start, stop)`` as one Batch (float32 dense, int64 sparse, float32 labels)."""
        d = self._data
        n = stop - start
        sparse = np.empty((n, len(d.categorical)), dtype=np.int64)  # (B, F)
        for f, col in enumerate(d.categorical):
            sparse[:, f] = col[start:stop]
        dense = None
        if d.numerical is not None:
            dense = torch.from_numpy(np.asarray(d.numerical[start:stop], dtype=np.float32))  # (B, n_num)
        labels = torch.from_numpy(np.asarray(d.labels[start:stop], dtype=np.float32))  # (B,)
        return Batch(dense, torch.from_numpy(sparse), labels, self._multi_hot(start, stop))

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
