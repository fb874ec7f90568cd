"""Hybrid parallel (2 processes, gloo, CPU) against the single-process model on the same global batches."""

import socket
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ctrkit.distributed.hybrid import HybridModel
from ctrkit.distributed.planner import plan_sharding
from ctrkit.models.registry import create_model, make_config
from ctrkit.train.optim import build_optimizers

CARDS = (7, 50, 3, 120, 31)
STEPS = 4
BATCHES = (16, 16, 16, 11)  # the last global batch does not divide over 2 ranks


def build(model_name: str):
    torch.manual_seed(0)
    shape = dict(num_numerical=4, cardinalities=CARDS, embedding_dim=8, bottom_mlp=(16, 8), top_mlp=(16, 1))
    if model_name == "dcnv2":
        shape["cross_layers"] = 2
    return create_model(model_name, make_config(model_name, shape))


def batches():
    g = torch.Generator().manual_seed(1)
    for b in BATCHES:
        dense = torch.randn(b, 4, generator=g)
        sparse = torch.stack([torch.randint(0, c, (b,), generator=g) for c in CARDS], 1)
        labels = torch.randint(0, 2, (b,), generator=g).float()
        yield dense, sparse, labels


def step(model, optimizers, dense, sparse, labels, scale, sync=None):
    logits = model(dense, sparse)
    loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels, reduction="sum") / scale
    for o in optimizers:
        o.zero_grad()
    loss.backward()
    if sync is not None:
        sync()
    for o in optimizers:
        o.step()
    return loss.detach()


def single_process(model_name):
    model = build(model_name)
    opts = build_optimizers(model, "sgd", 0.1, "sgd", 0.1)
    losses = [float(step(model, opts, d, s, y, len(y))) for d, s, y in batches()]
    return losses, model.state_dict()


def _worker(rank, world, port, model_name, strategy, out):
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, timeout=timedelta(seconds=60)
    )
    model = build(model_name)
    plan = plan_sharding(CARDS, 8, world, strategy)
    hybrid = HybridModel(model, plan, rank)
    opts = build_optimizers(hybrid.model, "sgd", 0.1, "sgd", 0.1)
    losses = []
    for d, s, y in batches():
        lo, hi = len(y) * rank // world, len(y) * (rank + 1) // world  # this rank's slice
        local = step(hybrid, opts, d[lo:hi], s[lo:hi], y[lo:hi], len(y), hybrid.sync_gradients)
        total = local.clone()
        dist.all_reduce(total)
        losses.append(float(total))
    state = hybrid.full_state_dict()
    if rank == 0:
        torch.save({"losses": losses, "state": state}, out)
    dist.barrier()  # nobody leaves while a peer still needs it
    # no destroy_process_group(): tearing gloo down here aborted a rank now and then ("terminate
    # called without an active exception"); the process exits instead


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("strategy", ["table", "column", "row"])
@pytest.mark.parametrize("model_name", ["dlrm", "dcnv2"])
def test_hybrid_matches_single_process(tmp_path, strategy, model_name):
    losses, state = single_process(model_name)
    out = tmp_path / "rank0.pt"
    mp.start_processes(_worker, args=(2, free_port(), model_name, strategy, out), nprocs=2, start_method="spawn")
    got = torch.load(out)
    assert got["losses"] == pytest.approx(losses, rel=1e-5, abs=1e-6)
    assert set(got["state"]) == set(state)
    for k, v in state.items():
        torch.testing.assert_close(got["state"][k], v, rtol=1e-5, atol=1e-6, msg=k)
