"""Predictor variants against the fp32 PyTorch model, with scikit-learn's AUC as the judge."""

import json

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from ctrkit.data.dataset import SplitBinaryDataset
from ctrkit.serve.predictor import Predictor, load_predictor
from tests.conftest import run_cli


def test_bf16_weights_keep_the_auc(tiny_checkpoint, tiny_dataset):
    test = SplitBinaryDataset(tiny_dataset, "test")
    batch, labels = test.slice(0, len(test)), test.labels()
    fp32 = Predictor.from_checkpoint(tiny_checkpoint)(batch.numerical.numpy(), batch.categorical.numpy())[:, 0]
    bf16 = Predictor.from_checkpoint(tiny_checkpoint, dtype="bf16")(batch.numerical.numpy(), batch.categorical.numpy())[
        :, 0
    ]
    assert bf16.dtype == np.float32
    assert abs(roc_auc_score(labels, fp32) - roc_auc_score(labels, bf16)) < 1e-3
    assert np.abs(fp32 - bf16).max() < 0.02


def test_bad_predictor_requests_are_refused(tiny_checkpoint, tmp_path):
    with pytest.raises(ValueError, match="exactly one of `checkpoint` and `model_dir`"):
        load_predictor(None, None)
    with pytest.raises(ValueError, match="`dtype` must be fp32, or bf16 with the memory store"):
        Predictor.from_checkpoint(tiny_checkpoint, "mmap", 10, "bf16")
    with pytest.raises(ValueError, match="expected an export written by `ctrkit export`"):
        Predictor.from_export(tmp_path)


def test_bench_inference_in_process_and_through_a_server(tiny_checkpoint, tmp_path, capsys):
    out = tmp_path / "inf.json"
    code, stdout, _ = run_cli(
        "bench", "inference", "--checkpoint", tiny_checkpoint, "--batch-sizes", "1,32", "--runtimes",
        "torch,torch-bf16,onnx,torchscript", "--seconds", "0.05", "--repeats", "2", "--output", out, capsys=capsys,
    )  # fmt: skip
    assert code == 0
    written = json.loads(out.read_text())
    results = written["results"]
    assert [(r["runtime"], r["batch_size"]) for r in results] == [
        (rt, b) for rt in ("torch", "torch-bf16", "onnx", "torchscript") for b in (1, 32)
    ]
    for r in results:
        assert r["p50_ms"] <= r["p90_ms"] <= r["p99_ms"] and r["samples_per_s"] > 0 and r["calls"] >= 10
        assert len(r["rounds_samples_per_s"]) == 2 and r["samples_per_s"] == np.median(r["rounds_samples_per_s"])
        torch_rounds = next(t for t in results if t["runtime"] == "torch" and t["batch_size"] == r["batch_size"])
        ratios = np.array(r["rounds_samples_per_s"]) / np.array(torch_rounds["rounds_samples_per_s"])
        assert r["vs_torch"] == pytest.approx(np.median(ratios))
    assert {"load_average_1min", "load_average_1min_before"} <= written["environment"].keys()
    assert "load average (1 min) before" in stdout
    code, _, err = run_cli("bench", "inference", "--kaggle-shape", "--repeats", "0", capsys=capsys)
    assert code != 0 and "--repeats: expected an integer from 1 to 10000, got '0'" in err
    from tests.serve.test_server import Server  # the real server, on a free loopback port

    server = Server("--checkpoint", tiny_checkpoint)
    try:
        code, stdout, _ = run_cli(
            "bench", "inference", "--server", f"http://{server.url}/", "--batch-sizes", "1,16", "--requests", "40",
            "--concurrency", "4", "--output", out, capsys=capsys,
        )  # fmt: skip
    finally:
        server.stop()
    assert code == 0
    results = json.loads(out.read_text())["results"]
    assert [(r["batch_size"], r["requests"]) for r in results] == [(1, 40), (16, 40)]


def test_compiled_predictor_matches_eager(tiny_checkpoint, tiny_dataset, monkeypatch):
    """The compiled model scores as the eager one; its weights are frozen (Inductor's freeze ran) by an option of its
    own compilation, leaving the process-wide flag as it was for every other model."""
    import torch._inductor.config as inductor_config
    import torch._inductor.freezing as freezing

    frozen = []
    freeze = freezing.freeze
    monkeypatch.setattr(freezing, "freeze", lambda *a, **k: (frozen.append(1), freeze(*a, **k))[1])
    batch = SplitBinaryDataset(tiny_dataset, "test").slice(0, 257)
    eager = Predictor.from_checkpoint(tiny_checkpoint)
    before = inductor_config.freezing
    compiled = Predictor.from_checkpoint(tiny_checkpoint, compile=True)
    for n in (257, 3):  # two batch sizes: compiled for dynamic shapes
        args = (batch.numerical.numpy()[:n], batch.categorical.numpy()[:n])
        np.testing.assert_allclose(compiled(*args), eager(*args), atol=1e-5)
    assert frozen and inductor_config.freezing == before is False
