import json

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
    assert {"torch", "threads", "samples_per_s", "ms_per_step"} <= set(result)


def test_bench_preprocess_runs_the_real_command(tmp_path, capsys):
    out = tmp_path / "p.json"
    code, stdout, _ = run_cli("bench", "preprocess", "--rows", "3000", "--output", out, capsys=capsys)
    assert code == 0 and "3,000 rows in" in stdout
    result = json.loads(out.read_text())
    assert result["rows"] == 3000 and result["engine"] == "polars" and result["peak_rss_mb"] > 10
    assert result["rows_per_s"] == result["rows"] / result["seconds"]
