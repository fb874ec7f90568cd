"""`ctrkit bench stream` on a tiny stream: every method per test day, the vocabulary datasets checked against the raw
ids they were made from."""

from __future__ import annotations

import json

import numpy as np

from ctrkit.bench.stream_bench import _index, vocabularies, with_vocabulary
from ctrkit.data.dataset import SplitBinaryDataset
from ctrkit.data.feature_spec import FeatureSpec
from ctrkit.data.synthetic_stream import write_stream
from tests.conftest import run_cli


def test_vocabulary_datasets_index_the_raw_ids(tmp_path):
    days = write_stream(tmp_path / "s", 2, 2000, (500, 40, 5), seed=7, progress=False, num_numerical=2)
    vocab = vocabularies(days[:1])
    out = with_vocabulary(vocab, {"train": [(days[0], "train")], "test": [(days[1], "test")]}, tmp_path / "v")
    spec = FeatureSpec.from_yaml(out)
    assert spec.cardinalities == [len(v) + 1 for v in vocab] and not spec.dynamic_features
    raw = SplitBinaryDataset(FeatureSpec.from_yaml(days[1]), "test")
    raw_ids = raw.slice(0, len(raw)).categorical.numpy()
    mapped = SplitBinaryDataset(spec, "test")
    ids = mapped.slice(0, len(mapped)).categorical.numpy()
    for f, v in enumerate(vocab):
        known = {int(x): i + 1 for i, x in enumerate(v)}  # sorted ids -> 1..len
        assert ids[:, f].tolist() == [known.get(int(x), 0) for x in raw_ids[:, f]]
    assert (ids[:, 0] == 0).any() and (ids[:, 0] > 0).any()  # day 2 brings ids day 1 did not have
    assert _index(np.array([3, 9], np.int64), np.array([9, 4, 3], np.int64)).tolist() == [2, 0, 1]


def test_bench_stream_scores_every_method_each_test_day(tmp_path):
    out = tmp_path / "r.json"
    code = run_cli("bench", "stream", "--days", "3", "--rows", "3000", "--max-steps", "3", "--work", tmp_path / "w",
                   "--output", out)[0]  # fmt: skip
    assert code == 0
    result = json.loads(out.read_text())
    assert [d["test_day"] for d in result["days"]] == [2, 3]
    for day in result["days"]:
        assert set(day) == {"test_day", "fixed", "retrain", "dynamic"}
        for method in ("fixed", "retrain", "dynamic"):
            assert 0.4 < day[method]["auc"] < 1 and day[method]["table_mib"] > 0
    dyn = [d["dynamic"] for d in result["days"]]
    capacity = FeatureSpec.from_yaml(tmp_path / "w" / "stream" / "day_1").cardinalities
    assert all(d["table_rows"] == sum(capacity) and d["rows_held"] <= d["table_rows"] for d in dyn)
    retrain = [d["retrain"]["table_rows"] for d in result["days"]]
    assert retrain[1] > retrain[0]  # a new vocabulary of more days
    assert result["days"][1]["fixed"]["train_seconds"] == 0  # trained once, on day 1
    assert set(result["summary"]) == {"fixed", "retrain", "dynamic"}
