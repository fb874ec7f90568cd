"""`ctrkit serve --model-repository`: a Triton-layout repository with two models, one of them in two
versions, served by the real server on 127.0.0.1 and queried with the real tritonclient; the repository
extension's index/load/unload, and a version loaded under a bounded concurrent load."""

import json
import shutil
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.http as httpclient

from ctrkit.data.dataset import SplitBinaryDataset
from tests.conftest import run_cli, small_model_flags
from tests.serve.test_server import Server

ROWS = 40


def export(checkpoint, repo, name, backend, version="1"):
    """`ctrkit export` straight into the repository, as the given version of the model."""
    args = ["export", "--checkpoint", checkpoint, "--format", "triton", "--backend", backend, "--name", name]
    assert run_cli(*args, "--out", repo, "--version", version)[0] == 0


@pytest.fixture(scope="module")
def models(tiny_dataset, tiny_checkpoint, tmp_path_factory):
    """Three checkpoints (different weights) and their `ctrkit predict` answers on the first rows."""
    work = tmp_path_factory.mktemp("repo")
    ckpts = {"v1": tiny_checkpoint}
    for tag, steps in (("v2", 10), ("v3", 20)):
        ckpts[tag] = work / f"{tag}.pt"
        # without the warm start: selection may keep the fitted regression, the same for every seed
        assert run_cli("train", "--dataset", tiny_dataset, "--max-steps", steps, "--batch-size", 256, "--seed", steps,
                       "--no-linear-warm-start", "--no-progress", "--save-checkpoint", ckpts[tag],
                       *small_model_flags())[0] == 0  # fmt: skip
    expected = {}
    for tag, ckpt in ckpts.items():
        out = work / f"{tag}.npy"
        assert run_cli("predict", "--checkpoint", ckpt, "--dataset", tiny_dataset, "--out", out)[0] == 0
        expected[tag] = np.load(out)[:ROWS]
    batch = SplitBinaryDataset(tiny_dataset, "test").slice(0, ROWS)
    return work, ckpts, expected, (batch.numerical.numpy(), batch.categorical.numpy())


def infer(url, model, rows, version=""):
    client = httpclient.InferenceServerClient(url)
    inputs = [httpclient.InferInput("numerical", list(rows[0].shape), "FP32"),
              httpclient.InferInput("categorical", list(rows[1].shape), "INT64")]  # fmt: skip
    inputs[0].set_data_from_numpy(rows[0], binary_data=True)
    inputs[1].set_data_from_numpy(rows[1], binary_data=True)
    return client.infer(model, inputs, model_version=version).as_numpy("probability")[:, 0]


def test_repository_serves_models_and_versions(models):
    work, ckpts, expected, rows = models
    repo = work / "repository"
    export(ckpts["v1"], repo, "ranker", "onnx", "1")
    export(ckpts["v2"], repo, "ranker", "onnx", "2")
    export(ckpts["v1"], repo, "other", "torchscript", "1")
    shutil.copytree(repo / "ranker" / "1", repo / "ranker" / "01")  # a version spelled two ways: one parser, one
    server = Server("--model-repository", repo)
    try:
        url = server.url
        client = httpclient.InferenceServerClient(url)
        assert (
            client.is_model_ready("ranker") and client.is_model_ready("ranker", "1") and client.is_model_ready("other")
        )
        assert client.get_model_metadata("ranker")["versions"] == ["1", "2"]
        np.testing.assert_allclose(infer(url, "ranker", rows, "1"), expected["v1"], atol=1e-5)
        np.testing.assert_allclose(infer(url, "ranker", rows, "2"), expected["v2"], atol=1e-5)
        np.testing.assert_allclose(infer(url, "ranker", rows), expected["v2"], atol=1e-5)  # newest by default
        np.testing.assert_allclose(infer(url, "other", rows), expected["v1"], atol=1e-5)
        assert not np.allclose(expected["v1"], expected["v2"], atol=1e-4)  # the versions differ
        index = {(m["name"], m.get("version")): m["state"] for m in client.get_model_repository_index()}
        assert index == {("ranker", "1"): "READY", ("ranker", "2"): "READY", ("other", "1"): "READY"}
        # every answer names the version that gave it (it said "1" whatever answered)
        body = json.dumps({"inputs": [{"name": "numerical", "datatype": "FP32", "shape": list(rows[0].shape),
                                       "data": rows[0].tolist()},
                                      {"name": "categorical", "datatype": "INT64", "shape": list(rows[1].shape),
                                       "data": rows[1].tolist()}]}).encode()  # fmt: skip
        for path, version in (("/v2/models/ranker/infer", "2"), ("/v2/models/ranker/versions/1/infer", "1")):
            status, answer = server.post(body, path=path)
            assert status == 200 and json.loads(answer)["model_version"] == version, answer
        status, answer = server.post(body, path="/v2/models/ranker/versions/01/infer")  # not a version's spelling
        assert status == 400 and "not a version number" in json.loads(answer)["error"], answer
        for bad in (b"xyz", b"[1]", b"5", b"null"):  # an index request that is no JSON object: a 400 in words
            status, answer = server.post(bad, path="/v2/repository/index")
            assert status == 400 and "JSON object" in json.loads(answer)["error"], answer

        client.unload_model("other")
        assert not client.is_model_ready("other")
        status, body = server.post(b"{}", model="other")
        assert status == 404 and "not loaded" in json.loads(body)["error"]
        index = {m["name"]: m["state"] for m in client.get_model_repository_index()}
        assert index == {"ranker": "READY", "other": "UNAVAILABLE"}
        client.load_model("other")
        np.testing.assert_allclose(infer(url, "other", rows), expected["v1"], atol=1e-5)
        status, body = server.post(b"", path="/v2/repository/models/nothing/load")
        assert status == 400 and "no such model" in json.loads(body)["error"]

        # version 3 added and loaded while 4 clients send 240 requests: none fails, every answer is
        # version 2's or version 3's, and once the load returns the newest is 3
        export(ckpts["v3"], repo, "ranker", "onnx", "3")

        def send():
            return [infer(url, "ranker", rows) for _ in range(60)]

        with ThreadPoolExecutor(5) as pool:
            clients = [pool.submit(send) for _ in range(4)]
            status, _ = server.post(b"", path="/v2/repository/models/ranker/load")
            answers = [a for c in clients for a in c.result()]
        assert status == 200 and len(answers) == 240
        for a in answers:
            assert np.allclose(a, expected["v2"], atol=1e-5) or np.allclose(a, expected["v3"], atol=1e-5)
        np.testing.assert_allclose(infer(url, "ranker", rows), expected["v3"], atol=1e-5)
        assert client.get_model_metadata("ranker")["versions"] == ["1", "2", "3"]
        with urllib.request.urlopen(f"http://{url}/metrics", timeout=5) as r:
            text = r.read().decode()
        assert 'nv_inference_request_success{model="ranker",version="3"}' in text
    finally:
        server.stop()
