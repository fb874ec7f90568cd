"""Multi-hot categorical features: FeatureSpec, split-binary files, batches."""

from pathlib import Path

import numpy as np
import pytest
import torch

from ctrkit.data.dataset import SplitBinaryDataset
from ctrkit.data.feature_spec import FeatureSpec, SpecError
from ctrkit.data.split_binary import DataError, SplitBinaryWriter


def multi_hot_spec(root: Path, combiner: str = "mean") -> FeatureSpec:
    raw = {
        "feature_spec": {
            "ad": {"dtype": "int16", "cardinality": 300},
            "tags": {"dtype": "int8", "cardinality": 40, "multi_hot": True, "combiner": combiner},
            "topics": {"dtype": "int16", "cardinality": 1000, "multi_hot": True, "combiner": "sum"},
            "num_0": {"dtype": "float16"},
            "label": {"dtype": "bool"},
        },
        "source_spec": {
            m: [
                {"type": "split_binary", "features": ["num_0"], "files": [f"{m}/numerical.bin"]},
                {"type": "split_binary", "features": ["label"], "files": [f"{m}/label.bin"]},
                {"type": "split_binary", "features": ["ad"], "files": [f"{m}/ad.bin"]},
                {"type": "split_binary", "features": ["tags"], "files": [f"{m}/tags.bin", f"{m}/tags.offsets.bin"]},
                {
                    "type": "split_binary",
                    "features": ["topics"],
                    "files": [f"{m}/topics.bin", f"{m}/topics.offsets.bin"],
                },
            ]
            for m in ("train", "test")
        },
        "channel_spec": {"categorical": ["ad", "tags", "topics"], "numerical": ["num_0"], "label": ["label"]},
    }
    return FeatureSpec.from_dict(raw, root)


def random_block(rng: np.random.Generator, n: int):
    tag_len = rng.integers(0, 4, n)  # 0 to 3 tags, some samples have none
    topic_len = rng.integers(1, 3, n)
    tags = rng.integers(0, 40, tag_len.sum())
    topics = rng.integers(0, 1000, topic_len.sum())
    labels = (rng.random(n) < 0.3).astype(np.uint8)
    return rng.normal(size=(n, 1)), rng.integers(0, 300, (n, 1)), labels, [(tags, tag_len), (topics, topic_len)]


def write(spec: FeatureSpec, blocks, mapping="train"):
    with SplitBinaryWriter(spec, mapping) as w:
        for num, cat, labels, multi in blocks:
            w.append(num, cat, labels, multi)
    spec.to_yaml(spec.base_dir / "feature_spec.yaml")


def test_spec_splits_onehot_and_multi_hot(tmp_path):
    spec = multi_hot_spec(tmp_path)
    assert spec.onehot_features == ("ad",) and spec.multi_hot_features == ("tags", "topics")
    assert spec.cardinalities == [300] and spec.multi_hot_cardinalities == [40, 1000]
    assert spec.multi_hot_combiners == ["mean", "sum"]
    assert spec.summary()["multi_hot_features"] == ["tags", "topics"]
    with pytest.raises(SpecError, match="tags.combiner: expected one of sum, mean, got 'max'"):
        multi_hot_spec(tmp_path, combiner="max")


def test_round_trip_and_bags_against_a_loop(tmp_path):
    spec = multi_hot_spec(tmp_path)
    rng = np.random.default_rng(0)
    blocks = [random_block(rng, 37), random_block(rng, 50)]  # two appends: offsets must continue
    write(spec, blocks)
    ds = SplitBinaryDataset(tmp_path, "train")
    assert len(ds) == 87
    tags = np.concatenate([b[3][0][0] for b in blocks])
    tag_len = np.concatenate([b[3][0][1] for b in blocks])
    topics = np.concatenate([b[3][1][0] for b in blocks])
    topic_len = np.concatenate([b[3][1][1] for b in blocks])
    tag_off, topic_off = np.r_[0, np.cumsum(tag_len)], np.r_[0, np.cumsum(topic_len)]
    lo, hi = 30, 61
    batch = ds.slice(lo, hi)
    mh = batch.multi_hot
    b = hi - lo
    assert mh.num_features == 2 and mh.offsets.shape == (2 * b + 1,)
    for i in range(b):  # bag f * B + i holds sample lo + i's ids of feature f
        got_tags = mh.ids[mh.offsets[i] : mh.offsets[i + 1]].numpy()
        got_topics = mh.ids[mh.offsets[b + i] : mh.offsets[b + i + 1]].numpy()
        np.testing.assert_array_equal(got_tags, tags[tag_off[lo + i] : tag_off[lo + i + 1]])
        np.testing.assert_array_equal(got_topics, topics[topic_off[lo + i] : topic_off[lo + i + 1]])
    np.testing.assert_array_equal(batch.categorical[:, 0].numpy(), np.concatenate([x[1][:, 0] for x in blocks])[lo:hi])
    assert (tmp_path / "train" / "tags.bin").stat().st_size == tag_len.sum()  # int8 on disk
    assert batch.to("meta").multi_hot.ids.device.type == "meta"


def test_bad_multi_hot_files_are_named(tmp_path):
    spec = multi_hot_spec(tmp_path)
    write(spec, [random_block(np.random.default_rng(1), 20)])
    path = tmp_path / "train" / "tags.offsets.bin"
    good = np.fromfile(path, dtype=np.int64)
    bad = good.copy()
    bad[5], bad[6] = bad[6] + 1, bad[6]  # a decrease
    bad.tofile(path)
    with pytest.raises(DataError, match=r"tags.offsets.bin: offsets of 'tags' decrease at sample"):
        SplitBinaryDataset(tmp_path, "train")
    bad = good.copy()
    bad[-1] += 1
    bad.tofile(path)
    with pytest.raises(DataError, match=r"offsets of 'tags' run from 0 to \d+; expected 0 to \d+, the number of ids"):
        SplitBinaryDataset(tmp_path, "train")
    good[:-1].tofile(path)  # one sample short
    with pytest.raises(DataError, match="different numbers of samples"):
        SplitBinaryDataset(tmp_path, "train")
    good.tofile(path)
    values = np.fromfile(tmp_path / "train" / "tags.bin", dtype=np.int8)
    values[0] = 40
    values.tofile(tmp_path / "train" / "tags.bin")
    with pytest.raises(DataError, match="'tags' has id 40 at sample 0, beyond its cardinality 40"):
        SplitBinaryDataset(tmp_path, "train")


def test_writer_checks_lengths(tmp_path):
    spec = multi_hot_spec(tmp_path)
    num, cat, labels, multi = random_block(np.random.default_rng(2), 5)
    multi[0] = (multi[0][0], multi[0][1] + 1)
    with SplitBinaryWriter(spec, "train") as w, pytest.raises(DataError, match="multi-hot feature 'tags'"):
        w.append(num, cat, labels, multi)


def test_embedding_bags_sum_and_mean_against_a_loop(tmp_path):
    from ctrkit.models.embeddings import EmbeddingBagCollection

    spec = multi_hot_spec(tmp_path)
    write(spec, [random_block(np.random.default_rng(3), 64)])
    batch = SplitBinaryDataset(tmp_path, "train").slice(0, 64)
    torch.manual_seed(0)
    bags = EmbeddingBagCollection([40, 1000], 5, ["mean", "sum"])
    out = bags(batch.multi_hot)  # (B, 2, D)
    mh = batch.multi_hot
    for f, (table, combiner) in enumerate(((bags.weight[:40], "mean"), (bags.weight[40:], "sum"))):
        for i in range(64):
            ids = mh.ids[mh.offsets[f * 64 + i] : mh.offsets[f * 64 + i + 1]]
            rows = table[ids]
            expected = torch.zeros(5) if len(ids) == 0 else (rows.mean(0) if combiner == "mean" else rows.sum(0))
            torch.testing.assert_close(out[i, f], expected)
