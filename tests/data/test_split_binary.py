from pathlib import Path

import numpy as np
import pytest

from ctrkit.data.dataset import SplitBinaryDataset
from ctrkit.data.feature_spec import FeatureSpec, SpecError
from ctrkit.data.spec_builders import criteo_like_spec
from ctrkit.data.split_binary import DataError, SplitBinaryWriter
from tests.data.test_feature_spec import NVIDIA_STYLE

CARDS = {"cat_0.bin": 7912889, "cat_1.bin": 11}
DTYPES = {"cat_0.bin": np.int32, "cat_1.bin": np.int8}


def write_nvidia_dataset(root: Path, n: int = 1000, seed: int = 0) -> dict[str, np.ndarray]:
    """Writes files byte-for-byte as NVIDIA's split-binary tools do, with plain numpy."""
    rng = np.random.default_rng(seed)
    (root / "test").mkdir(parents=True)
    (root / "feature_spec.yaml").write_text(NVIDIA_STYLE)
    cols = {
        "label": rng.random(n) < 0.3,
        "numerical": rng.normal(size=(n, 2)).astype(np.float16),
        "cat_0.bin": rng.integers(0, CARDS["cat_0.bin"], n).astype(np.int32),
        "cat_1.bin": rng.integers(0, CARDS["cat_1.bin"], n).astype(np.int8),
    }
    cols["label"].tofile(root / "test" / "label.bin")
    cols["numerical"].tofile(root / "test" / "numerical.bin")
    for name in CARDS:
        cols[name].tofile(root / "test" / name)
    return cols


def test_nvidia_written_dataset_loads_unchanged(tmp_path):
    cols = write_nvidia_dataset(tmp_path, 1000)
    ds = SplitBinaryDataset(tmp_path, "test")
    assert len(ds) == 1000
    b = ds.slice(100, 164)
    np.testing.assert_array_equal(b.labels.numpy(), cols["label"][100:164].astype(np.float32))
    np.testing.assert_array_equal(b.numerical.numpy(), cols["numerical"][100:164].astype(np.float32))
    np.testing.assert_array_equal(b.categorical[:, 0].numpy(), cols["cat_0.bin"][100:164])
    np.testing.assert_array_equal(b.categorical[:, 1].numpy(), cols["cat_1.bin"][100:164])
    assert b.categorical.dtype.is_floating_point is False and b.categorical.shape == (64, 2)


def test_int64_categorical_accepted(tmp_path):
    write_nvidia_dataset(tmp_path, 50)
    text = (
        (tmp_path / "feature_spec.yaml")
        .read_text()
        .replace("cardinality: 11\n    dtype: int8", "cardinality: 11\n    dtype: int64")
    )
    (tmp_path / "feature_spec.yaml").write_text(text)
    ids = np.arange(50, dtype=np.int64) % 11
    ids.tofile(tmp_path / "test" / "cat_1.bin")
    np.testing.assert_array_equal(SplitBinaryDataset(tmp_path, "test").slice(0, 50).categorical[:, 1].numpy(), ids)


def test_writer_round_trip(tmp_path):
    spec = criteo_like_spec([3, 300, 70000], 2, mappings=("train",))
    spec = FeatureSpec(spec.feature_spec, spec.source_spec, spec.channel_spec, {}, tmp_path)
    rng = np.random.default_rng(1)
    num = rng.normal(size=(40, 2)).astype(np.float32)
    cats = np.stack([rng.integers(0, c, 40) for c in (3, 300, 70000)], axis=1)
    labels = rng.integers(0, 2, 40)
    with SplitBinaryWriter(spec, "train") as w:
        w.append(num[:25], cats[:25], labels[:25])
        w.append(num[25:], cats[25:], labels[25:])
    spec.to_yaml(tmp_path / "feature_spec.yaml")
    assert (tmp_path / "train" / "cat_1.bin").stat().st_size == 40 * 2  # int16 on disk
    b = SplitBinaryDataset(tmp_path, "train").slice(0, 40)
    np.testing.assert_array_equal(b.categorical.numpy(), cats)
    np.testing.assert_allclose(b.numerical.numpy(), num.astype(np.float16).astype(np.float32))
    np.testing.assert_array_equal(b.labels.numpy(), labels)


def test_writer_rejects_out_of_range_ids(tmp_path):
    spec = criteo_like_spec([3], 1, mappings=("train",))
    spec = FeatureSpec(spec.feature_spec, spec.source_spec, spec.channel_spec, {}, tmp_path)
    with SplitBinaryWriter(spec, "train") as w, pytest.raises(DataError, match="cat_0.bin.*id 3.*cardinality 3"):
        w.append(np.zeros((2, 1)), np.array([[0], [3]]), np.array([0, 1]))


def test_truncated_file_is_named(tmp_path):
    write_nvidia_dataset(tmp_path, 100)
    path = tmp_path / "test" / "cat_0.bin"
    path.write_bytes(path.read_bytes()[:-2])  # 398 bytes: not a whole number of int32
    with pytest.raises(DataError, match=r"cat_0.bin: 398 bytes is not a whole number of rows.*int32"):
        SplitBinaryDataset(tmp_path, "test")


def test_numerical_file_of_wrong_width(tmp_path):
    write_nvidia_dataset(tmp_path, 100)
    (np.zeros((100, 3), np.float16)).tofile(tmp_path / "test" / "numerical.bin")  # 3 columns, spec says 2
    with pytest.raises(DataError, match=r"different numbers of samples.*label.bin has 100, but .*numerical.bin: 150"):
        SplitBinaryDataset(tmp_path, "test")


def test_files_of_different_lengths(tmp_path):
    write_nvidia_dataset(tmp_path, 100)
    np.zeros(90, np.int8).tofile(tmp_path / "test" / "cat_1.bin")
    with pytest.raises(DataError, match=r"different numbers of samples.*label.bin has 100.*cat_1.bin: 90"):
        SplitBinaryDataset(tmp_path, "test")


def test_missing_file(tmp_path):
    write_nvidia_dataset(tmp_path, 10)
    (tmp_path / "test" / "cat_0.bin").unlink()
    with pytest.raises(DataError, match=r"cat_0.bin: file of categorical feature 'cat_0.bin' not found"):
        SplitBinaryDataset(tmp_path, "test")


def test_id_beyond_cardinality_and_negative_id(tmp_path):
    cols = write_nvidia_dataset(tmp_path, 100)
    bad = cols["cat_1.bin"].copy()
    bad[37] = 11
    bad.tofile(tmp_path / "test" / "cat_1.bin")
    with pytest.raises(DataError, match=r"'cat_1.bin' has id 11 at sample 37, beyond its cardinality 11"):
        SplitBinaryDataset(tmp_path, "test")
    bad[37] = -1
    bad.tofile(tmp_path / "test" / "cat_1.bin")
    with pytest.raises(DataError, match=r"'cat_1.bin' has a negative id -1 at sample 37"):
        SplitBinaryDataset(tmp_path, "test")


def test_label_other_than_zero_or_one(tmp_path):
    write_nvidia_dataset(tmp_path, 10)
    np.array([0, 1, 2, 0, 0, 0, 0, 0, 0, 0], np.uint8).tofile(tmp_path / "test" / "label.bin")
    with pytest.raises(DataError, match="sample 2 has label 2"):
        SplitBinaryDataset(tmp_path, "test")


def test_csv_chunk_needs_transcoding(tmp_path):
    write_nvidia_dataset(tmp_path, 10)
    text = (tmp_path / "feature_spec.yaml").read_text().replace("type: split_binary", "type: csv", 1)
    (tmp_path / "feature_spec.yaml").write_text(text)
    with pytest.raises(SpecError, match=r"chunk type 'csv' cannot be read directly"):
        SplitBinaryDataset(tmp_path, "test")
