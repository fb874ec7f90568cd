"""Serving dynamic features: raw 64-bit ids in requests, through every backend and the real server, against
`ctrkit predict`; a continued day's model exported as the repository's next version and served."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.http as httpclient

from ctrkit.data.dataset import SplitBinaryDataset
from ctrkit.data.feature_spec import FeatureSpec
from ctrkit.data.synthetic_stream import write_stream
from ctrkit.serve.predictor import Predictor
from tests.conftest import run_cli
from tests.serve.test_server import Server

N_ROWS = 300
SHAPE = ("--model", "dlrm", "--embedding-dim", "8", "--bottom-mlp", "16,8", "--top-mlp", "16,1", "--no-progress",
         "--small-batch", "0", "--batch-size", "500")  # fmt: skip


@pytest.fixture(scope="module")
def days(tmp_path_factory):
    out = tmp_path_factory.mktemp("stream") / "s"
    return write_stream(out, 2, 5000, (2000, 600, 40, 5), capacity=0.5, seed=5, progress=False, num_numerical=3)


@pytest.fixture(scope="module")
def checkpoints(days, tmp_path_factory):
    root = tmp_path_factory.mktemp("ck")
    first, second = root / "day1.pt", root / "day2.pt"
    assert run_cli("train", "--dataset", days[0], *SHAPE, "--max-steps", "12", "--save-checkpoint", first)[0] == 0
    assert run_cli("train", "--dataset", days[1], *SHAPE, "--max-steps", "12", "--continue-from", first,
                   "--save-checkpoint", second)[0] == 0  # fmt: skip
    return first, second


def _rows(day):
    batch = SplitBinaryDataset(FeatureSpec.from_yaml(day), "test").slice(0, N_ROWS)
    return batch.numerical.numpy(), batch.categorical.numpy()


def _predicted(checkpoint, day, tmp_path):
    out = tmp_path / "p.npy"
    assert run_cli("predict", "--checkpoint", checkpoint, "--dataset", day, "--mapping", "test", "--out", out)[0] == 0
    return np.load(out)[:N_ROWS, None]


def test_every_backend_takes_raw_ids_like_ctrkit_predict(days, checkpoints, tmp_path):
    numerical, raw = _rows(days[1])
    predicted = _predicted(checkpoints[1], days[1], tmp_path)
    for fmt in ("onnx", "torchscript"):
        assert run_cli("export", "--checkpoint", checkpoints[1], "--format", fmt, "--out", tmp_path / fmt)[0] == 0
        assert (tmp_path / fmt / "dynamic_ids.npz").is_file()
    predictors = {
        "checkpoint": Predictor.from_checkpoint(checkpoints[1]),
        "mmap": Predictor.from_checkpoint(checkpoints[1], embedding_store="mmap", cache_rows=50),
        **{fmt: Predictor.from_export(tmp_path / fmt) for fmt in ("onnx", "torchscript")},
    }
    for name, predictor in predictors.items():
        np.testing.assert_allclose(predictor(numerical, raw), predicted, atol=1e-5, err_msg=name)
    # ids no table holds score as the rare row: two different unseen ids give the same probability
    a, b = raw[:20].copy(), raw[:20].copy()
    a[:, 0], b[:, 0] = 10**15 + 1, -(10**15) - 7
    for name, predictor in predictors.items():
        np.testing.assert_allclose(predictor(numerical[:20], a), predictor(numerical[:20], b), atol=1e-6, err_msg=name)
    assert not np.allclose(predictors["onnx"](numerical[:20], a), predicted[:20], atol=1e-4)


def test_next_day_is_the_next_version_and_the_server_answers_raw_ids(days, checkpoints, tmp_path):
    repo = tmp_path / "repo"
    for ckpt in checkpoints:  # day 1 as version 1, the continued day 2 as version 2
        assert run_cli("export", "--checkpoint", ckpt, "--format", "triton", "--out", repo)[0] == 0
    assert sorted(p.name for p in (repo / "dlrm").iterdir() if p.is_dir()) == ["1", "2"]
    numerical, raw = _rows(days[1])
    newest = _predicted(checkpoints[1], days[1], tmp_path)
    oldest = _predicted(checkpoints[0], days[1], tmp_path)
    server = Server("--model-repository", repo)
    try:
        client = httpclient.InferenceServerClient(server.url)
        inputs = [httpclient.InferInput("numerical", list(numerical.shape), "FP32"),
                  httpclient.InferInput("categorical", list(raw.shape), "INT64")]  # fmt: skip
        inputs[0].set_data_from_numpy(numerical)
        inputs[1].set_data_from_numpy(raw)
        got = client.infer("dlrm", inputs).as_numpy("probability")
        np.testing.assert_allclose(got, newest, atol=1e-5)  # no version named: the newest
        old = client.infer("dlrm", inputs, model_version="1").as_numpy("probability")
        np.testing.assert_allclose(old, oldest, atol=1e-5)
        assert not np.allclose(got, old, atol=1e-4)
    finally:
        server.stop()
