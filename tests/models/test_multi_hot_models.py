"""Every model takes multi-hot features and learns from them."""

import numpy as np
import pytest
import torch

from ctrkit.config import TrainConfig
from ctrkit.data.dataset import SplitBinaryDataset
from ctrkit.data.split_binary import SplitBinaryWriter
from ctrkit.models import create_model
from ctrkit.models.registry import make_config
from ctrkit.train.trainer import Placement, RunInfo, RunOutputs, TrainData
from tests.conftest import trainer_of
from tests.data.test_multi_hot import multi_hot_spec

SHAPES = {
    "dlrm": {"bottom_mlp": (16, 8), "top_mlp": (16, 1)},
    "dcnv2": {"bottom_mlp": (16, 8), "top_mlp": (16, 1), "cross_layers": 1},
    "wide_deep": {"deep_mlp": (16,)},
}


@pytest.fixture(scope="module")
def tag_data(tmp_path_factory):
    return write_tag_data(tmp_path_factory.mktemp("multi_hot"))


def write_tag_data(root):
    """Clicks decided by the tags alone: the mean of per-tag weights."""
    spec = multi_hot_spec(root)
    rng = np.random.default_rng(5)
    weight = rng.normal(0, 2.0, 40)
    for mapping, n in (("train", 16_000), ("test", 4_000)):
        tag_len = rng.integers(1, 5, n)
        tags = rng.integers(0, 40, tag_len.sum())
        start = np.r_[0, np.cumsum(tag_len)[:-1]]
        logit = np.add.reduceat(weight[tags], start) / tag_len - 1.0
        labels = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.uint8)
        topic_len = rng.integers(0, 3, n)
        with SplitBinaryWriter(spec, mapping) as w:
            w.append(
                rng.normal(size=(n, 1)),
                rng.integers(0, 300, (n, 1)),
                labels,
                [(tags, tag_len), (rng.integers(0, 1000, topic_len.sum()), topic_len)],
            )
    spec.to_yaml(root / "feature_spec.yaml")
    return root


def build(name: str, spec):
    values = {
        "num_numerical": 1,
        "cardinalities": spec.cardinalities,
        "embedding_dim": 8,
        **SHAPES[name],
        "multi_hot_cardinalities": spec.multi_hot_cardinalities,
        "multi_hot_combiners": spec.multi_hot_combiners,
    }
    config = make_config(name, values)
    torch.manual_seed(0)
    return config, create_model(name, config)


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_forward_backward_with_multi_hot(tag_data, name):
    ds = SplitBinaryDataset(tag_data, "train")
    _, model = build(name, ds.spec)
    batch = ds.slice(0, 32)
    out = model(batch.numerical, batch.categorical, batch.multi_hot)
    assert out.shape == (32,)
    out.sum().backward()
    bags = model.embeddings.bags
    assert bags.weight.grad.is_sparse and torch.count_nonzero(bags.weight.grad.to_dense()) > 0
    with pytest.raises(ValueError, match="2 multi-hot features but the batch has none"):
        model(batch.numerical, batch.categorical, None)


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_models_learn_a_signal_carried_only_by_multi_hot_ids(tag_data, name):
    train, test = SplitBinaryDataset(tag_data, "train"), SplitBinaryDataset(tag_data, "test")
    config, model = build(name, train.spec)
    trainer = trainer_of(
        model,
        RunInfo(name, config, train.spec.summary()),
        TrainData(train, test),
        TrainConfig(epochs=3, batch_size=256, evals_per_epoch=0),
        Placement(torch.device("cpu")),
        RunOutputs(progress=False),
    )
    assert trainer.fit()["auc"] > 0.72  # the planted odds rank the test rows at 0.788


def test_cli_train_and_evaluate_with_multi_hot(tag_data, tmp_path, capsys):
    import json

    import yaml

    from tests.conftest import run_cli

    code, _, _ = run_cli(
        "train",
        "--model",
        "wide_deep",
        "--dataset",
        tag_data,
        "--embedding-dim",
        "8",
        "--model-config",
        _write(tmp_path / "m.yaml", "deep_mlp: [16]\n"),
        "--batch-size",
        "256",
        "--no-progress",
        "--save-checkpoint",
        tmp_path / "w.pt",
        capsys=capsys,
    )
    assert code == 0
    run = yaml.safe_load((tmp_path / "w.yaml").read_text())
    assert run["model_config"]["multi_hot_cardinalities"] == [40, 1000]
    assert run["model_config"]["multi_hot_combiners"] == ["mean", "sum"]
    code, out, _ = run_cli(
        "evaluate", "--checkpoint", tmp_path / "w.pt", "--dataset", tag_data, "--json", capsys=capsys
    )
    assert code == 0 and json.loads(out)["auc"] > 0.7


def _write(path, text):
    path.write_text(text)
    return path
