from pathlib import Path

import pytest
import yaml

from ctrkit.data.feature_spec import FeatureSpec, SpecError, smallest_int_dtype
from ctrkit.data.spec_builders import criteo_like_spec

# The layout NVIDIA's tools write (anchors included), abbreviated to 2 categorical + 2 numerical.
NVIDIA_STYLE = """\
channel_spec:
  categorical:
  - cat_0.bin
  - cat_1.bin
  label:
  - label
  numerical: &id001
  - num_0
  - num_1
feature_spec:
  cat_0.bin:
    cardinality: 7912889
    dtype: int32
  cat_1.bin:
    cardinality: 11
    dtype: int8
  label:
    dtype: bool
  num_0:
    dtype: float16
  num_1:
    dtype: float16
metadata: {}
source_spec:
  test:
  - features: *id001
    files:
    - test/numerical.bin
    type: split_binary
  - features:
    - label
    files:
    - test/label.bin
    type: split_binary
  - features:
    - cat_0.bin
    files:
    - test/cat_0.bin
    type: split_binary
  - features:
    - cat_1.bin
    files:
    - test/cat_1.bin
    type: split_binary
"""


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "feature_spec.yaml"
    p.write_text(text)
    return p


def test_nvidia_layout_loads(tmp_path):
    spec = FeatureSpec.from_yaml(write(tmp_path, NVIDIA_STYLE))
    assert spec.categorical_features == ("cat_0.bin", "cat_1.bin")
    assert spec.numerical_features == ("num_0", "num_1")
    assert spec.label_feature == "label"
    assert spec.cardinalities == [7912889, 11]
    assert spec.feature_spec["cat_1.bin"].dtype == "int8"
    assert spec.path_of("test/label.bin") == tmp_path / "test" / "label.bin"
    assert spec.mapping("test")[0].features == ("num_0", "num_1")


def test_round_trip_keeps_extra_metadata_and_torch_dtypes(tmp_path):
    raw = yaml.safe_load(NVIDIA_STYLE)
    raw["feature_spec"]["cat_0.bin"]["dtype"] = "torch.int32"
    raw["feature_spec"]["cat_0.bin"]["description"] = "user id"
    raw["metadata"] = {"source": "hand-written"}
    spec = FeatureSpec.from_dict(raw, tmp_path)
    spec.to_yaml(tmp_path / "out" / "feature_spec.yaml")
    again = FeatureSpec.from_yaml(tmp_path / "out")
    assert again.feature_spec["cat_0.bin"].extra == {"description": "user id"}
    assert again.feature_spec["cat_0.bin"].dtype == "int32"
    assert again.metadata == {"source": "hand-written"}
    assert again.to_dict() == spec.to_dict()
    assert not list((tmp_path / "out").glob(".*tmp"))  # atomic write left no temp file


def test_seed_csv_example_with_auto_cardinality_validates(tmp_path):
    raw = {
        "feature_spec": {
            "user_gender": {"dtype": "torch.int8", "cardinality": 3},
            "user_age": {"dtype": "torch.int8"},
            "user_id": {"dtype": "torch.int32", "cardinality": "auto"},
            "label": {"dtype": "torch.float32"},
        },
        "source_spec": {
            "train": [
                {"type": "csv", "features": ["user_gender", "user_age"], "files": ["a.csv", "b.csv"]},
                {"type": "csv", "features": ["user_id", "label"], "files": ["c.csv"]},
            ]
        },
        "channel_spec": {"numeric_inputs": ["user_age"], "categorical": ["user_gender", "user_id"], "label": ["label"]},
    }
    spec = FeatureSpec.from_dict(raw, tmp_path)
    assert spec.feature_spec["user_id"].cardinality == "auto"
    with pytest.raises(SpecError, match="user_id.*auto"):
        spec.cardinalities  # noqa: B018 - a model cannot use 'auto'


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda r: r.pop("channel_spec"), "channel_spec' is missing"),
        (lambda r: r["channel_spec"]["categorical"].append("nope"), "channel_spec.categorical: feature 'nope'"),
        (lambda r: r["source_spec"]["test"][0].update(type="hdf5"), r"source_spec.test\[0\].type: unknown chunk type"),
        (lambda r: r["feature_spec"]["cat_0.bin"].update(cardinality=-5), "cat_0.bin.cardinality: expected a positive"),
        (lambda r: r["feature_spec"]["cat_0.bin"].update(dtype="complex64"), "cat_0.bin: unknown dtype"),
        (lambda r: r["feature_spec"]["cat_1.bin"].pop("dtype"), "feature_spec.cat_1.bin: missing 'dtype'"),
        (lambda r: r["feature_spec"]["cat_1.bin"].pop("cardinality"), "cat_1.bin: categorical feature has no"),
        (lambda r: r["source_spec"]["test"].pop(3), "feature 'cat_1.bin' of channel 'categorical' is not stored"),
        (lambda r: r["source_spec"]["test"][3]["features"].append("label"), "'label' is already stored"),
        (lambda r: r["source_spec"]["test"][1].pop("files"), "a chunk needs 'type', 'features' and 'files'"),
        (lambda r: r.update(extra_section=1), "unknown top-level section"),
    ],
)
def test_invalid_specs_name_the_problem(tmp_path, mutate, message):
    raw = yaml.safe_load(NVIDIA_STYLE)
    mutate(raw)
    path = write(tmp_path, yaml.safe_dump(raw))
    with pytest.raises(SpecError, match=message) as info:
        FeatureSpec.from_yaml(path)
    assert str(path) in str(info.value)


def test_missing_and_malformed_yaml(tmp_path):
    with pytest.raises(SpecError, match="feature spec not found"):
        FeatureSpec.from_yaml(tmp_path)
    with pytest.raises(SpecError, match="not valid YAML"):
        FeatureSpec.from_yaml(write(tmp_path, "feature_spec: [unclosed\n"))
    with pytest.raises(SpecError, match="expected a mapping"):
        FeatureSpec.from_yaml(write(tmp_path, "- just\n- a list\n"))


def test_missing_mapping_is_named(tmp_path):
    spec = FeatureSpec.from_yaml(write(tmp_path, NVIDIA_STYLE))
    with pytest.raises(SpecError, match="no mapping 'train'; available: \\['test'\\]"):
        spec.mapping("train")


@pytest.mark.parametrize(
    "card, dtype",
    [
        (1, "int8"),
        (127, "int8"),
        (128, "int16"),
        (32767, "int16"),
        (32768, "int32"),
        (2**31 - 1, "int32"),
        (2**31, "int64"),
    ],
)
def test_smallest_int_dtype(card, dtype):
    assert smallest_int_dtype(card) == dtype


def test_criteo_like_spec_layout():
    spec = criteo_like_spec([5, 300, 70000], 2)
    assert [spec.feature_spec[c].dtype for c in spec.categorical_features] == ["int8", "int16", "int32"]
    files = [c.files[0] for c in spec.mapping("train")]
    assert files == ["train/numerical.bin", "train/label.bin", "train/cat_0.bin", "train/cat_1.bin", "train/cat_2.bin"]


def test_map_channel_is_optional_per_mapping_and_checked(tmp_path):
    raw = yaml.safe_load(NVIDIA_STYLE)
    raw["feature_spec"]["display_id"] = {"dtype": "int32"}
    raw["channel_spec"]["map"] = ["display_id"]
    spec = FeatureSpec.from_dict(raw, tmp_path)  # not stored in the test mapping: allowed
    assert spec.group_feature == "display_id"
    raw["feature_spec"]["display_id"] = {"dtype": "float16"}
    with pytest.raises(SpecError, match="map channel's group ids need an integer dtype"):
        FeatureSpec.from_dict(raw, tmp_path)
    raw["feature_spec"]["display_id"] = {"dtype": "int32"}
    raw["channel_spec"]["map"] = ["display_id", "cat_0.bin"]
    with pytest.raises(SpecError, match="channel_spec.map: expected exactly one group feature"):
        FeatureSpec.from_dict(raw, tmp_path)
