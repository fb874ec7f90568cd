"""The MLP's dropout: the CPU path's distribution, scaling and gradient."""

import pytest
import torch

from ctrkit.models.mlp import MLP, Dropout


@pytest.mark.parametrize("p", [0.1, 0.5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_dropout_keeps_each_value_with_probability_one_minus_p(p, dtype):
    torch.manual_seed(0)
    x = (torch.rand(1000, 1000) + 0.5).to(dtype).requires_grad_()  # no zeros: a zero output is a dropped value
    out = Dropout(p).train()(x)
    assert out.dtype == dtype
    keep = out != 0
    # 10^6 draws: the kept fraction's standard deviation is below 5e-4
    assert abs(keep.float().mean().item() - (1 - p)) < 3e-3
    torch.testing.assert_close(out[keep], (x[keep].float() / (1 - p)).to(dtype))
    weights = torch.randn(1000, 1000)
    (out.float() * weights).sum().backward()  # the gradient flows through the kept values only, scaled
    torch.testing.assert_close(x.grad, (weights * keep / (1 - p)).to(dtype))


def test_dropout_is_identity_in_evaluation_and_draws_anew_each_call():
    x = torch.ones(64, 64)
    layer = Dropout(0.3)
    assert torch.equal(layer.eval()(x), x)
    layer.train()
    assert not torch.equal(layer(x) != 0, layer(x) != 0)
    with pytest.raises(ValueError, match="dropout"):
        Dropout(1.0)


def test_mlp_dropout_layers_hold_no_state():
    """Checkpoints written before the CPU dropout load unchanged: the layers keep their positions and the
    dropout adds nothing to the state dict."""
    mlp = MLP(8, (16, 16, 1), relu_last=False, dropout=0.1)
    assert [type(m).__name__ for m in mlp] == ["Linear", "ReLU", "Dropout", "Linear", "ReLU", "Dropout", "Linear"]
    assert sorted(mlp.state_dict()) == ["0.bias", "0.weight", "3.bias", "3.weight", "6.bias", "6.weight"]
