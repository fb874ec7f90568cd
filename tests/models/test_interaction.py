"""DotInteraction's inference path (no custom autograd function) against its training path."""

import pytest
import torch

from ctrkit.models.interaction import DotInteraction


@pytest.mark.parametrize("with_dense", [True, False])
def test_inference_path_equals_the_training_function(with_dense):
    """Without gradients (inference, export) DotInteraction runs plain ops; same values as the autograd function."""
    torch.manual_seed(0)
    m = DotInteraction(6 if with_dense else 5, 8, with_dense=with_dense)
    dense, emb = (torch.randn(7, 8) if with_dense else None), torch.randn(7, 5, 8)
    trained = m(dense, emb.requires_grad_())
    with torch.no_grad():
        plain = m(dense, emb)
    torch.testing.assert_close(plain, trained.detach(), rtol=0, atol=0)
