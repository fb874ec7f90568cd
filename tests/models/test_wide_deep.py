import pytest
import torch

from ctrkit.models import WideDeepConfig, create_model
from ctrkit.train.optim import SparseRowOptimizer, build_optimizers

CARDS = (3, 10, 50)


def small(**kw) -> WideDeepConfig:
    return WideDeepConfig(**{**dict(num_numerical=2, cardinalities=CARDS, embedding_dim=4, deep_mlp=(16, 8)), **kw})


def inputs(b: int = 16):
    return torch.randn(b, 2), torch.stack([torch.randint(0, c, (b,)) for c in CARDS], dim=1)


def test_forward_shape_and_gradients_reach_every_parameter():
    model = create_model("wide_deep", small())
    with torch.no_grad():  # the wide part starts at zero; give it values so its gradients are informative
        model.wide_embeddings.onehot.weight.normal_()
    dense, sparse = inputs()
    out = model(dense, sparse)
    assert out.shape == (16,)
    out.sum().backward()
    for name, p in model.named_parameters():
        g = p.grad.to_dense() if p.grad.is_sparse else p.grad
        assert torch.count_nonzero(g) > 0, name


def test_wide_part_is_a_linear_model():
    model = create_model("wide_deep", small(dropout=0.0))
    last = model.deep[-1]
    with torch.no_grad():
        last.weight.zero_()
        last.bias.zero_()  # silence the deep tower
        model.wide_embeddings.onehot.weight.copy_(torch.arange(63, dtype=torch.float32).unsqueeze(1) / 10)
        model.wide_dense.weight.copy_(torch.tensor([[2.0, -1.0]]))
        model.wide_dense.bias.fill_(0.5)
    dense = torch.tensor([[1.0, 3.0]])
    sparse = torch.tensor([[2, 4, 7]])  # rows 2, 3 + 4 = 7, 13 + 7 = 20 of the flat table
    expected = (2 + 7 + 20) / 10 + (2.0 - 3.0) + 0.5
    torch.testing.assert_close(model(dense, sparse), torch.tensor([expected]))


def test_dropout_only_in_training():
    model = create_model("wide_deep", small(dropout=0.5))
    dense, sparse = inputs(64)
    model.eval()
    torch.testing.assert_close(model(dense, sparse), model(dense, sparse))
    model.train()
    assert not torch.equal(model(dense, sparse), model(dense, sparse))


def test_wide_and_deep_parts_get_their_own_optimizers():
    model = create_model("wide_deep", small())
    opts = build_optimizers(model, "adam", 1e-3, "adam", 1e-2, "adagrad", 0.02)
    by_param = {id(p): opt for opt in opts for g in opt.param_groups for p in g["params"]}
    assert len(by_param) == len(list(model.parameters()))  # every parameter exactly once
    wide_table = by_param[id(model.wide_embeddings.onehot.weight)]
    assert isinstance(wide_table, SparseRowOptimizer) and wide_table.kind == "adagrad"
    assert wide_table.param_groups[0]["lr"] == 0.02
    assert isinstance(by_param[id(model.wide_dense.weight)], torch.optim.Adagrad)
    deep_table = by_param[id(model.embeddings.onehot.weight)]
    assert isinstance(deep_table, SparseRowOptimizer) and deep_table.kind == "adam"
    assert isinstance(by_param[id(model.deep[0].weight)], torch.optim.Adam)
    with pytest.raises(ValueError, match="has a wide part"):
        build_optimizers(model, "adam", 1e-3, "adam", 1e-2)


def test_config_errors():
    with pytest.raises(ValueError, match="dropout must lie in"):
        create_model("wide_deep", small(dropout=1.0))
    with pytest.raises(ValueError, match="deep_mlp must be a non-empty list"):
        create_model("wide_deep", small(deep_mlp=()))
