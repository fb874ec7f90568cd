import numpy as np
import pytest

from ctrkit.data.dataset import SplitBinaryDataset
from ctrkit.data.synthetic import SyntheticCTR, generate_dataset, power_law_ids
from ctrkit.eval.metrics import roc_auc


def test_power_law_ids_are_skewed_and_in_range():
    ids = power_law_ids(np.random.default_rng(0), 1000, 200_000, 1.2)
    assert ids.min() >= 0 and ids.max() < 1000
    counts = np.bincount(ids, minlength=1000)
    assert counts[0] > counts[1] > counts[10] > counts[100]
    assert counts[:10].sum() > 0.4 * len(ids)  # the head holds much of the mass
    assert (counts[500:] > 0).mean() > 0.5  # but the tail is reached


def test_planted_signal_is_learnable_in_principle():
    model = SyntheticCTR((50, 1000, 20), num_numerical=3, seed=1)
    block = model.sample(np.random.default_rng(2), 50_000)
    assert 0.2 < block.labels.mean() < 0.3
    assert roc_auc(block.labels, block.logits) > 0.8  # the true odds rank clicks well


def test_generated_dataset_matches_its_spec(tiny_dataset):
    train = SplitBinaryDataset(tiny_dataset, "train")
    test = SplitBinaryDataset(tiny_dataset, "test")
    assert (len(train), len(test)) == (21_600, 2_400)
    b = train.slice(0, len(train))
    cards = train.spec.cardinalities
    assert cards == [3, 10, 50, 120, 400, 2000, 7, 900]
    assert (b.sparse.max(0).values.numpy() < np.array(cards)).all()
    assert b.dense.shape == (21_600, 4) and set(np.unique(b.labels.numpy())) == {0.0, 1.0}
    assert train.spec.metadata["seed"] == 7


def test_refuses_to_overwrite_without_flag(tmp_path):
    out = tmp_path / "d"
    generate_dataset(out, 100, (5, 6), num_numerical=1, progress=False)
    with pytest.raises(ValueError, match="not empty; pass --overwrite"):
        generate_dataset(out, 100, (5, 6), num_numerical=1, progress=False)
    generate_dataset(out, 200, (5, 6), num_numerical=1, progress=False, overwrite=True)
    assert len(SplitBinaryDataset(out, "train")) + len(SplitBinaryDataset(out, "test")) == 200
    assert [p.name for p in tmp_path.iterdir()] == ["d"]  # no temp directories left behind
