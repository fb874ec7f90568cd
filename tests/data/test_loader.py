import numpy as np
import torch

from ctrkit.data.batch import Batch
from ctrkit.data.dataset import SplitBinaryDataset
from ctrkit.data.loader import BatchLoader


def all_first_ids(batches):
    return np.concatenate([b.categorical[:, 5].numpy() for b in batches])


def test_every_sample_once_and_last_partial_batch_kept(tiny_dataset):
    ds = SplitBinaryDataset(tiny_dataset, "test")  # 2400 samples
    loader = BatchLoader(ds, 1000, shuffle=False)
    batches = list(loader)
    assert [len(b) for b in batches] == [1000, 1000, 400]
    whole = ds.slice(0, len(ds))
    np.testing.assert_array_equal(torch.cat([b.categorical for b in batches]).numpy(), whole.categorical.numpy())
    np.testing.assert_array_equal(torch.cat([b.labels for b in batches]).numpy(), whole.labels.numpy())


def test_shuffled_order_is_seeded_per_epoch_and_covers_everything(tiny_dataset):
    ds = SplitBinaryDataset(tiny_dataset, "train")
    a = BatchLoader(ds, 512, shuffle=True, seed=3)
    b = BatchLoader(ds, 512, shuffle=True, seed=3)
    c = BatchLoader(ds, 512, shuffle=True, seed=4)
    np.testing.assert_array_equal(a.batch_order(0), b.batch_order(0))
    assert not np.array_equal(a.batch_order(0), a.batch_order(1))
    assert not np.array_equal(a.batch_order(0), c.batch_order(0))
    assert sorted(a.batch_order(1)) == list(range(len(a)))
    # contents follow the order: batch k of the epoch is the slice order[k]
    first = next(iter(a.epoch(1)))
    lo = int(a.batch_order(1)[0]) * 512
    np.testing.assert_array_equal(first.categorical.numpy(), ds.slice(lo, min(lo + 512, len(ds))).categorical.numpy())


def test_resume_mid_epoch_yields_the_remaining_batches(tiny_dataset):
    ds = SplitBinaryDataset(tiny_dataset, "train")
    loader = BatchLoader(ds, 700, shuffle=True, seed=1)
    full = list(loader.epoch(2))
    rest = list(loader.epoch(2, start=5))
    assert len(rest) == len(full) - 5
    for x, y in zip(full[5:], rest):
        assert torch.equal(x.categorical, y.categorical) and torch.equal(x.labels, y.labels)


def test_prefetch_thread_gives_the_same_batches(tiny_dataset):
    ds = SplitBinaryDataset(tiny_dataset, "train")
    with_thread = list(BatchLoader(ds, 999, shuffle=True, seed=2, prefetch=3).epoch(0))
    without = list(BatchLoader(ds, 999, shuffle=True, seed=2, prefetch=0).epoch(0))
    assert all(torch.equal(x.numerical, y.numerical) for x, y in zip(with_thread, without))


def test_batch_to_moves_every_tensor():
    b = Batch(torch.zeros(2, 3), torch.zeros(2, 4, dtype=torch.int64), torch.ones(2))
    moved = b.to("meta")
    assert moved.numerical.device.type == moved.categorical.device.type == moved.labels.device.type == "meta"
    assert Batch(None, torch.zeros(2, 1, dtype=torch.int64)).to("meta").numerical is None
