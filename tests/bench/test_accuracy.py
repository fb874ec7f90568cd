"""The accuracy benchmark: baselines on small data, the table with every row, the panel builders."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ctrkit.data.dataset import SplitBinaryDataset
from ctrkit.data.synthetic_outbrain import generate_outbrain
from ctrkit.eval.baselines import read_table
from tests.conftest import SHARED_DATA, run_cli

pytest.importorskip("lightgbm")


def test_read_table_bags_match_the_dataset(tmp_path):
    spec = generate_outbrain(tmp_path / "ob", 3000, 0.2, seed=1, progress=False)
    test = SplitBinaryDataset(spec, "test")
    table = read_table(test)
    batch = test.slice(0, len(test))
    mh = batch.multi_hot
    n = len(test)
    for f, bags in enumerate(table.multi_hot):
        for i in range(0, n, 97):
            lo, hi = int(mh.offsets[f * n + i]), int(mh.offsets[f * n + i + 1])
            want = np.bincount(mh.ids[lo:hi].numpy(), minlength=bags.shape[1])
            np.testing.assert_array_equal(bags[i].toarray()[0], want)
    np.testing.assert_array_equal(table.categorical, batch.categorical.numpy())
    assert table.labels.tolist() == test.labels().tolist()


def test_bench_accuracy_writes_a_row_per_data_set(tiny_dataset, tmp_path, capsys):
    # the planted families share one builder: the tabular one trains here, all three are built in the next test
    code, out, err = run_cli(
        "bench", "accuracy", "--panel", "tabular,outbrain", "--tabular-rows", "14400", "--outbrain-rows", "4000",
        "--seeds", "0", "--models", "dlrm", "--datasets", tiny_dataset, "--work", tmp_path / "work",
        "--out", tmp_path / "acc", capsys=capsys,
    )  # fmt: skip
    assert code == 0, err
    doc = json.loads((tmp_path / "acc" / "results.json").read_text())
    assert [r["dataset"] for r in doc["rows"]] == ["tabular-14k-s0", "outbrain-4k-s0", "tiny"]
    # the outbrain row: raw files through `preprocess outbrain` (multi-hot bags, CTR features), the evaluation
    # displays as test
    outbrain = doc["rows"][1]
    summary = json.loads((tmp_path / "work" / "outbrain-4k-s0" / "summary.json").read_text())
    assert outbrain["rows"]["test"] == summary["rows"]["test"]
    assert outbrain["rows"]["train"] + outbrain["rows"]["validation"] == summary["rows"]["train"]
    assert set(outbrain["results"]) == {"logistic", "lightgbm", "dlrm"}
    assert all(0.6 < r["auc"] < 0.95 for r in outbrain["results"].values()), outbrain["results"]
    # its few thousand rows are small data: each model also trained at a smaller batch (whichever it kept)
    assert outbrain["results"]["dlrm"]["batch_size"] is not None
    kept_scales = [r["results"]["dlrm"]["calibration"] for r in doc["rows"]]
    assert all(s is None or s > 0 for s in kept_scales)  # each model's kept logit scale (--calibrate), or none
    assert doc["machine"]["capability"] and doc["machine"]["torch"] and doc["matmul_peak_gflops"]["fp32"] > 0
    planted = doc["rows"][0]
    assert set(planted["results"]) == {"logistic", "lightgbm", "dlrm"}
    # 11 batches an epoch: not small data, so one model at one batch
    assert planted["rows"] == {"train": 10800, "validation": 1200, "test": 2400}
    dlrm = planted["results"]["dlrm"]
    assert dlrm["seed_ensemble"] is None and dlrm["batch_size"] is None and dlrm["ensemble"] is None
    for method, r in planted["results"].items():  # every method learns something and none beats Bayes
        assert 0.55 < r["auc"] < planted["bayes_auc"], (planted["dataset"], method, r)
    table = (tmp_path / "acc" / "results.md").read_text()
    assert "| tabular-14k-s0 | 10,800 / 1,200 / 2,400 |" in table and "| tiny |" in table
    assert table.count("\n| ") == 4 and "gap to Bayes closed" in table and "LightGBM" in out


def test_panel_builds_each_planted_family(tmp_path):
    """Each planted family of the panel (interactions, tabular, raw amounts) is built under its name with its
    Bayes AUC; training on them is the previous test's (the tabular family) and the accuracy benchmark's."""
    from ctrkit.bench.panel import build_panel

    families = ("criteo", "planted", "tabular", "amounts", "shop")  # no shared data; shop at no size: neither built
    sizes = {"planted": [2400], "tabular": [2400], "amounts": [2400]}
    with pytest.raises(ValueError, match=r"no rows given for the generated families \['shop'\]"):
        build_panel(tmp_path, None, families, sizes)  # a family named without its rows is a caller's slip
    entries = build_panel(tmp_path, None, families, {**sizes, "shop": []})
    assert [e.name for e in entries] == ["planted-2k-s0", "tabular-2k-s0", "amounts-2k-s0"]
    for entry in entries:
        train, test = (SplitBinaryDataset(entry.path, m) for m in ("train", "test"))
        assert (len(train), len(test)) == (2000, 400)
        assert 0.5 < entry.bayes_auc < 1.0 and "2,000 train rows" in entry.note
    # only the interactions family's columns show part of its odds (a hidden state through noisy counts)
    assert entries[0].observable_auc < entries[0].bayes_auc and entries[1].observable_auc is None
    generators = {SplitBinaryDataset(e.path, "train").spec.metadata["generator"] for e in entries}
    assert len(generators) == 3, generators


def test_panel_builds_shop_logs_through_preprocess_table(tmp_path):
    """The shop family: a log whose tags add their effects and one whose tags average them, each through `preprocess
    table` (a timestamp read as hour and weekday, the pooling chosen by its test), its Bayes AUC the true log-odds'
    on the test rows, above every model's reach and below 1."""
    from ctrkit.bench.panel import build_panel
    from ctrkit.data.feature_spec import FeatureSpec

    entries = build_panel(tmp_path, None, ("shop",), {"shop": [20_000], "planted": [2400]})  # planted: not named
    assert [e.name for e in entries] == ["shop-sum-20k-s0", "shop-mean-20k-s0"]
    for entry, tags in zip(entries, ("sum", "mean")):
        assert (len(SplitBinaryDataset(entry.path, "train")), len(SplitBinaryDataset(entry.path, "test"))) == (
            18_000, 2_000)  # fmt: skip
        spec = FeatureSpec.from_yaml(entry.path)
        assert spec.multi_hot_combiners == [tags]
        assert {"ts_hour", "ts_weekday", "user"} <= set(spec.summary()["categorical_features"])
        assert 0.7 < entry.bayes_auc < 0.9 and "18,000 train rows" in entry.note


@pytest.mark.skipif(not (SHARED_DATA / "movielens").exists(), reason="../shared/data is absent")
def test_real_panel_builders(tmp_path):
    from ctrkit.bench.panel import build_avazu, build_movielens

    avazu = build_avazu(SHARED_DATA / "avazu", tmp_path / "avazu")
    assert [len(SplitBinaryDataset(avazu.path, m)) for m in ("train", "test")] == [7999, 2000]
    ml = build_movielens(SHARED_DATA / "movielens", tmp_path / "ml")
    train, validation, test = (SplitBinaryDataset(ml.path, m) for m in ("train", "validation", "test"))
    assert len(train) + len(validation) + len(test) == 100_000 and train.spec.multi_hot_cardinalities == [19]
    assert 0.09 < len(validation) / 100_000 < 0.11 and 0.19 < len(test) / 100_000 < 0.21
    assert 0.5 < train.labels().mean() < 0.6  # ratings of 4 and 5 are 55% of ml-100k
    # the per-user split: validation's users are (nearly all) train's users, unlike the tail of train in time
    users = [set(d.slice(0, len(d)).categorical[:, 0].tolist()) for d in (train, validation)]
    assert len(users[1] - users[0]) / len(users[1]) < 0.05


def test_bench_accuracy_epoch_maxima_columns_and_check(tiny_dataset, tmp_path, capsys):
    code, out, err = run_cli(
        "bench", "accuracy", "--panel", "none", "--datasets", tiny_dataset, "--models", "dlrm", "--baselines",
        "logistic", "--epochs", "1,2", "--work", tmp_path / "work", "--out", tmp_path / "acc", capsys=capsys,
    )  # fmt: skip
    assert code == 0, err
    res = json.loads((tmp_path / "acc" / "results.json").read_text())["rows"][0]["results"]
    assert set(res) == {"logistic", "dlrm@1", "dlrm@2"}
    assert res["dlrm@1"]["steps"] < res["dlrm@2"]["steps"]  # the second ran past one epoch's steps
    table = (tmp_path / "acc" / "results.md").read_text()
    assert "| DLRM (1 ep.) | DLRM (2 ep.) |" in table
    assert "tiny: DLRM with 2 epochs >= with 1 - 0.002: " in table
    code, _, err = run_cli("bench", "accuracy", "--panel", "none", "--datasets", tiny_dataset, "--epochs", "0",
                           "--work", tmp_path / "work", capsys=capsys)  # fmt: skip
    assert code == 2 and "--epochs: expected maxima >= 1" in err


def test_bench_accuracy_precision_columns(tiny_dataset, tmp_path, capsys):
    from ctrkit.device import cpu_native_bf16

    code, out, err = run_cli(
        "bench", "accuracy", "--panel", "none", "--datasets", tiny_dataset, "--models", "dlrm", "--baselines",
        "logistic", "--precisions", "fp32,bf16", "--work", tmp_path / "work", "--out",
        tmp_path / "acc", capsys=capsys,
    )  # fmt: skip
    assert code == 0, err
    res = json.loads((tmp_path / "acc" / "results.json").read_text())["rows"][0]["results"]
    assert set(res) == {"logistic", "dlrm/fp32", "dlrm/bf16"}
    assert res["dlrm/fp32"]["precision"] == "fp32" and res["dlrm/fp32"]["computed_in"] == "fp32"
    # bf16 where this CPU computes it natively, else the run says it computed in fp32 (and trained the same)
    native = cpu_native_bf16()
    assert res["dlrm/bf16"]["computed_in"] == ("bf16" if native else "fp32")
    assert (res["dlrm/bf16"]["logloss"] != res["dlrm/fp32"]["logloss"]) == native
    table = (tmp_path / "acc" / "results.md").read_text()
    assert "| logistic regression | DLRM (fp32) | DLRM (bf16) |" in table
    delta = res["dlrm/bf16"]["auc"] - res["dlrm/fp32"]["auc"]
    assert f"tiny: DLRM in bf16 against fp32: test AUC {delta:+.4f}, log loss " in table
    code, _, err = run_cli("bench", "accuracy", "--panel", "none", "--datasets", tiny_dataset, "--precisions",
                           "fp64", "--work", tmp_path / "work", capsys=capsys)  # fmt: skip
    assert code == 2 and "--precisions: expected names among fp32, tf32, bf16, fp16, got fp64" in err


def test_bench_accuracy_keeps_the_runs_it_finished(tiny_dataset, tmp_path, capsys):
    code, _, err = run_cli(
        "bench", "accuracy", "--panel", "none", "--datasets", tiny_dataset, tmp_path / "missing", "--models", "dlrm",
        "--baselines", "logistic", "--work", tmp_path / "work", "--out", tmp_path / "acc", capsys=capsys,
    )  # fmt: skip
    assert code == 2 and "missing" in err  # the second data set does not exist
    rows = json.loads((tmp_path / "acc" / "results.json").read_text())["rows"]
    assert [r["dataset"] for r in rows] == ["tiny"] and set(rows[0]["results"]) == {"logistic", "dlrm"}
    assert "| tiny |" in (tmp_path / "acc" / "results.md").read_text()
    # the second precision fails on a CPU (no fp16 there): the baseline's and the first precision's runs are kept
    code, _, err = run_cli(
        "bench", "accuracy", "--panel", "none", "--datasets", tiny_dataset, "--models", "dlrm", "--baselines",
        "logistic", "--precisions", "fp32,fp16", "--work", tmp_path / "work", "--out", tmp_path / "acc2", capsys=capsys,
    )  # fmt: skip
    assert code == 2 and "fp16 is not supported on CPU" in err
    rows = json.loads((tmp_path / "acc2" / "results.json").read_text())["rows"]
    assert len(rows) == 1 and set(rows[0]["results"]) == {"logistic", "dlrm/fp32"}


def test_targets_measure_the_gap_to_bayes_and_to_what_the_columns_allow():
    """The targets line each share of the gap from logistic regression closed by the best model: to the Bayes AUC,
    and to the best AUC of any model of the columns where the data set records it."""
    from ctrkit.bench.accuracy import targets

    results = {"logistic": {"auc": 0.70}, "dlrm": {"auc": 0.76, "model": "dlrm"}}
    row = {"dataset": "p", "bayes_auc": 0.80, "observable_auc": 0.78, "results": results}
    lines = targets([row, {**row, "dataset": "q", "observable_auc": None}])
    assert "p: gap to Bayes closed: 60%" in lines and "q: gap to Bayes closed: 60%" in lines
    assert "p: gap to the best any model of the columns can reach closed: 75%" in lines
    assert not any(line.startswith("q: gap to the best") for line in lines)


def test_targets_read_each_model_against_the_regression_over_a_groups_seeds():
    """Where a family at one size was drawn with several seeds, the targets give each model's test AUC minus the
    regression's over them: the median, the seeds below and the spread; the target holds where the median is at
    least 0. A data set drawn once gives no such line."""
    import statistics

    from ctrkit.bench.accuracy import targets

    def row(name, group, lr, dlrm, dcnv2):
        results = {"logistic": {"auc": lr}, "dlrm": {"auc": dlrm, "model": "dlrm", "epochs": None, "precision": None},
                   "dcnv2": {"auc": dcnv2, "model": "dcnv2", "epochs": None, "precision": None}}  # fmt: skip
        return {"dataset": name, "group": group, "results": results}

    rows = [row("s-s0", "s", 0.70, 0.71, 0.69), row("s-s1", "s", 0.75, 0.748, 0.747),
            row("s-s2", "s", 0.72, 0.724, 0.721), row("t-s0", "t", 0.70, 0.60, 0.60),
            row("criteo", None, 0.70, 0.60, 0.60)]  # fmt: skip
    lines = [line for line in targets(rows) if " seeds: " in line]
    spread = statistics.stdev([0.01, -0.002, 0.004])
    assert lines == [
        f"s, 3 seeds: DLRM - logistic regression: median +0.0040, below on 1, sd over the data seeds {spread:.4f}; "
        "median >= 0: yes",
        f"s, 3 seeds: DCNv2 - logistic regression: median -0.0030, below on 2, sd over the data seeds "
        f"{statistics.stdev([-0.01, -0.003, 0.001]):.4f}; median >= 0: no",
    ]


def test_every_family_a_panel_names_is_one_the_panel_builds():
    """The names `--panel` takes are the families `build_panel` builds, real and generated, and the independent
    tables the command adds; `bench ablation`'s are among them."""
    from ctrkit.bench.config import ABLATION_FAMILIES, PANEL_FAMILIES, REAL_SAMPLES
    from ctrkit.bench.panel import GENERATED, REAL_BUILDERS

    assert set(REAL_BUILDERS) == set(REAL_SAMPLES)
    assert sorted(PANEL_FAMILIES) == sorted({*REAL_SAMPLES, *GENERATED, "independent"})
    assert set(ABLATION_FAMILIES) <= set(PANEL_FAMILIES)


def test_bench_accuracy_takes_every_family_its_help_names(tmp_path, capsys):
    """Every family of the default panel is a name `--panel` takes: the shop logs train through the command (it
    refused `--panel shop`, and so its own default panel)."""
    from ctrkit.bench.config import AccuracyBenchConfig

    code, out, err = run_cli(
        "bench", "accuracy", "--panel", "shop", "--shop-rows", "4000", "--seeds", "0", "--models", "dlrm",
        "--baselines", "logistic", "--work", tmp_path / "work", "--out", tmp_path / "acc", capsys=capsys,
    )  # fmt: skip
    assert code == 0, err
    doc = json.loads((tmp_path / "acc" / "results.json").read_text())
    assert [r["dataset"] for r in doc["rows"]] == ["shop-sum-4k-s0", "shop-mean-4k-s0"]
    assert [r["group"] for r in doc["rows"]] == ["shop-sum-4k", "shop-mean-4k"]  # what the targets read seeds by
    for row in doc["rows"]:
        assert set(row["results"]) == {"logistic", "dlrm"} and row["results"]["dlrm"]["auc"] < row["bayes_auc"]
    code, out, err = run_cli("bench", "accuracy", "--panel", ",".join(AccuracyBenchConfig().panel), "--models", "x",
                             capsys=capsys)  # fmt: skip
    assert code == 2 and "['x']" in err  # the default panel's names pass the check; the unknown model does not
