"""Exports loaded back in the runtime that serves them, against the PyTorch model."""

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from google.protobuf import text_format
from sklearn.metrics import roc_auc_score
from tritonclient.grpc import model_config_pb2

from ctrkit.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from ctrkit.data.dataset import SplitBinaryDataset
from ctrkit.eval.evaluator import predict_logits
from ctrkit.export.exporter import export_checkpoint
from ctrkit.metrics import sigmoid
from ctrkit.models.registry import config_to_dict, create_model, make_config
from ctrkit.serve.predictor import Predictor
from tests.conftest import run_cli


@pytest.fixture(scope="module")
def rows(tiny_dataset):
    """500 real test rows, plus PyTorch's probabilities for them (the reference)."""
    test = SplitBinaryDataset(tiny_dataset, "test")
    batch = test.slice(0, 500)
    return batch.numerical.numpy(), batch.categorical.numpy()


def reference(ckpt_path, numerical, categorical):
    model = load_checkpoint(ckpt_path).build_model().eval()
    with torch.no_grad():
        return torch.sigmoid(model(torch.from_numpy(numerical), torch.from_numpy(categorical))).numpy()[:, None]


def test_onnx_matches_pytorch_and_maps_unseen_ids(tiny_checkpoint, tmp_path, rows, capsys):
    code, out, _ = run_cli(
        "export", "--checkpoint", tiny_checkpoint, "--format", "onnx", "--out", tmp_path / "onnx", capsys=capsys
    )
    assert code == 0 and "max abs diff" in out
    numerical, categorical = rows
    session = ort.InferenceSession(str(tmp_path / "onnx" / "model.onnx"), providers=["CPUExecutionProvider"])
    got = session.run(["probability"], {"numerical": numerical, "categorical": categorical})[0]
    np.testing.assert_allclose(got, reference(tiny_checkpoint, numerical, categorical), atol=1e-5)
    # ids beyond a table (and negative ones) score as the unseen id 0 instead of failing
    cards = json.loads((tmp_path / "onnx" / "ctrkit_model.json").read_text())["cardinalities"]
    wild = categorical[:20].copy()
    wild[:, 0], wild[:, 3] = cards[0] + 5, -7
    got = session.run(["probability"], {"numerical": numerical[:20], "categorical": wild})[0]
    tame = wild.copy()
    tame[:, 0], tame[:, 3] = 0, 0
    np.testing.assert_allclose(got, reference(tiny_checkpoint, numerical[:20], tame), atol=1e-5)


def test_int8_onnx_is_quantized_and_ranks_like_float(tiny_checkpoint, tiny_dataset, tmp_path, capsys):
    code, out, _ = run_cli(
        "export", "--checkpoint", tiny_checkpoint, "--format", "onnx", "--quantize", "int8", "--out", tmp_path / "q",
        capsys=capsys,
    )  # fmt: skip
    assert code == 0 and "(onnx, int8)" in out
    graph = onnx.load(str(tmp_path / "q" / "model.onnx")).graph
    ops = {n.op_type for n in graph.node}
    assert "DynamicQuantizeMatMul" in ops or "MatMulInteger" in ops or "DynamicQuantizeLinear" in ops, ops
    int8_weights = [t for t in graph.initializer if t.data_type == onnx.TensorProto.INT8]
    assert len(int8_weights) >= 3  # every linear layer's weights
    test = SplitBinaryDataset(tiny_dataset, "test")
    batch = test.slice(0, len(test))
    numerical, categorical, labels = batch.numerical.numpy(), batch.categorical.numpy(), batch.labels.numpy()
    session = ort.InferenceSession(str(tmp_path / "q" / "model.onnx"), providers=["CPUExecutionProvider"])
    got = session.run(["probability"], {"numerical": numerical, "categorical": categorical})[0]
    want = reference(tiny_checkpoint, numerical, categorical)
    assert np.abs(got - want).max() < 0.02
    assert abs(roc_auc_score(labels, got[:, 0]) - roc_auc_score(labels, want[:, 0])) < 2e-3
    assert json.loads((tmp_path / "q" / "ctrkit_model.json").read_text())["quantize"] == "int8"
    code, _, err = run_cli(
        "export", "--checkpoint", tiny_checkpoint, "--format", "torchscript", "--quantize", "int8", "--out",
        tmp_path / "t", capsys=capsys,
    )  # fmt: skip
    assert code == 2 and "quantization int8 applies to ONNX models" in err


@pytest.mark.parametrize(
    "name, extra, num_numerical",
    [("dlrm", {}, 0), ("dcnv2", {}, 3), ("dcnv2", {"structure": "parallel"}, 0), ("wide_deep", {}, 3),
     ("wide_deep", {}, 0)],
)  # fmt: skip
def test_every_model_exports_and_scores_like_pytorch(tmp_path, name, extra, num_numerical):
    """DCNv2, Wide & Deep, and models without numerical features (whose (B, 0) input must stay in the graph)."""
    torch.manual_seed(0)
    cfg = make_config(name, dict(num_numerical=num_numerical, cardinalities=[10, 20, 5], **extra))
    ckpt = tmp_path / "model.pt"
    model = create_model(name, cfg).eval()
    save_checkpoint(ckpt, Checkpoint(name, config_to_dict(cfg), {}, model.state_dict()))
    rng = np.random.default_rng(0)
    numerical = rng.normal(size=(64, num_numerical)).astype(np.float32)
    categorical = rng.integers(-2, 25, (64, 3))  # some ids outside their table: scored as id 0
    with torch.no_grad():
        known = np.where((categorical < 0) | (categorical >= [10, 20, 5]), 0, categorical)
        dense = torch.from_numpy(numerical) if num_numerical else None
        want = torch.sigmoid(model(dense, torch.from_numpy(known))).numpy()[:, None]
    for fmt, quantize, atol in (("onnx", "none", 1e-5), ("onnx", "int8", 0.05), ("torchscript", "none", 1e-6)):
        out = tmp_path / f"{fmt}-{quantize}"
        export_checkpoint(ckpt, out, fmt, quantize=quantize)
        predictor = Predictor.from_export(out)
        np.testing.assert_allclose(predictor(numerical, categorical), want, atol=atol, err_msg=f"{fmt} {quantize}")
    graph = onnx.load(str(tmp_path / "onnx-none" / "model.onnx")).graph
    assert [i.name for i in graph.input] == ["numerical", "categorical"]
    if num_numerical == 0:  # Triton refuses dims of 0
        with pytest.raises(ValueError, match="Triton refuses a zero-width input"):
            export_checkpoint(ckpt, tmp_path / "triton", "triton")
        assert not (tmp_path / "triton").exists()


def test_torchscript_matches_pytorch(tiny_checkpoint, tmp_path, rows, capsys):
    code, _, _ = run_cli(
        "export", "--checkpoint", tiny_checkpoint, "--format", "torchscript", "--out", tmp_path / "ts", capsys=capsys
    )
    assert code == 0
    numerical, categorical = rows
    module = torch.jit.load(str(tmp_path / "ts" / "model.pt"))
    with torch.no_grad():
        got = module(torch.from_numpy(numerical), torch.from_numpy(categorical)).numpy()
    np.testing.assert_allclose(got, reference(tiny_checkpoint, numerical, categorical), atol=1e-6)


def test_predict_and_export_agree(tiny_checkpoint, tiny_dataset, rows):
    """The exported probability is the sigmoid of what `ctrkit predict` scores."""
    numerical, categorical = rows
    model = load_checkpoint(tiny_checkpoint).build_model()
    logits = predict_logits(model, SplitBinaryDataset(tiny_dataset, "test"), torch.device("cpu"))[:500]
    np.testing.assert_allclose(sigmoid(logits)[:, None], reference(tiny_checkpoint, numerical, categorical), atol=1e-6)


@pytest.mark.parametrize("backend, platform, file", [("onnx", "onnxruntime_onnx", "model.onnx"),
                                                     ("torchscript", "pytorch_libtorch", "model.pt")])  # fmt: skip
def test_triton_repository_parses_with_tritons_schema(tiny_checkpoint, tmp_path, capsys, backend, platform, file):
    out = tmp_path / "repo"
    code, _, _ = run_cli(
        "export", "--checkpoint", tiny_checkpoint, "--format", "triton", "--out", out, "--name", "ctr",
        "--backend", backend, capsys=capsys,
    )  # fmt: skip
    assert code == 0 and (out / "ctr" / "1" / file).exists()
    config = text_format.Parse((out / "ctr" / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
    meta = json.loads((out / "ctr" / "ctrkit_model.json").read_text())
    assert config.name == "ctr" and config.platform == platform and config.max_batch_size > 0
    assert [(i.name, list(i.dims)) for i in config.input] == [
        ("numerical", [meta["num_numerical"]]),
        ("categorical", [len(meta["cardinalities"])]),
    ]
    assert [i.data_type for i in config.input] == [model_config_pb2.TYPE_FP32, model_config_pb2.TYPE_INT64]
    assert [(o.name, list(o.dims)) for o in config.output] == [("probability", [1])]
    assert config.HasField("dynamic_batching")


def test_export_refuses_bad_requests(tiny_checkpoint, tmp_path, capsys):
    run_cli("export", "--checkpoint", tiny_checkpoint, "--format", "onnx", "--out", tmp_path / "o", capsys=capsys)
    code, _, err = run_cli(
        "export", "--checkpoint", tiny_checkpoint, "--format", "onnx", "--out", tmp_path / "o", capsys=capsys
    )
    assert code == 2 and "--overwrite" in err
    code, _, err = run_cli(
        "export", "--checkpoint", tmp_path / "none.pt", "--format", "onnx", "--out", tmp_path / "x", capsys=capsys
    )
    assert code == 2 and "none.pt" in err


def _tree(root):
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_triton_export_adds_versions_to_an_existing_repository(tiny_checkpoint, tmp_path, capsys):
    """Exporting into a repository adds the model's next version (or --version N) and leaves every other
    model and version byte for byte as it was; a clash or another platform is refused, changing nothing."""
    repo = tmp_path / "repo"

    def export(*extra):
        return run_cli("export", "--checkpoint", tiny_checkpoint, "--format", "triton", "--out", repo, *extra,
                       capsys=capsys)  # fmt: skip

    assert export("--name", "ctr")[0] == 0
    assert export("--name", "other", "--backend", "torchscript")[0] == 0
    before = _tree(repo)
    code, out, _ = export("--name", "ctr")
    assert code == 0 and "version 2" in out
    after = _tree(repo)
    assert {k: v for k, v in after.items() if not k.startswith("ctr/2/")} == before  # nothing else touched
    assert set(k for k in after if k.startswith("ctr/2/")) == {
        "ctr/2/model.onnx", "ctr/2/ctrkit_model.json", "ctr/2/digests.json"}  # fmt: skip
    assert export("--name", "ctr", "--version", "7")[0] == 0
    assert export("--name", "ctr")[0] == 0
    assert sorted(p.name for p in (repo / "ctr").iterdir() if p.is_dir()) == ["1", "2", "7", "8"]

    snapshot = _tree(repo)
    code, _, err = export("--name", "ctr", "--version", "2")  # exists: refused without --overwrite
    assert code == 2 and "version 2 of model 'ctr' exists" in err and "--overwrite" in err
    code, _, err = export("--name", "ctr", "--backend", "torchscript")  # another platform than the model's
    assert code == 2 and "config.pbtxt" in err and "another --name" in err
    code, _, err = export("--name", "ctr", "--version", "0")
    assert code == 2 and "--version" in err
    assert _tree(repo) == snapshot
    assert export("--name", "ctr", "--version", "2", "--overwrite")[0] == 0
    assert {k: v for k, v in _tree(repo).items() if not k.startswith("ctr/2/")} == {
        k: v for k, v in snapshot.items() if not k.startswith("ctr/2/")
    }
    config = text_format.Parse((repo / "ctr" / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
    assert config.name == "ctr" and config.platform == "onnxruntime_onnx"


def test_a_failed_triton_export_leaves_the_repository_as_it_was(tiny_checkpoint, tmp_path, monkeypatch):
    import ctrkit.export.exporter as exporter
    from ctrkit.data.atomic import DiskError

    repo = tmp_path / "repo"
    export_checkpoint(tiny_checkpoint, repo, "triton", name="ctr")
    before = _tree(repo)

    def broken(*args, **kwargs):
        raise OSError("No space left on device")

    monkeypatch.setattr(exporter, "export_onnx", broken)
    for name in ("ctr", "new"):  # a new version of a model, and a new model
        with pytest.raises(DiskError, match=f"{repo / name}.*: cannot write it: no space left on device"):
            export_checkpoint(tiny_checkpoint, repo, "triton", name=name)
    assert _tree(repo) == before
    assert sorted(p.name for p in repo.iterdir()) == ["ctr"] and sorted(p.name for p in (repo / "ctr").iterdir()) == [
        "1", "config.pbtxt", "ctrkit_model.json"]  # fmt: skip


def test_exports_warn_about_nothing(tiny_checkpoint, tmp_path, caplog):
    """No TracerWarning from tracing, no request to pre-process from onnxruntime's quantizer: each fixed at its cause
    (the normaliser branches on a Python int; the quantizer gets a pre-processed graph)."""
    import logging
    import warnings

    caplog.set_level(logging.WARNING)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.simplefilter("ignore", DeprecationWarning)  # Python shows users none from a library (torch's trace)
        for fmt, quantize in (("onnx", "none"), ("onnx", "int8"), ("torchscript", "none")):
            export_checkpoint(tiny_checkpoint, tmp_path / f"{fmt}-{quantize}", fmt, quantize=quantize)
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert sorted(p.name for p in (tmp_path / "onnx-int8").iterdir()) == [
        "ctrkit_model.json", "digests.json", "model.onnx"]  # fmt: skip
