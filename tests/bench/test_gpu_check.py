"""benchmarks/gpu_check.py, the GPU check's sections, run on the CPU at small sizes (so the prepared GPU check runs
when a GPU is at hand): each writes its JSON with what it measured."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from ctrkit.data.synthetic import generate_dataset
from tests.conftest import run_cli

ROOT = Path(__file__).resolve().parents[2]


def _module(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def gpu_check():
    yield _module("gpu_check")
    sys.modules.pop("compare_train", None)


def test_each_section_runs_and_writes_what_it_measured(gpu_check, tmp_path, capsys):
    data = tmp_path / "data"
    generate_dataset(data, 12_000, (3_000, 40_000, 300, 7), num_numerical=13, test_fraction=0.1, seed=0,
                     progress=False)  # fmt: skip
    out = tmp_path / "out"
    small = ["--dataset", str(data), "--out", str(out), "--device", "cpu", "--dim", "8", "--batch-size", "512"]
    sections = {
        # a small batch: bf16 is emulated on a CPU without native bf16 (a step of 512 rows took 1.3 s on cpu-avx2)
        "step": ["--steps", "2", "--rounds", "2", "--warmup", "1", "--distinct", "2", "--precisions", "fp32,tf32,bf16",
                 "--batch-size", "64"],
        "e2e": ["--max-steps", "6", "--print-freq", "2", "--precisions", "fp32"],
        "host": ["--steps", "10", "--cap", "0.01"],
        "syncs": ["--steps", "3"],
        "resume": ["--max-steps", "4", "--print-freq", "2", "--work", str(tmp_path / "work")],
        "profile": ["--steps", "3", "--warmup", "1", "--distinct", "2"],
    }  # fmt: skip
    results = {}
    for name, extra in sections.items():
        assert gpu_check.main([name, *small, *extra]) == 0
        results[name] = json.loads((out / f"{name}.json").read_text())
    capsys.readouterr()
    step = results["step"]
    assert set(step["samples_per_s"]) == {"fp32", "bf16"}  # no TF32 on a CPU
    assert all(len(t) == 2 for by in step["ms_per_step_rounds"].values() for t in by.values())
    assert all(v > 0 for by in step["samples_per_s"].values() for v in by.values())
    run = results["e2e"]["runs"]["fp32"]
    assert run["start_to_first_step_s"] > 0 and len(run["windows"]) == 3 and run["of_step_alone"] > 0
    assert "fp32" in run["plan_execution"][0]
    host = results["host"]
    assert host["cache"]["misses"] > 0 and host["cache"]["evicted"] > 0 and host["cache_rows"] < host["table_rows"]
    assert min(host["samples_per_s"].values()) > 0
    assert results["syncs"]["steps"] == 3 and results["syncs"]["device"] == "cpu"  # its count needs a GPU
    profiled = results["profile"]  # where the step's time goes: every part a name, the lookups and update among them
    assert {"table lookup", "table update", "dense layers"} <= set(profiled["ms_by_part"])
    assert 0 < sum(profiled["ms_by_part"].values()) and profiled["ms_per_step"] > 0
    assert min(profiled["bound_ms"].values()) > 0 and profiled["bandwidth_gb_s"] > 0
    resume = results["resume"]
    assert resume["resumed"]["from_step"] == 4 and resume["checkpoint_bytes"] > 0
    assert min(resume["fresh"]["start_to_first_step_s"], resume["resumed"]["start_to_first_step_s"]) > 0
    assert not list((tmp_path / "work").iterdir())  # its checkpoint deleted
    # condensed into the suite's table as run_gpu.sh does (the loader's JSON beside them)
    code, _, _ = run_cli("bench", "loader", "--dataset", data, "--batch-size", "512", "--batches", "3", "--rounds", "1",
                         "--device", "cpu", "--output", out / "loader.json", capsys=capsys)  # fmt: skip
    assert code == 0
    small_data = tmp_path / "small"  # trained in emulated bf16 too: a few batches
    generate_dataset(small_data, 3_000, (300, 4_000, 30, 7), num_numerical=13, test_fraction=0.2, seed=0,
                     progress=False)  # fmt: skip
    code, _, err = run_cli("bench", "accuracy", "--panel", "none", "--datasets", small_data, "--models", "dlrm",
                           "--baselines", "none", "--precisions", "fp32,bf16", "--work", tmp_path / "work",
                           "--out", out / "accuracy", capsys=capsys)  # fmt: skip
    assert code == 0, err
    (out / "accuracy.json").write_bytes((out / "accuracy" / "results.json").read_bytes())  # as run_gpu.sh copies it
    collect = _module("collect")
    written = json.loads(collect.collect("gpu", out, command="test", results=tmp_path / "results").read_text())
    checks = [row[0] for row in written["rows"]]
    assert written["machine_kind"].startswith("cpu-") and len(checks) == 2 + 2 + 1 + 1 + 1 + 1 + 1  # no wide copy
    assert checks[0].startswith("step: ctrkit") and "host memory" in checks[-3] and "resumed" in checks[-2]
    auc = json.loads((out / "accuracy.json").read_text())["rows"][0]["results"]
    assert set(auc) == {"dlrm/fp32", "dlrm/bf16"}  # --baselines none, as run_gpu.sh asks: the trained columns alone
    assert checks[-1] == "test AUC of dlrm on small against fp32 (time ratio)"
    assert written["rows"][-1][2:4] == [round(auc["dlrm/bf16"]["auc"], 4), round(auc["dlrm/fp32"]["auc"], 4)]
