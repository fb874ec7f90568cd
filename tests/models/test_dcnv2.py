import pytest
import torch

from ctrkit.models import DCNv2Config, create_model
from ctrkit.models.interaction import CrossLayer, CrossNetwork

CARDS = (3, 10, 50, 120)


def small_config(**kw) -> DCNv2Config:
    base = dict(
        num_numerical=4,
        cardinalities=CARDS,
        embedding_dim=8,
        bottom_mlp=(16, 8),
        top_mlp=(16, 1),
        cross_layers=2,
        cross_projection_dim=6,
    )
    return DCNv2Config(**{**base, **kw})


def inputs(b: int = 16):
    return torch.randn(b, 4), torch.stack([torch.randint(0, c, (b,)) for c in CARDS], dim=1)


def test_cross_layer_by_hand():
    layer = CrossLayer(2, rank=0)  # full rank: x0 * (W x + b) + x
    with torch.no_grad():
        layer.up.weight.copy_(torch.tensor([[1.0, 2.0], [0.0, -1.0]]))
        layer.up.bias.copy_(torch.tensor([0.5, 1.0]))
    x0 = torch.tensor([[2.0, 3.0]])
    x = torch.tensor([[1.0, -1.0]])
    # W x + b = [1 - 2 + 0.5, 0 + 1 + 1] = [-0.5, 2]; x0 * that = [-1, 6]; + x = [0, 5]
    torch.testing.assert_close(layer(x0, x), torch.tensor([[0.0, 5.0]]))

    low = CrossLayer(3, rank=1)  # x0 * (V (U x) + b) + x
    with torch.no_grad():
        low.down.weight.copy_(torch.tensor([[1.0, 1.0, 1.0]]))
        low.up.weight.copy_(torch.tensor([[1.0], [2.0], [0.0]]))
        low.up.bias.copy_(torch.tensor([0.0, 0.0, 1.0]))
    x0 = torch.tensor([[1.0, 2.0, 3.0]])
    x = torch.tensor([[1.0, 0.0, 1.0]])
    # U x = 2; V(2) + b = [2, 4, 1]; x0 * that = [2, 8, 3]; + x = [3, 8, 4]
    torch.testing.assert_close(low(x0, x), torch.tensor([[3.0, 8.0, 4.0]]))
    assert low.low_rank and not CrossLayer(3, rank=3).low_rank  # a rank >= d factorises nothing


def test_cross_network_applies_layers_to_the_same_x0():
    net = CrossNetwork(4, 3, rank=2)
    x0 = torch.randn(5, 4)
    x = x0
    for layer in net.layers:
        x = layer(x0, x)
    torch.testing.assert_close(net(x0), x)


@pytest.mark.parametrize("rank", [0, 3, 8])
def test_the_fused_training_function_equals_the_layers_autograd(rank):
    """In training the cross network runs one autograd function (fewer passes over the batch); its output
    and every gradient (x0's, each layer's weights and biases) equal autograd's through the layers' own ops,
    in float64, at full rank, low rank, and a rank that factorises nothing."""
    torch.manual_seed(0)
    net = CrossNetwork(5, 3, rank=rank).double()
    x0 = torch.randn(7, 5, dtype=torch.float64)
    grad_out = torch.randn(7, 5, dtype=torch.float64)
    results = []
    for fused in (True, False):
        net.zero_grad()
        leaf = x0.clone().requires_grad_()
        if fused:
            out = net(leaf)
        else:
            out = leaf
            for layer in net.layers:
                out = layer(leaf, out)
        out.backward(grad_out)
        results.append([out.detach(), leaf.grad] + [p.grad.clone() for p in net.parameters()])
    assert len(results[0]) == 2 + (3 if 0 < rank < 5 else 2) * 3
    for got, want in zip(*results):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    with torch.no_grad():  # inference: the layers' own ops, the same values
        torch.testing.assert_close(net(x0), results[0][0], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("structure", ["stacked", "parallel"])
def test_forward_shape_and_every_parameter_gets_a_gradient(structure):
    model = create_model("dcnv2", small_config(structure=structure))
    dense, sparse = inputs(16)
    out = model(dense, sparse)
    assert out.shape == (16,)
    out.sum().backward()
    for name, p in model.named_parameters():
        g = p.grad.to_dense() if p.grad.is_sparse else p.grad
        assert torch.count_nonzero(g) > 0, name
    assert model.embeddings.onehot.weight.grad.is_sparse
    # x0 = bottom output + 4 embeddings of width 8
    assert model.cross.out_features == 8 * 5


def test_parallel_concatenates_cross_and_deep():
    model = create_model("dcnv2", small_config(structure="parallel", top_mlp=(16, 12, 1)))
    assert model.top_mlp[0].in_features == 40 + 12


def test_without_numerical_features():
    model = create_model("dcnv2", small_config(num_numerical=0, bottom_mlp=()))
    _, sparse = inputs(8)
    assert model(None, sparse).shape == (8,)


def test_config_errors():
    with pytest.raises(ValueError, match="structure must be one of stacked, parallel"):
        create_model("dcnv2", small_config(structure="sideways"))
    with pytest.raises(ValueError, match="cross_layers must be >= 1"):
        create_model("dcnv2", small_config(cross_layers=0))
    with pytest.raises(ValueError, match="cross_projection_dim must be >= 0"):
        create_model("dcnv2", small_config(cross_projection_dim=-1))
