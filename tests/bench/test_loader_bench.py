"""`ctrkit bench loader`: the input pipeline alone, read and read-and-copied, on a synthetic dataset it makes once."""

import json

from tests.conftest import run_cli


def test_bench_loader_reads_the_batches_asked_alone_and_with_the_copy(tmp_path, capsys):
    out = tmp_path / "loader.json"
    work = tmp_path / "work"
    args = ["bench", "loader", "--rows", "20000", "--tables", "1000,20000,50", "--work", work, "--batch-size", "990"]
    args += ["--batches", "7", "--rounds", "3", "--device", "cpu", "--output", out]
    code, stdout, _ = run_cli(*args, capsys=capsys)
    assert code == 0 and "samples/s alone" in stdout and "with the copy to cpu" in stdout
    result = json.loads(out.read_text())
    assert result["samples"] == {"loader": 6930, "loader_and_copy": 6930}  # 7 of the 19,800 rows' 20 batches
    assert all(len(v) == 3 and min(v) > 0 for v in result["samples_per_s"].values())
    assert result["device"] == "cpu" and result["machine"]["cores"] >= 1
    made = list((tmp_path / "work").iterdir())
    assert run_cli(*args, capsys=capsys)[0] == 0 and list((tmp_path / "work").iterdir()) == made  # made once
    code, _, err = run_cli(*args[:-2], "--batches", "0", capsys=capsys)
    assert code == 2 and "--batches: expected an integer from 1" in err
