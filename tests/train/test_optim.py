import pytest
import torch
import torch.nn.functional as F

from ctrkit.train.optim import LRSchedule, SparseSGD


def test_sparse_sgd_matches_dense_sgd_with_repeated_rows():
    torch.manual_seed(0)
    w0 = torch.randn(20, 4)
    lin0 = torch.randn(3, 4)
    ids = torch.tensor([[1, 1, 5], [5, 7, 1]])  # row 1 three times, row 5 twice

    def run(sparse: bool):
        w = torch.nn.Parameter(w0.clone())
        lin = torch.nn.Parameter(lin0.clone())
        opt = SparseSGD([w, lin], lr=0.3) if sparse else torch.optim.SGD([w, lin], lr=0.3)
        for _ in range(3):
            opt.zero_grad()
            out = F.embedding(ids, w, sparse=sparse).sum(1) @ lin.t()
            (out**2).mean().backward()
            opt.step()
        return w.detach(), lin.detach()

    ws, ls = run(True)
    wd, ld = run(False)
    torch.testing.assert_close(ws, wd)
    torch.testing.assert_close(ls, ld)
    assert not torch.equal(ws, w0)


def test_schedule_warmup_hold_and_polynomial_decay():
    s = LRSchedule(base_lr=2.0, warmup_steps=4, decay_start_step=10, decay_steps=4, power=2.0, end_lr=0.5)
    assert [s(i) for i in range(4)] == [0.5, 1.0, 1.5, 2.0]
    assert s(4) == s(9) == 2.0
    # t steps into the decay: 0.5 + 1.5 * (1 - t/4)^2
    assert [s(10 + t) for t in range(5)] == [2.0, 0.5 + 1.5 * 0.5625, 0.5 + 1.5 * 0.25, 0.5 + 1.5 * 0.0625, 0.5]
    assert s(1000) == 0.5


def test_schedule_without_decay_is_constant_after_warmup():
    s = LRSchedule(base_lr=1.0, warmup_steps=0)
    assert s(0) == s(10_000) == 1.0


def test_negative_lr_rejected():
    with pytest.raises(ValueError, match="lr must be >= 0"):
        SparseSGD([torch.nn.Parameter(torch.zeros(1))], lr=-1)
