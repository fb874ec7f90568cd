"""Batches fed to the training device: read in the files' own dtypes and widened they are the wide batches exactly;
the feed hands every batch on, in order, and closes the loader with itself; on a GPU (where one is) the batches
copied ahead on a side stream are the wide batches moved there."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ctrkit.data.dataset import SplitBinaryDataset, split_tail
from ctrkit.data.device_feed import DeviceFeed, narrow_on
from ctrkit.data.loader import BatchLoader
from ctrkit.data.synthetic import generate_dataset

CARDS = (100, 1000, 70_000, 5)  # int8, int16, int32 and int8 files


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    out = tmp_path_factory.mktemp("feed") / "d"
    generate_dataset(out, 5_000, CARDS, num_numerical=3, test_fraction=0.1, seed=3, progress=False)
    return SplitBinaryDataset(out, "train")


def _same(a, b) -> None:
    for x, y in zip(a.tensors(), b.tensors(), strict=True):
        assert x.dtype == y.dtype and x.device == y.device and torch.equal(x, y)


def test_a_narrow_slice_holds_the_files_dtypes_and_widens_to_the_wide_slice(dataset):
    ids, numerical, labels = dataset.narrow_dtypes()
    assert (ids, numerical, labels) == (np.int32, np.float16, np.uint8)  # the widest id file, the numerical file's
    narrow = dataset.slice(100, 1100, narrow=True)
    assert (narrow.categorical.dtype, narrow.numerical.dtype, narrow.labels.dtype) == (
        torch.int32,
        torch.float16,
        torch.uint8,
    )
    wide = dataset.slice(100, 1100)
    assert sum(t.nbytes for t in narrow.tensors()) * 2 <= sum(t.nbytes for t in wide.tensors())
    _same(narrow.widened(), wide)
    assert wide.widened() is wide
    head, tail = split_tail(dataset, 0.1)  # a held-out range reads narrow too
    _same(tail.slice(0, 50, narrow=True).widened(), dataset.slice(len(head), len(head) + 50))


def test_the_feed_hands_every_batch_on_in_order_and_closes_the_loader(dataset):
    assert not narrow_on("cpu") and narrow_on(torch.device("cuda", 0))
    loader = BatchLoader(dataset, 640, shuffle=True, seed=1)
    fed = list(DeviceFeed(torch.device("cpu"))(loader.epoch(2)))
    want = list(loader.epoch(2))
    assert len(fed) == len(want) == len(loader)
    for a, b in zip(fed, want):
        _same(a, b)
    inner = loader.epoch(0)
    feed = DeviceFeed(torch.device("cpu"))(inner)
    next(feed)
    feed.close()
    with pytest.raises(StopIteration):  # the loader's generator (and its prefetch thread) closed with the feed
        next(inner)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_the_batches_fed_ahead_are_the_wide_batches_moved_there(dataset):
    device = torch.device("cuda")
    narrow = BatchLoader(dataset, 640, shuffle=True, seed=1, narrow=True)
    first = next(iter(narrow.epoch(0)))
    assert first.categorical.is_pinned() and first.categorical.dtype == torch.int32
    fed = list(DeviceFeed(device)(narrow.epoch(0)))
    want = [b.to(device) for b in BatchLoader(dataset, 640, shuffle=True, seed=1).epoch(0)]
    torch.cuda.synchronize()
    assert len(fed) == len(want)
    for a, b in zip(fed, want):
        _same(a, b)
