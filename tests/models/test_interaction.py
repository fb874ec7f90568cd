"""DotInteraction's paths against each other: the plain ops that exports record, the training function, and the
scoring path (ctrkit's kernels without autograd, outside exports)."""

import pytest
import torch

from ctrkit import native
from ctrkit.models import interaction
from ctrkit.models.interaction import DotInteraction

# the C kernel sums in ATen's order where the CPU has AVX-512 (bit for bit); on AVX2 its vectors are shorter and the
# sums' order differs in the last bits
EXACT = 0.0 if "AVX512" in torch.backends.cpu.get_cpu_capability() else 1e-6


@pytest.mark.parametrize("with_dense", [True, False])
def test_plain_and_scoring_paths_equal_the_training_function(with_dense):
    """The plain ops (exports) and scoring without gradients give the training function's values."""
    torch.manual_seed(0)
    m = DotInteraction(6 if with_dense else 5, 8, with_dense=with_dense)
    dense, emb = (torch.randn(7, 8) if with_dense else None), torch.randn(7, 5, 8)
    trained = m(dense, emb.requires_grad_())
    with torch.no_grad():
        plain = m._plain(dense, emb)
        scored = m(dense, emb)
    torch.testing.assert_close(plain, trained.detach(), rtol=0, atol=EXACT)
    torch.testing.assert_close(scored, trained.detach(), rtol=0, atol=EXACT)


@pytest.mark.skipif(native.library() is None, reason="ctrkit's C kernels are not built on this machine")
def test_scoring_takes_the_kernels_and_exports_record_atens_ops(monkeypatch):
    m = DotInteraction(6, 8).eval()
    dense, emb = torch.randn(3, 8), torch.randn(3, 5, 8)
    calls = []
    kernel = interaction._NativeDotInteractionFn.apply
    monkeypatch.setattr(interaction._NativeDotInteractionFn, "apply", lambda *a: calls.append(a) or kernel(*a))
    with torch.no_grad():
        scored = m(dense, emb)
        assert len(calls) == 1 and not scored.requires_grad
        traced = torch.jit.trace(m, (dense, emb), check_trace=False)
    assert len(calls) == 1  # the trace ran the plain ops
    assert "aten::bmm" in str(traced.graph)
    torch.testing.assert_close(traced(dense, emb), scored, rtol=0, atol=EXACT)
    with torch.no_grad(), monkeypatch.context() as patched:
        patched.setattr(torch.onnx, "is_in_onnx_export", lambda: True)
        m(dense, emb)
    assert len(calls) == 1
