"""CSV/Parquet + FeatureSpec -> split binary, on the seed's example layout."""

import numpy as np
import polars as pl
import pytest
import yaml

from ctrkit.data.dataset import SplitBinaryDataset
from ctrkit.data.feature_spec import SpecError
from ctrkit.data.split_binary import DataError
from ctrkit.data.transcode import generate_csv, transcode
from tests.conftest import run_cli

# the layout of the FeatureSpec example in the seeds: train split over two chunks, the first in two files
SEED_EXAMPLE = {
    "feature_spec": {
        "user_gender": {"dtype": "torch.int8", "cardinality": 3},
        "user_age": {"dtype": "torch.int8"},
        "user_id": {"dtype": "torch.int32", "cardinality": "auto"},
        "item_id": {"dtype": "torch.int32", "cardinality": 856},
        "label": {"dtype": "torch.float32"},
    },
    "source_spec": {
        "train": [
            {
                "type": "csv",
                "features": ["user_gender", "user_age"],
                "files": ["train_data_0_0.csv", "train_data_0_1.csv"],
            },
            {"type": "csv", "features": ["user_id", "item_id", "label"], "files": ["train_data_1.csv"]},
        ],
        "test": [
            {
                "type": "csv",
                "features": ["user_id", "item_id", "label", "user_gender", "user_age"],
                "files": ["test_data.csv"],
            }
        ],
    },
    "channel_spec": {
        "numerical": ["user_age"],
        "categorical": ["user_gender", "user_id", "item_id"],
        "label": ["label"],
    },
}


@pytest.fixture
def csv_dataset(tmp_path):
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(SEED_EXAMPLE))
    return generate_csv(tmp_path / "spec.yaml", tmp_path / "csv", rows=400, seed=3)


def read_csv(path, names):
    return pl.read_csv(path, has_header=False, new_columns=names)


def test_transcoded_values_equal_the_csv(csv_dataset, tmp_path):
    spec = transcode(csv_dataset, tmp_path / "bin")
    assert spec.categorical_features == ("user_gender", "user_id", "item_id")
    first = pl.concat(
        [read_csv(csv_dataset / f, ["user_gender", "user_age"]) for f in ("train_data_0_0.csv", "train_data_0_1.csv")]
    )
    second = read_csv(csv_dataset / "train_data_1.csv", ["user_id", "item_id", "label"])
    batch = SplitBinaryDataset(tmp_path / "bin", "train").slice(0, 400)
    np.testing.assert_array_equal(batch.categorical[:, 0].numpy(), first["user_gender"].to_numpy())
    np.testing.assert_array_equal(batch.categorical[:, 1].numpy(), second["user_id"].to_numpy())
    np.testing.assert_array_equal(batch.categorical[:, 2].numpy(), second["item_id"].to_numpy())
    np.testing.assert_array_equal(batch.labels.numpy(), second["label"].to_numpy())
    np.testing.assert_allclose(batch.numerical[:, 0].numpy(), first["user_age"].to_numpy().astype(np.float16), rtol=0)
    # 'auto' is the largest id seen in any mapping + 1; given cardinalities are kept
    test = read_csv(csv_dataset / "test_data.csv", ["user_id", "item_id", "label", "user_gender", "user_age"])
    assert spec.cardinalities == [3, max(second["user_id"].max(), test["user_id"].max()) + 1, 856]
    assert set(np.unique(batch.labels.numpy())) == {0.0, 1.0}
    assert spec.feature_spec["item_id"].dtype == "int16"


def test_parquet_chunks(csv_dataset, tmp_path):
    raw = yaml.safe_load((csv_dataset / "feature_spec.yaml").read_text())
    names = ["user_id", "item_id", "label", "user_gender", "user_age"]
    read_csv(csv_dataset / "test_data.csv", names).write_parquet(csv_dataset / "test.parquet")
    raw["source_spec"]["test"] = [{"type": "parquet", "features": names, "files": ["test.parquet"]}]
    (csv_dataset / "feature_spec.yaml").write_text(yaml.safe_dump(raw))
    transcode(csv_dataset, tmp_path / "bin")
    assert len(SplitBinaryDataset(tmp_path / "bin", "test")) == 400


def rewrite(path, transform):
    lines = path.read_text().splitlines()
    path.write_text("\n".join(transform(lines)) + "\n")


def test_bad_inputs(csv_dataset, tmp_path):
    rewrite(csv_dataset / "train_data_1.csv", lambda ls: ls[:-1])  # one row short
    with pytest.raises(DataError, match=r"mapping 'train': its chunks hold different numbers of rows"):
        transcode(csv_dataset, tmp_path / "a")
    rewrite(csv_dataset / "train_data_1.csv", lambda ls: ls + ["5,900,1"])  # item_id 900 >= 856
    with pytest.raises(DataError, match="feature 'item_id': id 900 is beyond its cardinality 856"):
        transcode(csv_dataset, tmp_path / "a")
    rewrite(csv_dataset / "train_data_1.csv", lambda ls: ls[:-1] + ["-4,1,1"])
    with pytest.raises(DataError, match="feature 'user_id': negative id -4"):
        transcode(csv_dataset, tmp_path / "a")
    rewrite(csv_dataset / "train_data_1.csv", lambda ls: ls[:-1] + ["x,1,1"])
    with pytest.raises(DataError, match=r"train_data_1.csv: cannot read the columns \['user_id', 'item_id', 'label'\]"):
        transcode(csv_dataset, tmp_path / "a")
    rewrite(csv_dataset / "train_data_1.csv", lambda ls: ls[:-1] + ["1,1,2"])
    with pytest.raises(DataError, match="label 'label': expected a label of 0 or 1 .*got '2.0'"):
        transcode(csv_dataset, tmp_path / "a")
    (csv_dataset / "test_data.csv").unlink()
    with pytest.raises(DataError, match="test_data.csv: file named in the feature spec's source_spec not found"):
        transcode(csv_dataset, tmp_path / "a")
    assert not (tmp_path / "a").exists()


def test_unknown_channels_are_refused(tmp_path):
    raw = yaml.safe_load(yaml.safe_dump(SEED_EXAMPLE))
    raw["channel_spec"]["sequence_inputs"] = raw["channel_spec"].pop("categorical")
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(SpecError, match=r"channel\(s\) \['sequence_inputs'\] are not ones ctrkit"):
        transcode(generate_csv(tmp_path / "spec.yaml", tmp_path / "csv", rows=10), tmp_path / "out")


def test_cli_gen_csv_transcode_train(tmp_path, capsys):
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(SEED_EXAMPLE))
    code, out, _ = run_cli(
        "gen-csv", "--feature-spec", tmp_path / "spec.yaml", "--out", tmp_path / "csv", "--rows", "300", capsys=capsys
    )
    assert code == 0 and "300 rows per mapping" in out
    code, out, _ = run_cli("transcode", "--input", tmp_path / "csv", "--output", tmp_path / "bin", capsys=capsys)
    assert code == 0 and "300 train" in out and "300 test" in out
    code, out, _ = run_cli("train", "--dataset", tmp_path / "bin", "--max-steps", "2", "--no-progress", capsys=capsys)
    # small data: one model, also tried at the small batch
    assert code == 0 and "done: 2 models (--small-batch) of 2 / 2 steps" in out


def test_small_chunks_give_the_same_files(csv_dataset, tmp_path, capsys):
    """7-row chunks cut across the two train files of the first chunk and never line up with them."""
    transcode(csv_dataset, tmp_path / "whole")
    code, out, _ = run_cli(
        "transcode", "--input", csv_dataset, "--output", tmp_path / "small", "--chunk-size", "7", capsys=capsys
    )
    assert code == 0, out
    files = sorted(p.relative_to(tmp_path / "whole") for p in (tmp_path / "whole").rglob("*.bin"))
    assert len(files) == 2 * 5
    for rel in files:
        assert (tmp_path / "whole" / rel).read_bytes() == (tmp_path / "small" / rel).read_bytes(), rel
    with pytest.raises(ValueError, match="`chunk_size`: expected an integer from 1"):
        transcode(csv_dataset, tmp_path / "zero", chunk_size=0)
