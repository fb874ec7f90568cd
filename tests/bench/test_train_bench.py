import json

import numpy as np
import pytest

from ctrkit.bench.scale_bench import table_sizes
from tests.conftest import run_cli


def test_bench_train_writes_its_result(tmp_path, capsys):
    out = tmp_path / "r.json"
    code, stdout, _ = run_cli(
        "bench",
        "train",
        "--batch-size",
        "64",
        "--table-rows",
        "1000",
        "--num-tables",
        "4",
        "--warmup",
        "1",
        "--steps",
        "2",
        "--repeats",
        "3",
        "--output",
        out,
        capsys=capsys,
    )
    assert code == 0 and "samples/s" in stdout
    result = json.loads(out.read_text())
    assert result["config"]["batch_size"] == 64 and len(result["ms_per_step_all"]) == 3
    assert result["samples_per_s"] == 64 / (result["ms_per_step"] / 1000)
    assert {"samples_per_s", "ms_per_step", "machine"} <= set(result) and "threads" not in result  # said once
    assert {"torch", "threads", "cores", "cpu"} <= set(result["machine"])
    # where it ran, and what its cores do: the matmul peak measured in the same run
    assert result["machine"]["capability"] == __import__("torch").backends.cpu.get_cpu_capability()
    assert result["matmul_peak_gflops"]["fp32"] > 0.5


def test_bench_preprocess_runs_the_real_command(tmp_path, capsys):
    out = tmp_path / "p.json"
    code, stdout, _ = run_cli("bench", "preprocess", "--rows", "3000", "--repeats", "2", "--output", out, capsys=capsys)
    assert code == 0 and "3,000 rows in" in stdout and "median of 2" in stdout
    result = json.loads(out.read_text())
    assert result["rows"] == 3000 and result["engine"] == "polars" and result["peak_rss_mb"] > 10
    assert len(result["seconds_each"]) == 2 and result["seconds"] == pytest.approx(
        np.median(result["seconds_each"]), abs=1e-3
    )
    assert result["rows_per_s"] == result["rows"] / result["seconds"]


def test_bench_scale_runs_one_job_per_world_size(tmp_path, capsys):
    out = tmp_path / "s.json"
    flags = ["--models", "tiny", "--scale", "65536", "--world-sizes", "1,2", "--batch-size", "64"]
    code, stdout, _ = run_cli("bench", "scale", *flags, "--warmup", "1", "--steps", "2", "--output", out, capsys=capsys)
    assert code == 0 and "world size 2" in stdout
    results = json.loads(out.read_text())
    assert [r["world_size"] for r in results] == [1, 2]
    for r in results:
        assert r["tables"] == 55 and r["samples_per_s"] == 64 / r["ms_per_step"] * 1000
    assert sum(table_sizes("tiny", 65536, 32)) * 32 * 4 <= 4.2 * 2**30 / 65536  # the size the blog gives, scaled
    code, _, err = run_cli("bench", "scale", "--models", "huge", capsys=capsys)
    assert code == 2 and "unknown model 'huge'" in err
