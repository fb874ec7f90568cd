"""`ctrkit bench ablation`: the recipe's run and each mechanism switched alone, read back as what each earns."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from ctrkit.bench.ablation import BASE, markdown, summarize, unused
from tests.conftest import run_cli

ROOT = Path(__file__).resolve().parents[2]


def record(dataset, seed, variant, auc, logloss=0.4, **more):
    return {"dataset": dataset, "seed": seed, "variant": variant, "switched": "off", "setting": False,
            "result": {"auc": auc, "logloss": logloss}, **more}  # fmt: skip


def test_the_verdict_keeps_what_gains_somewhere_and_loses_nowhere_beyond_the_spread():
    records = [
        record("a", 0, BASE, 0.800), record("a", 1, BASE, 0.802),  # spread 0.002
        record("b", 0, BASE, 0.700), record("b", 1, BASE, 0.700),  # spread 0
        record("a", 0, "gains", 0.790), record("a", 1, "gains", 0.792),  # off: 0.010 lower on a ...
        record("b", 0, "gains", 0.7005), record("b", 1, "gains", 0.7005),  # ... 0.0005 higher on b: beyond 0
        record("a", 0, "helps", 0.790), record("a", 1, "helps", 0.792),
        record("b", 0, "helps", 0.700, logloss=0.41), record("b", 1, "helps", 0.700, logloss=0.41),
        record("c", 0, BASE, 0.600), record("c", 0, "helps", 0.610),  # one seed: no spread, so no vote on a loss
        record("a", 0, "nothing", 0.801), record("a", 1, "nothing", 0.803),
        {**record("a", 0, "idle", 0), "unused": True}, {**record("a", 1, "idle", 0), "unused": True},
        {**record("a", 0, "wider", 0.805), "switched": "on"}, {**record("a", 1, "wider", 0.807), "switched": "on"},
        {**record("a", 0, "epochs_3", 0.799), "setting": True}, {**record("a", 1, "epochs_3", 0.801), "setting": True},
    ]  # fmt: skip
    got = summarize(records)
    assert got["spread"]["c"] is None and {k: got["spread"][k] for k in "ab"} == pytest.approx({"a": 0.002, "b": 0.0})
    verdicts = {name: row["verdict"] for name, row in got["mechanisms"].items()}
    assert verdicts == {"gains": "drop", "helps": "keep", "nothing": "drop", "idle": "unused",
                        "wider": "opt-in: earns", "epochs_3": "(a setting)"}  # fmt: skip
    helps = got["mechanisms"]["helps"]["datasets"]
    assert helps["a"]["auc"] == pytest.approx(0.010) and helps["b"]["logloss"] == pytest.approx(0.01)
    assert got["mechanisms"]["wider"]["datasets"]["a"]["auc"] == pytest.approx(0.005)  # on minus off
    table = markdown(got)
    assert "| helps | +0.0100 (+0.0) | +0.0000 (+10.0) | -0.0100 (+0.0) | keep |" in table
    assert "| idle | unused |  |  | unused |" in table


def test_unused_reads_the_recipes_run():
    log = [{"event": "start", "config": {"decay_steps": 50, "decay_start_step": 100, "min_delta": 0.0}},
           {"event": "warm_start"}, {"event": "eval", "auc": 0.70, "logloss": 0.50, "lr_scale": 1.0},
           {"event": "eval", "auc": 0.71, "logloss": 0.49, "lr_scale": 1.0}]  # fmt: skip
    assert unused("redraws", {}, log) and unused("plateau", {}, log) and unused("small_batch", {}, log)
    assert unused("decay", {"step": 100}, log) and not unused("decay", {"step": 101}, log)
    assert unused("warm_start_logloss", {}, log) and not unused("warm_start", {}, log)
    refused = [*log, {"event": "eval", "auc": 0.72, "logloss": 0.51, "lr_scale": 0.5}]  # better AUC, worse loss
    assert not unused("warm_start_logloss", {}, refused) and not unused("plateau", {}, refused)
    two = [{"event": "start", "config": {"batch_size": b}} for b in (1024, 256)]
    assert not unused("small_batch", {}, two) and unused("small_batch", {}, two[:1])


def test_bench_ablation_runs_resumes_and_collects(tiny_dataset, tmp_path, capsys):
    out = tmp_path / "abl"
    args = ["bench", "ablation", "--panel", "none", "--datasets", tiny_dataset, "--mechanisms",
            "buckets,calibration,redraws", "--train-seeds", "0,1", "--max-epochs", "1", "--out", out]  # fmt: skip
    code, text, err = run_cli(*args, capsys=capsys)
    assert code == 0, err
    records = json.loads((out / "results.json").read_text())
    assert [(r["seed"], r["variant"]) for r in records] == [
        (s, v) for s in (0, 1) for v in (BASE, "buckets", "calibration", "redraws", "epochs_1")
    ]
    assert all(r.get("derived") == "uncalibrated" for r in records if r["variant"] == "calibration")
    trained = [line for line in text.splitlines() if "test AUC" in line]
    assert len(trained) == 2 * 3 + sum(1 for r in records if r["variant"] == "redraws" and not r.get("unused"))
    base = next(r for r in records if r["variant"] == BASE and r["seed"] == 0)["result"]
    assert 0.5 < base["auc"] < 1 and (out / "logs" / "tiny-s0-recipe.jsonl").exists()
    table = (out / "results.md").read_text()
    assert table.startswith("| mechanism | tiny | verdict |") and "| epochs_1 |" in table and "(a setting)" in table
    code, text, _ = run_cli(*args, capsys=capsys)  # everything done: nothing trained again
    assert code == 0 and "test AUC" not in text.split("| mechanism")[0]
    assert json.loads((out / "results.json").read_text()) == records
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import collect
    finally:
        sys.path.pop(0)
    written = json.loads(collect.collect("ablation", out / "results.json", kind="cpu-test", command="test",
                                         results=tmp_path / "results").read_text())  # fmt: skip
    rows = {(r[0], r[1]): r for r in written["rows"]}
    assert set(rows) == {(m, "tiny") for m in ("buckets", "calibration", "redraws", "epochs_1")}
    assert rows[("epochs_1", "tiny")][-1] == "(a setting)" and rows[("buckets", "tiny")][2] == 2


def test_bench_ablation_switches_mechanisms_on_the_shop_logs(tmp_path, capsys):
    """`--panel shop`: the ablation runs on both shop logs (tags' effects added, averaged) as the accuracy panel
    builds them, each with its Bayes AUC."""
    out = tmp_path / "abl"
    code, _, err = run_cli("bench", "ablation", "--panel", "shop", "--shop-rows", "4000", "--mechanisms", "calibration",
                           "--train-seeds", "0", "--max-epochs", "1", "--work", tmp_path / "work", "--out", out,
                           capsys=capsys)  # fmt: skip
    assert code == 0, err
    records = json.loads((out / "results.json").read_text())
    assert sorted({r["dataset"] for r in records}) == ["shop-mean-4k-s0", "shop-sum-4k-s0"]
    base = [r for r in records if r["variant"] == BASE]
    assert len(base) == 2 and all(0.5 < r["result"]["auc"] < r["bayes_auc"] < 1 for r in base)
