"""Per-feature embedding widths (``embedding_dims``, ``ctrkit train --embedding-sizes``): the tables, the
models that concatenate them, DLRM's refusal, the sizes file, and the whole path on multi-hot data."""

import json

import numpy as np
import onnxruntime as ort
import pytest
import torch

from ctrkit.data.batch import MultiHot, PaddedMultiHot
from ctrkit.data.dataset import SplitBinaryDataset
from ctrkit.data.feature_spec import FeatureSpec
from ctrkit.data.synthetic_outbrain import generate_outbrain
from ctrkit.models import create_model
from ctrkit.models.inputs import MixedWidthEmbeddings
from ctrkit.models.registry import make_config
from ctrkit.train.optim import build_optimizers
from ctrkit.train.plan import auto_embedding_width
from ctrkit.train.run import embedding_dims_for
from tests.conftest import run_cli

CARDS, BAG_CARDS, DIMS = (10, 20, 30), (7, 9), (4, 8, 4, 8, 2)


def config(model="wide_deep", dims=DIMS, **extra):
    return make_config(model, dict(num_numerical=3, cardinalities=CARDS, multi_hot_cardinalities=BAG_CARDS,
                                   multi_hot_combiners=("sum", "mean"), embedding_dims=dims, embedding_dim=16,
                                   **extra))  # fmt: skip


def batch(b=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    cat = torch.stack([torch.randint(0, c, (b,), generator=g) for c in CARDS], 1)
    padded = torch.full((b, 2, 3), -1)
    padded[:, 0, :2] = torch.randint(0, 7, (b, 2), generator=g)
    padded[1:, 1, :1] = torch.randint(0, 9, (b - 1, 1), generator=g)  # sample 0's second bag is empty
    ids, offsets = [], [0]
    for f in range(2):  # the same bags, feature-major, as a MultiHot
        for i in range(b):
            bag = [int(x) for x in padded[i, f] if x >= 0]
            ids += bag
            offsets.append(offsets[-1] + len(bag))
    return torch.randn(b, 3, generator=g), cat, MultiHot(torch.tensor(ids), torch.tensor(offsets), 2), padded


def test_each_feature_gets_its_own_width_in_feature_order():
    model = create_model("dcnv2", config("dcnv2"))
    emb = model.embeddings
    assert isinstance(emb, MixedWidthEmbeddings) and emb.output_width == sum(DIMS) == 26
    assert sorted(emb.groups) == ["d2", "d4", "d8"]
    _, cat, mh, padded = batch()
    out = emb(cat, mh)
    assert out.shape == (6, 26)
    d4, d8, d2 = (emb.groups[k] for k in ("d4", "d8", "d2"))
    # feature order: onehot0 (4 wide), onehot1 (8), onehot2 (4), bag0 (8, sum), bag1 (2, mean)
    torch.testing.assert_close(out[:, 0:4], d4.onehot.table(0)[cat[:, 0]])
    torch.testing.assert_close(out[:, 4:12], d8.onehot.table(0)[cat[:, 1]])
    torch.testing.assert_close(out[:, 12:16], d4.onehot.table(1)[cat[:, 2]])
    for i in range(6):
        bag0 = [int(x) for x in padded[i, 0] if x >= 0]
        torch.testing.assert_close(out[i, 16:24], d8.bags.table(0)[bag0].sum(0))
        bag1 = [int(x) for x in padded[i, 1] if x >= 0]
        want = d2.bags.table(0)[bag1].mean(0) if bag1 else torch.zeros(2)
        torch.testing.assert_close(out[i, 24:26], want)
    torch.testing.assert_close(emb(cat, PaddedMultiHot(padded)), out)  # the serving form pools the same


@pytest.mark.parametrize("name", ["wide_deep", "dcnv2"])
def test_models_train_with_mixed_widths_and_update_only_the_rows_used(name):
    model = create_model(name, config(name))
    model.eval()  # no dropout: the two bag forms must agree
    num, cat, mh, padded = batch()
    torch.testing.assert_close(model(num, cat, mh), model(num, cat, PaddedMultiHot(padded)))
    model.train()
    before = {k: v.clone() for k, v in model.embeddings.state_dict().items()}
    optimizers = build_optimizers(model, "adam", 1e-2, "adam", 1e-1, "adagrad", 1e-2)
    torch.nn.functional.binary_cross_entropy_with_logits(model(num, cat, mh), torch.ones(6)).backward()
    for p in model.embeddings.parameters():
        assert p.grad is not None and p.grad.is_sparse  # every width's tables learn, by rows
    for opt in optimizers:
        opt.step()
    after = model.embeddings.state_dict()
    table = model.embeddings.groups["d8"].onehot  # feature 1 only
    changed = (after["groups.d8.onehot.weight"] != before["groups.d8.onehot.weight"]).any(1)
    assert set(changed.nonzero().squeeze(1).tolist()) == set(cat[:, 1].tolist()) and table.num_features == 1


def test_dlrm_refuses_mixed_widths_and_one_width_is_the_plain_model():
    with pytest.raises(ValueError, match="DLRM's dot interaction needs one embedding width"):
        config("dlrm")
    same = config("dlrm", dims=(16,) * 5, bottom_mlp=(32, 16))  # every feature at embedding_dim: the ordinary tables
    assert not isinstance(create_model("dlrm", same).embeddings, MixedWidthEmbeddings)
    with pytest.raises(ValueError, match="embedding_dims needs one positive width per categorical feature"):
        config(dims=(4, 8))


def test_sizes_file_auto_rule_and_errors(tmp_path):
    out = tmp_path / "ob"
    spec = generate_outbrain(out, 400, test_fraction=0.2, seed=1, progress=False)
    names = [*spec.onehot_features, *spec.multi_hot_features]
    cards = [*spec.cardinalities, *spec.multi_hot_cardinalities]
    assert embedding_dims_for("auto", spec, 16) == tuple(auto_embedding_width(c) for c in cards)
    assert [auto_embedding_width(c) for c in (1, 16, 10_000, 10**9)] == [6, 12, 60, 64]
    sizes = tmp_path / "embedding_sizes.json"
    sizes.write_text(json.dumps({names[0]: 32, names[-1]: 3}))
    dims = embedding_dims_for(str(sizes), spec, 16)
    assert dims[0] == 32 and dims[-1] == 3 and set(dims[1:-1]) == {16}
    sizes.write_text(json.dumps({"no_such_feature": 8}))
    with pytest.raises(ValueError, match=r"embedding_sizes.json: no categorical feature\(s\) \['no_such_feature'\]"):
        embedding_dims_for(str(sizes), spec, 16)
    sizes.write_text(json.dumps({names[0]: 0}))
    with pytest.raises(ValueError, match=f"feature '{names[0]}': expected a positive integer width, got 0"):
        embedding_dims_for(str(sizes), spec, 16)
    sizes.write_text("{oops")
    with pytest.raises(ValueError, match="embedding_sizes.json: not JSON"):
        embedding_dims_for(str(sizes), spec, 16)


def test_hybrid_parallel_refuses_mixed_widths():
    from ctrkit.distributed.hybrid import sharded_collections

    with pytest.raises(ValueError, match="per-feature embedding widths .* train in one process"):
        sharded_collections(create_model("wide_deep", config()))


def test_train_with_a_sizes_file_evaluate_export_and_reinit(tmp_path, capsys):
    data = tmp_path / "ob"
    spec = generate_outbrain(data, 3_000, test_fraction=0.2, seed=3, progress=False)
    names = [*spec.onehot_features, *spec.multi_hot_features]
    sizes = tmp_path / "sizes.json"
    sizes.write_text(json.dumps({n: 4 + 2 * (i % 3) for i, n in enumerate(names)}))
    (tmp_path / "model.yaml").write_text("deep_mlp: [32, 32]\nembedding_dim: 8\n")
    ckpt = tmp_path / "wd.pt"
    code, out, err = run_cli(
        "train", "--model", "wide_deep", "--dataset", data, "--embedding-sizes", sizes, "--model-config",
        tmp_path / "model.yaml", "--epochs", "2", "--batch-size", "256", "--reinit-embeddings", "on",
        "--seed-ensemble", "1", "--small-batch", "0", "--no-progress", "--save-checkpoint", ckpt, "--log-path",
        tmp_path / "log.jsonl",
        capsys=capsys,
    )  # fmt: skip
    assert code == 0, err
    records = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert any(r["event"] == "reinit_embeddings" for r in records)  # the epoch-2 redraw reached every width
    run = (tmp_path / "wd.yaml").read_text()
    assert "embedding_dims" in run
    code, out, err = run_cli("evaluate", "--checkpoint", ckpt, "--dataset", data, capsys=capsys)
    assert code == 0 and "MAP@12" in out, err
    code, out, err = run_cli("export", "--checkpoint", ckpt, "--format", "onnx", "--out", tmp_path / "onnx",
                             capsys=capsys)  # fmt: skip
    assert code == 0, err
    # the export, loaded in onnxruntime, against the PyTorch model on test rows
    from ctrkit.checkpoint import load_checkpoint
    from tests.serve.test_multi_hot_serving import to_padded

    state = load_checkpoint(ckpt)
    model = create_model("wide_deep", state.model_config)
    model.load_state_dict(state.model)
    model.eval()
    assert isinstance(model.embeddings, MixedWidthEmbeddings)
    rows = SplitBinaryDataset(FeatureSpec.from_yaml(data), "test").slice(0, 64)
    with torch.no_grad():
        want = torch.sigmoid(model(rows.numerical, rows.categorical, rows.multi_hot)).numpy()
    session = ort.InferenceSession(str(tmp_path / "onnx" / "model.onnx"))
    feeds = {"numerical": rows.numerical.numpy(), "categorical": rows.categorical.numpy(),
             "multi_hot": to_padded(rows.multi_hot).numpy()}  # fmt: skip
    got = session.run(None, {i.name: feeds[i.name] for i in session.get_inputs()})[0].reshape(-1)
    np.testing.assert_allclose(got, want, atol=1e-5)
    # the server's predictors: from the checkpoint, with memory-mapped tables (a small cache), and the export
    from ctrkit.serve.predictor import Predictor

    for predictor in (Predictor.from_checkpoint(ckpt), Predictor.from_checkpoint(ckpt, embedding_store="mmap",
                      cache_rows=25), Predictor.from_export(tmp_path / "onnx")):  # fmt: skip
        scores = predictor(feeds["numerical"], feeds["categorical"], feeds["multi_hot"]).reshape(-1)
        np.testing.assert_allclose(scores, want, atol=1e-5)


def test_a_resumed_mixed_width_run_equals_the_uninterrupted_one(tmp_path, capsys):
    from ctrkit.checkpoint import load_checkpoint

    data = tmp_path / "ob"
    generate_outbrain(data, 3_000, test_fraction=0.2, seed=4, progress=False)
    (tmp_path / "model.yaml").write_text("deep_mlp: [32]\nembedding_dim: 8\n")
    common = ("train", "--model", "wide_deep", "--dataset", data, "--embedding-sizes", "auto", "--model-config",
              tmp_path / "model.yaml", "--batch-size", "256", "--epochs", "2", "--seed-ensemble", "1",
              "--small-batch", "0", "--no-progress")  # fmt: skip  # one model, stopped by --max-steps and resumed
    assert run_cli(*common, "--save-checkpoint", tmp_path / "straight.pt", capsys=capsys)[0] == 0
    assert run_cli(*common, "--max-steps", "5", "--save-checkpoint", tmp_path / "part.pt", capsys=capsys)[0] == 0
    code, _, err = run_cli(*common, "--load-checkpoint", tmp_path / "part.pt", "--save-checkpoint",
                           tmp_path / "resumed.pt", capsys=capsys)  # fmt: skip
    assert code == 0, err
    straight, resumed = load_checkpoint(tmp_path / "straight.pt"), load_checkpoint(tmp_path / "resumed.pt")
    assert straight.step == resumed.step > 5 and "embedding_dims" in straight.model_config
    assert straight.model.keys() == resumed.model.keys()
    assert any(".groups.d" in k for k in straight.model)  # the per-width tables
    for k, v in straight.model.items():
        torch.testing.assert_close(resumed.model[k], v, rtol=0, atol=0, msg=k)
