"""Feature specs as NVIDIA's recommenders write them load unchanged: the Wide & Deep seed's example
(its channel names, CSV chunks over several files) and the Outbrain spec of NVIDIA's Wide & Deep
(onehot/multihot channels, parquet list columns, features without a dtype, the map channel)."""

import copy
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import yaml

from ctrkit.data.feature_spec import FeatureSpec, SpecError
from ctrkit.data.split_binary import DataError, open_mapping
from ctrkit.data.synthetic_outbrain import generate_outbrain
from ctrkit.data.transcode import generate_csv, transcode
from tests.conftest import run_cli

SEED_EXAMPLE = Path(__file__).parent / "fixtures" / "seed_example_feature_spec.yaml"


def test_the_seeds_example_spec_maps_onto_ctrkits_channels():
    spec = FeatureSpec.from_yaml(SEED_EXAMPLE)
    # user inputs, then item inputs, in the YAML's order
    assert spec.categorical_features == ("user_gender", "user_id", "item_id")
    assert spec.numerical_features == ("user_age",)
    assert spec.label_feature == "label"
    assert spec.cardinalities == [3, 2655, 856]
    assert spec.feature_spec["user_id"].dtype == "int32"


def test_the_seeds_example_transcodes_and_trains(tmp_path, capsys):
    csv = generate_csv(SEED_EXAMPLE, tmp_path / "csv", rows=600, seed=2)
    spec = transcode(csv, tmp_path / "bin")
    assert spec.categorical_features == ("user_gender", "user_id", "item_id")
    first = pl.read_csv(csv / "train_data_1.csv", has_header=False, new_columns=["user_id", "item_id", "label"])
    cols = open_mapping(spec, "train")
    np.testing.assert_array_equal(cols.categorical[1], first["user_id"].to_numpy())
    np.testing.assert_array_equal(cols.categorical[2], first["item_id"].to_numpy())
    code, out, err = run_cli(
        "train", "--model", "wide_deep", "--dataset", tmp_path / "bin", "--epochs", "1", "--batch-size", "64",
        "--no-progress", capsys=capsys,
    )  # fmt: skip
    assert code == 0, err
    assert "test AUC" in out


# NVIDIA Wide & Deep's Outbrain spec: features without dtypes, NVIDIA's channel names, the display id in
# the test mapping only, parquet list columns for multi-hot features
def nvidia_outbrain_dir(source: Path, out: Path, files_per_mapping: int = 2) -> dict:
    """Writes the split-binary Outbrain-like dataset at ``source`` as NVIDIA's parquet layout."""
    spec = FeatureSpec.from_yaml(source)
    out.mkdir()
    onehot, multi, nums = spec.onehot_features, spec.multi_hot_features, spec.numerical_features
    label, group = spec.label_feature, spec.group_feature
    sources = {}
    for m in ("train", "test"):
        cols = open_mapping(spec, m)
        frame = {label: cols.labels.astype(np.float32)}
        frame.update({n: np.asarray(cols.categorical[i]).astype(np.int64) for i, n in enumerate(onehot)})
        for n, (values, offsets) in zip(multi, cols.multi_hot):
            frame[n] = [values[a:b].astype(np.int64).tolist() for a, b in zip(offsets[:-1], offsets[1:])]
        frame.update({n: np.asarray(cols.numerical[:, i], dtype=np.float32) for i, n in enumerate(nums)})
        if m == "test":
            frame[group] = np.asarray(cols.groups).astype(np.int64)
        df = pl.DataFrame(frame)
        bounds = np.linspace(0, len(df), files_per_mapping + 1).astype(int)
        names = []
        for k, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:])):
            (out / m).mkdir(exist_ok=True)
            df.slice(int(lo), int(hi - lo)).write_parquet(out / m / f"part_{k}.parquet")
            names.append(f"{m}/part_{k}.parquet")
        sources[m] = [{"type": "parquet", "features": list(df.columns), "files": names}]
    raw = {
        "feature_spec": {
            **{n: {"cardinality": spec.feature_spec[n].cardinality} for n in onehot},
            **{n: {"cardinality": spec.feature_spec[n].cardinality, "max_hotness": 3} for n in multi},
            **{n: {} for n in nums},
            group: {},
            label: {},
        },
        "source_spec": sources,
        "channel_spec": {
            "multihot_categorical": list(multi),
            "onehot_categorical": list(onehot),
            "label": [label],
            "numerical": list(nums),
            "map": [group],
        },
        "metadata": {},
    }
    (out / "feature_spec.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    return raw


@pytest.fixture(scope="module")
def outbrain_pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("nvidia")
    generate_outbrain(root / "bin", 6_000, test_fraction=0.3, seed=4, progress=False)
    nvidia_outbrain_dir(root / "bin", root / "parquet")
    return root / "bin", root / "parquet"


def test_nvidia_outbrain_spec_transcodes_to_the_same_columns(outbrain_pair, tmp_path):
    original, parquet = outbrain_pair
    spec = transcode(parquet, tmp_path / "out")
    source = FeatureSpec.from_yaml(original)
    assert spec.multi_hot_features == source.multi_hot_features
    assert spec.onehot_features == source.onehot_features
    assert spec.group_feature == source.group_feature
    assert spec.feature_spec[source.multi_hot_features[0]].extra["max_hotness"] == 3  # kept verbatim
    for m in ("train", "test"):
        a, b = open_mapping(source, m), open_mapping(spec, m)
        np.testing.assert_array_equal(a.labels, b.labels)
        for x, y in zip(a.categorical, b.categorical):
            np.testing.assert_array_equal(x, y)
        for (va, oa), (vb, ob) in zip(a.multi_hot, b.multi_hot):
            np.testing.assert_array_equal(va, vb)
            np.testing.assert_array_equal(oa, ob)
        np.testing.assert_allclose(np.asarray(a.numerical, np.float32), np.asarray(b.numerical, np.float32))
        if m == "test":
            np.testing.assert_array_equal(a.groups, b.groups)
        else:
            assert b.groups is None


def test_nvidia_outbrain_dataset_trains_and_reports_map12(outbrain_pair, tmp_path, capsys):
    _, parquet = outbrain_pair
    code, out, err = run_cli("transcode", "--input", parquet, "--output", tmp_path / "bin", capsys=capsys)
    assert code == 0, err
    # one model (no seed ensemble or small-batch try): the dataset's format is what is checked here
    code, out, err = run_cli(
        "train", "--model", "wide_deep", "--dataset", tmp_path / "bin", "--epochs", "1", "--no-progress",
        "--save-checkpoint", tmp_path / "wd.pt", "--seed-ensemble", "1", "--small-batch", "0", capsys=capsys,
    )  # fmt: skip
    assert code == 0, err
    code, out, err = run_cli("evaluate", "--checkpoint", tmp_path / "wd.pt", "--dataset", tmp_path / "bin",
                             capsys=capsys)  # fmt: skip
    assert code == 0, err
    assert "MAP@12" in out


def test_multi_hot_features_cannot_come_from_csv(tmp_path):
    raw = yaml.safe_load(SEED_EXAMPLE.read_text())
    raw["channel_spec"]["multihot_categorical"] = raw["channel_spec"].pop("categorical_item_inputs")
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(raw))
    spec = FeatureSpec.from_yaml(tmp_path / "spec.yaml")
    assert spec.multi_hot_features == ("item_id",)
    csv = generate_csv(tmp_path / "spec.yaml", tmp_path / "csv", rows=10)
    with pytest.raises(DataError, match=r"_data(_1)?\.csv: multi-hot feature 'item_id' cannot be read from CSV"):
        transcode(csv, tmp_path / "out")


def test_bad_nvidia_specs_are_refused(tmp_path):
    raw = yaml.safe_load(SEED_EXAMPLE.read_text())
    twice = copy.deepcopy(raw)
    twice["channel_spec"]["categorical_item_inputs"].append("user_id")  # also a user input
    with pytest.raises(SpecError, match=r"channel_spec.categorical_item_inputs: feature 'user_id' is already in "
                                        r"channel 'categorical'"):  # fmt: skip
        FeatureSpec.from_dict(twice)
    binary = copy.deepcopy(raw)
    del binary["feature_spec"]["user_id"]["dtype"]
    binary["source_spec"]["train"][1]["type"] = "split_binary"
    with pytest.raises(SpecError, match=r"feature_spec.user_id: missing 'dtype'; source_spec.train\[1\] stores it "
                                        r"in split_binary files"):  # fmt: skip
        FeatureSpec.from_dict(binary)
    orphan = copy.deepcopy(raw)
    orphan["feature_spec"]["note"] = {}  # in no channel: nothing says how to read it
    with pytest.raises(SpecError, match=r"feature_spec.note: missing 'dtype'"):
        FeatureSpec.from_dict(orphan)
