"""The one autograd function where model-parallel embeddings meet the data-parallel batch.

Forward: each rank sends, to every other rank, the embedding columns it owns for that rank's samples
(an all-to-all with per-rank split sizes). Backward: the reverse all-to-all returns the gradients to
the owners.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, send: list[int], recv: list[int], group) -> torch.Tensor:
        ctx.send, ctx.recv, ctx.group = send, recv, group
        out = x.new_empty(sum(recv))
        dist.all_to_all_single(out, x.contiguous(), recv, send, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        back = grad.new_empty(sum(ctx.send))
        dist.all_to_all_single(back, grad.contiguous(), ctx.send, ctx.recv, group=ctx.group)
        return back, None, None, None


def all_to_all(x: torch.Tensor, send: Sequence[int], recv: Sequence[int], group=None) -> torch.Tensor:
    """Differentiable all-to-all of a flat tensor: ``send[r]`` values go to rank r, ``recv[r]`` come from it.

    Shapes: x (sum(send),) -> (sum(recv),).
    """
    return _AllToAll.apply(x.reshape(-1), list(send), list(recv), group)
