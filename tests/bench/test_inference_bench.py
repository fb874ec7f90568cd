"""`ctrkit bench inference --kaggle-shape`: the model it measures is the Criteo-Kaggle DLRM, whatever
DLRM's own defaults are."""

import json

from tests.conftest import run_cli


def test_kaggle_shape_benchmark_runs_with_the_kaggle_model(tmp_path, capsys):
    out = tmp_path / "r.json"
    code, stdout, err = run_cli(
        "bench", "inference", "--kaggle-shape", "--runtimes", "torch", "--batch-sizes", "64", "--seconds", "0.2",
        "--repeats", "1", "--output", out, capsys=capsys,
    )  # fmt: skip
    assert code == 0, err
    doc = json.loads(out.read_text())
    (row,) = doc["results"]
    assert row["runtime"] == "torch" and row["batch_size"] == 64 and row["samples_per_s"] > 0
    assert doc["machine"]["capability"] and doc["matmul_peak_gflops"]["fp32"] > 0  # where it ran


def test_kaggle_shape_is_the_kaggle_model():
    from ctrkit.bench.inference_bench import KAGGLE_SHAPE
    from ctrkit.models.registry import make_config

    cfg = make_config("dlrm", dict(KAGGLE_SHAPE))
    assert (cfg.embedding_dim, cfg.bottom_mlp, cfg.top_mlp) == (16, (512, 256, 64, 16), (512, 256, 1))
    assert cfg.cardinalities == (100_000,) * 26
