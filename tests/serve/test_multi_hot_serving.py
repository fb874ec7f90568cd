"""Serving a model with multi-hot features (Wide & Deep on Outbrain-like data): padded bags in every
export and through the real server, against `ctrkit predict` on the same rows (which pools the bags
with embedding_bag, the training path)."""

import json
import random
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
import tritonclient.http as httpclient
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from ctrkit.data.batch import MultiHot, PaddedMultiHot
from ctrkit.data.dataset import SplitBinaryDataset
from ctrkit.data.synthetic_outbrain import generate_outbrain
from ctrkit.models.embeddings import EmbeddingBagCollection
from ctrkit.serve.predictor import Predictor
from tests.conftest import run_cli
from tests.serve.test_server import Server

N_ROWS = 400


def to_padded(multi_hot: MultiHot) -> torch.Tensor:
    """The bags of a MultiHot as the (B, Fm, L) -1-padded rectangle a server request carries."""
    bags = multi_hot.offsets.numel() - 1  # Fm * B
    lengths = multi_hot.offsets[1:] - multi_hot.offsets[:-1]  # (Fm * B,)
    width = max(int(lengths.max()) if bags else 0, 1)
    out = torch.full((bags, width), -1, dtype=torch.int64)
    bag = torch.repeat_interleave(torch.arange(bags), lengths)  # (nnz,)
    out[bag, torch.arange(multi_hot.ids.numel()) - multi_hot.offsets[bag]] = multi_hot.ids
    return out.view(multi_hot.num_features, bags // max(multi_hot.num_features, 1), width).transpose(0, 1).contiguous()


@pytest.fixture(scope="module")
def outbrain(tmp_path_factory):
    out = tmp_path_factory.mktemp("ob") / "data"
    generate_outbrain(out, 4_000, test_fraction=0.2, seed=3, progress=False)
    return out


@pytest.fixture(scope="module")
def wd_checkpoint(outbrain, tmp_path_factory):
    out = tmp_path_factory.mktemp("wd") / "wd.pt"
    (out.parent / "model.yaml").write_text("deep_mlp: [64, 64]\nembedding_dim: 8\n")
    code = run_cli("train", "--model", "wide_deep", "--dataset", outbrain, "--max-steps", "20", "--no-progress",
                   "--model-config", out.parent / "model.yaml", "--save-checkpoint", out)[0]  # fmt: skip
    assert code == 0
    return out


@pytest.fixture(scope="module")
def rows(outbrain):
    """(numerical, categorical, multi_hot padded with -1) of the first test rows."""
    batch = SplitBinaryDataset(outbrain, "test").slice(0, N_ROWS)
    return batch.numerical.numpy(), batch.categorical.numpy(), to_padded(batch.multi_hot).numpy()


@pytest.fixture(scope="module")
def predicted(wd_checkpoint, outbrain, tmp_path_factory):
    out = tmp_path_factory.mktemp("pred") / "p.npy"
    assert run_cli("predict", "--checkpoint", wd_checkpoint, "--dataset", outbrain, "--out", out)[0] == 0
    return np.load(out)[:N_ROWS, None]


def test_padded_bags_pool_like_embedding_bag():
    bags = EmbeddingBagCollection([7, 5, 4], 3, ["sum", "mean", "mean"]).eval()
    lengths = torch.tensor([2, 0, 3, 1, 1, 2, 0, 4, 0, 0, 1, 5])  # 3 features x 4 samples, empty bags included
    cards = torch.tensor([7, 5, 4]).repeat_interleave(4)
    ids = torch.cat([torch.randint(0, int(c), (int(n),)) for c, n in zip(cards, lengths)])
    multi_hot = MultiHot(ids, torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)]), 3)
    padded = to_padded(multi_hot)
    assert padded.shape == (4, 3, 5) and ((padded >= 0).sum(2).T.reshape(-1) == lengths).all()
    with torch.no_grad():
        want = bags(multi_hot)
        torch.testing.assert_close(bags(PaddedMultiHot(padded)), want)
        wider = torch.cat([padded, torch.full((4, 3, 2), -1)], 2)  # more padding changes nothing
        torch.testing.assert_close(bags(PaddedMultiHot(wider)), want)
    assert want[1, 0].abs().sum() == 0  # sample 1's empty bag of feature 0 pools to zeros


def test_every_backend_scores_multi_hot_rows_like_ctrkit_predict(wd_checkpoint, rows, predicted, tmp_path):
    numerical, categorical, multi_hot = rows
    for fmt, quantize in (("onnx", "none"), ("onnx", "int8"), ("torchscript", "none"), ("triton", "none")):
        out = tmp_path / f"{fmt}-{quantize}"
        assert (
            run_cli("export", "--checkpoint", wd_checkpoint, "--format", fmt, "--quantize", quantize, "--out", out)[0]
            == 0
        )
    predictors = {
        "checkpoint": (Predictor.from_checkpoint(wd_checkpoint), 1e-5),
        "mmap": (Predictor.from_checkpoint(wd_checkpoint, embedding_store="mmap", cache_rows=25), 1e-5),
        "bf16": (Predictor.from_checkpoint(wd_checkpoint, dtype="bf16"), 0.02),
        **{d.name: (Predictor.from_export(d), 0.02 if "int8" in d.name else 1e-5) for d in tmp_path.iterdir()},
    }
    for name, (predictor, atol) in predictors.items():
        np.testing.assert_allclose(predictor(numerical, categorical, multi_hot), predicted, atol=atol, err_msg=name)
    # an id beyond its table scores as the unseen id 0; -1 is padding
    meta = json.loads((tmp_path / "onnx-none" / "ctrkit_model.json").read_text())
    wild, tame = multi_hot[:20].copy(), multi_hot[:20].copy()
    wild[:, 1, 0], tame[:, 1, 0] = meta["multi_hot_cardinalities"][1] + 3, 0
    onnx, reference = predictors["onnx-none"][0], predictors["checkpoint"][0]
    np.testing.assert_allclose(onnx(numerical[:20], categorical[:20], wild),
                               reference(numerical[:20], categorical[:20], tame), atol=1e-5)  # fmt: skip
    with pytest.raises(ValueError, match="pass multi_hot"):
        reference(numerical, categorical)
    config = (tmp_path / "triton-none" / "wide_deep" / "config.pbtxt").read_text()
    parsed = text_format.Parse(config, model_config_pb2.ModelConfig())
    assert [(i.name, list(i.dims)) for i in parsed.input][2] == (
        "multi_hot",
        [len(meta["multi_hot_cardinalities"]), -1],
    )


def _infer(client, arrays, binary=True):
    inputs = []
    for name, array in zip(("numerical", "categorical", "multi_hot"), arrays):
        inputs.append(httpclient.InferInput(name, list(array.shape), "FP32" if name == "numerical" else "INT64"))
        inputs[-1].set_data_from_numpy(array, binary_data=binary)
    out = httpclient.InferRequestedOutput("probability", binary_data=binary)
    return client.infer("wide_deep", inputs, outputs=[out]).as_numpy("probability")


def test_server_answers_multi_hot_requests_like_ctrkit_predict(wd_checkpoint, rows, predicted):
    numerical, categorical, multi_hot = rows
    server = Server("--checkpoint", wd_checkpoint, "--batch-window-ms", "20")
    try:
        client = httpclient.InferenceServerClient(server.url)
        meta = client.get_model_metadata("wide_deep")
        assert meta["inputs"][2] == {"name": "multi_hot", "datatype": "INT64", "shape": [-1, multi_hot.shape[1], -1]}
        np.testing.assert_allclose(_infer(client, rows, binary=False), predicted, atol=1e-5)
        # 40 concurrent requests whose bags have different padded lengths, batched together by the server
        chunks = [slice(i, i + 10) for i in range(0, N_ROWS, 10)]

        def one(k: int) -> np.ndarray:
            s = chunks[k]
            bags = multi_hot[s][:, :, : max(1, int((multi_hot[s] >= 0).sum(2).max()))]  # trimmed to this chunk
            bags = np.pad(bags, ((0, 0), (0, 0), (0, k % 3)), constant_values=-1)
            return _infer(httpclient.InferenceServerClient(server.url), (numerical[s], categorical[s], bags))

        with ThreadPoolExecutor(8) as pool:
            got = np.concatenate(list(pool.map(one, range(len(chunks)))))
        np.testing.assert_allclose(got, predicted, atol=1e-5)
        good = {"name": "multi_hot", "datatype": "INT64", "shape": [1, multi_hot.shape[1], 2], "data": [0, -1] * 2}
        base = [{"name": "numerical", "datatype": "FP32", "shape": [1, 2], "data": [0.5, 0.5]},
                {"name": "categorical", "datatype": "INT64", "shape": [1, 7], "data": [0] * 7}]  # fmt: skip
        status, body = server.post(json.dumps({"inputs": base + [good]}).encode(), model="wide_deep")
        assert status == 200, body
        bad_shape = {**good, "shape": [1, multi_hot.shape[1] + 1, 2], "data": [0] * (2 * multi_hot.shape[1] + 2)}
        for inputs, message in (
            (base, "missing input(s) multi_hot"),
            (base + [bad_shape], f"input 'multi_hot' must be INT64 with shape [B, {multi_hot.shape[1]}, L]"),
            (base + [{**good, "shape": [2, multi_hot.shape[1], 1]}], "inputs disagree on the batch size"),
        ):
            status, body = server.post(json.dumps({"inputs": inputs}).encode(), model="wide_deep")
            assert status == 400 and message in json.loads(body)["error"], body
        rng = random.Random(1)  # fuzzed multi-hot bodies: 200 or 400, never a crash
        base_body = json.dumps({"inputs": base + [good]}).encode()
        for _ in range(60):
            body = bytearray(base_body)
            for _ in range(rng.randint(1, 6)):
                body[rng.randrange(len(body))] = rng.choice(b'0123456789-,[]{}" e')
            assert server.post(bytes(body), model="wide_deep")[0] in (200, 400)
        assert server.healthy()
    finally:
        server.stop()
