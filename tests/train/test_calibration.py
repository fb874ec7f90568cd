"""``--calibrate``: the kept model's logit scale fitted on validation at the end of training, stored in the
checkpoint and applied by evaluate, predict, the server's predictor and exports (ONNX Runtime), checked against
the scale refitted from the checkpoint's own model and scikit-learn's log loss; and for a seed ensemble, fitted
to the mean of its members."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from sklearn.metrics import log_loss, roc_auc_score

from ctrkit.calibration import fit_scale
from ctrkit.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from ctrkit.data.dataset import SplitBinaryDataset, split_tail
from ctrkit.eval.evaluator import predict_logits
from ctrkit.export.exporter import export_checkpoint
from ctrkit.serve.predictor import Predictor
from ctrkit.train.run import train
from tests.conftest import run_cli, small_model_flags

MODEL = dict(embedding_dim=8, bottom_mlp=(32, 8), top_mlp=(32, 1), progress=False)
CPU = torch.device("cpu")


def sigmoid(z):
    return 1 / (1 + np.exp(-np.asarray(z, np.float64)))


def splits(dataset):
    return (*split_tail(SplitBinaryDataset(dataset, "train"), 0.1), SplitBinaryDataset(dataset, "test"))


@pytest.fixture(scope="module")
def calibrated_run(tiny_dataset, tmp_path_factory):
    where = tmp_path_factory.mktemp("calibrated")
    result = train(tiny_dataset, "dlrm", max_steps=60, batch_size=256, calibrate="on", save_checkpoint=where / "m.pt",
                   log_path=where / "log.jsonl", **MODEL)  # fmt: skip
    return result, where


def test_the_scale_is_fitted_to_the_kept_models_validation_logits(calibrated_run, tiny_dataset):
    result, where = calibrated_run
    ckpt = load_checkpoint(where / "m.pt")
    _, validation, test = splits(tiny_dataset)
    raw = predict_logits(ckpt.build_model(), validation, CPU)  # the kept model, without its scale
    scale, before, after = fit_scale(raw, validation.labels())
    assert ckpt.calibration == pytest.approx(scale, rel=1e-6) and ckpt.calibration != 1.0
    fit = result["calibration"]
    assert fit["applied"] and fit["scale"] == ckpt.calibration
    assert (fit["logloss_before"], fit["logloss_after"]) == pytest.approx((before, after), rel=1e-6)
    record = next(json.loads(line) for line in (where / "log.jsonl").read_text().splitlines()
                  if json.loads(line)["event"] == "calibration")  # fmt: skip
    assert record["scale"] == ckpt.calibration
    # the test scores are the scaled model's: scikit-learn's log loss of sigmoid(scale * logit), the AUC unchanged
    logits, labels = predict_logits(ckpt.build_model(), test, CPU), test.labels()
    assert result["logloss"] == pytest.approx(log_loss(labels, sigmoid(ckpt.calibration * logits)), rel=1e-5)
    assert result["logloss"] != pytest.approx(log_loss(labels, sigmoid(logits)), rel=1e-5)
    assert result["auc"] == pytest.approx(roc_auc_score(labels, logits), abs=1e-9)


def test_evaluate_predict_serve_and_export_apply_it(calibrated_run, tiny_dataset, tmp_path, capsys):
    result, where = calibrated_run
    ckpt = load_checkpoint(where / "m.pt")
    test = SplitBinaryDataset(tiny_dataset, "test")
    want = sigmoid(ckpt.calibration * predict_logits(ckpt.build_model(), test, CPU))
    code, out, _ = run_cli("evaluate", "--checkpoint", where / "m.pt", "--dataset", tiny_dataset, "--json",
                           capsys=capsys)  # fmt: skip
    assert code == 0 and json.loads(out)["logloss"] == pytest.approx(result["logloss"], rel=1e-6)
    code, _, _ = run_cli("predict", "--checkpoint", where / "m.pt", "--dataset", tiny_dataset, "--out",
                         tmp_path / "p.npy", capsys=capsys)  # fmt: skip
    assert code == 0
    np.testing.assert_allclose(np.load(tmp_path / "p.npy"), want, rtol=0, atol=1e-6)
    batch = test.slice(0, len(test))
    arrays = (batch.numerical.numpy(), batch.categorical.numpy())
    np.testing.assert_allclose(Predictor.from_checkpoint(where / "m.pt")(*arrays)[:, 0], want, rtol=0, atol=1e-6)
    export_checkpoint(where / "m.pt", tmp_path / "onnx", "onnx")
    served = Predictor.from_export(tmp_path / "onnx")  # run by ONNX Runtime
    assert served.backend == "onnx"
    np.testing.assert_allclose(served(*arrays)[:, 0], want, rtol=0, atol=1e-5)


def test_off_keeps_the_models_own_logits(tiny_dataset, tmp_path, capsys):
    code, out, _ = run_cli("train", "--dataset", tiny_dataset, "--max-steps", "60", "--batch-size", "256",
                           "--calibrate", "off", "--no-progress", "--save-checkpoint", tmp_path / "m.pt",
                           "--log-path", tmp_path / "log.jsonl", *small_model_flags(), capsys=capsys)  # fmt: skip
    assert code == 0 and "--calibrate" not in out
    ckpt = load_checkpoint(tmp_path / "m.pt")
    assert ckpt.calibration is None
    assert all(json.loads(line)["event"] != "calibration" for line in (tmp_path / "log.jsonl").read_text().splitlines())
    test = SplitBinaryDataset(tiny_dataset, "test")
    logits = predict_logits(ckpt.build_model(), test, CPU)
    code, out, _ = run_cli("evaluate", "--checkpoint", tmp_path / "m.pt", "--dataset", tiny_dataset, "--json",
                           capsys=capsys)  # fmt: skip
    assert json.loads(out)["logloss"] == pytest.approx(log_loss(test.labels(), sigmoid(logits)), rel=1e-5)
    with pytest.raises(ValueError, match="`calibrate`: expected one of auto, on, off, got 'sometimes'"):
        train(tiny_dataset, "dlrm", calibrate="sometimes", **MODEL)


def test_a_seed_ensembles_scale_is_fitted_to_the_mean_of_its_members(tiny_dataset, tmp_path):
    from ctrkit.models.registry import create_model, make_config

    result = train(tiny_dataset, "dlrm", max_steps=40, batch_size=512, seed_ensemble=2, small_batch=0,
                   snapshot_ensemble=1, calibrate="on", save_checkpoint=tmp_path / "m.pt", **MODEL)  # fmt: skip
    ckpt = load_checkpoint(tmp_path / "m.pt")
    _, validation, test = splits(tiny_dataset)
    assert len(ckpt.members) == 2

    def kept_logits(dataset):  # each kept member's own model, rebuilt from its weights; their mean
        out = []
        for i in ckpt.member_ensemble:
            model = create_model("dlrm", make_config("dlrm", ckpt.model_config))
            model.load_state_dict(ckpt.members[i]["models"][0])
            out.append(predict_logits(model, dataset, CPU))
        return np.mean(np.asarray(out, np.float64), axis=0)

    scale, _, _ = fit_scale(kept_logits(validation), validation.labels())
    assert ckpt.calibration == pytest.approx(scale, rel=1e-5) and result["calibration"]["scale"] == ckpt.calibration
    labels = test.labels()
    assert result["logloss"] == pytest.approx(log_loss(labels, sigmoid(scale * kept_logits(test))), rel=1e-5)


def test_checkpoints_without_a_scale_load_and_bad_ones_are_refused(tiny_checkpoint, tmp_path):
    ckpt = load_checkpoint(tiny_checkpoint)
    data = ckpt.to_dict()
    del data["calibration"]  # as written before calibration existed
    torch.save(data, tmp_path / "old.pt")
    assert load_checkpoint(tmp_path / "old.pt").calibration is None
    ckpt.calibration = -2.0
    save_checkpoint(tmp_path / "bad.pt", ckpt)
    with pytest.raises(CheckpointError, match="bad.pt: the calibration scale must be a positive finite number"):
        load_checkpoint(tmp_path / "bad.pt")
