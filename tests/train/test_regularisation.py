"""Regularisation terms and the first-order (linear) term, against autograd and hand computation."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ctrkit.data.batch import Batch
from ctrkit.models import DLRMConfig, create_model
from ctrkit.train.optim import build_optimizers
from ctrkit.train.step import TrainStep

CPU = torch.device("cpu")


def tiny(linear: bool = False):
    torch.manual_seed(0)
    return create_model(
        "dlrm", DLRMConfig(3, (5, 7), embedding_dim=4, bottom_mlp=(8, 4), top_mlp=(8, 1), linear=linear)
    )


def batch() -> Batch:
    g = torch.Generator().manual_seed(1)
    cats = torch.stack([torch.randint(0, 5, (16,), generator=g), torch.randint(0, 7, (16,), generator=g)], 1)
    return Batch(torch.randn(16, 3, generator=g), cats, torch.randint(0, 2, (16,), generator=g).float())


def test_penalties_update_like_autograd_of_the_penalised_loss():
    """One SGD step of TrainStep with embedding_l2 and weight_decay equals one step on the gradient autograd
    gives for BCE + l2 * sum over looked-up rows of ||row||^2 / B + wd / 2 * sum ||W||^2 (dense lookups)."""
    l2, wd, lr, b = 0.3, 0.05, 0.1, batch()
    model = tiny()
    reference = tiny()
    step = TrainStep(model, build_optimizers(model, "sgd", lr, "sgd", lr), CPU, embedding_l2=l2, weight_decay=wd)
    step(b)

    table = reference.embeddings.onehot.weight
    rows = b.categorical + reference.embeddings.onehot.offsets  # (B, F) rows of the flat table
    reference.embeddings.onehot.sparse = False  # dense gradients for the reference
    logits = reference(b.numerical, b.categorical)
    loss = F.binary_cross_entropy_with_logits(logits, b.labels)
    loss = loss + l2 * table[rows].pow(2).sum() / len(b)
    weights = [p for n, p in reference.named_parameters() if p.dim() >= 2 and "embeddings" not in n]
    loss = loss + 0.5 * wd * sum(w.pow(2).sum() for w in weights)
    loss.backward()
    with torch.no_grad():
        for (name, p), q in zip(reference.named_parameters(), model.parameters()):
            torch.testing.assert_close(q, p - lr * p.grad, rtol=1e-5, atol=1e-6, msg=name)
    untouched = torch.ones(table.shape[0], dtype=torch.bool)
    untouched[rows.flatten()] = False  # rows no sample looked up are not decayed: sparse updates
    torch.testing.assert_close(model.embeddings.onehot.weight[untouched], table[untouched].detach())


def test_linear_term_adds_one_weight_per_id_a_linear_map_and_bucket_weights_of_the_numericals():
    model, b = tiny(linear=True).eval(), batch()
    buckets = model.wide_buckets
    with torch.no_grad():
        base = model(b.numerical, b.categorical)  # the linear term starts at zero
        model.wide_embeddings.onehot.weight.normal_()
        model.wide_dense.weight.normal_()
        model.wide_dense.bias.fill_(0.25)
        fitted = buckets.fit(b.numerical)
        buckets.weight.normal_()
        got = model(b.numerical, b.categorical)
        rows = b.categorical + model.wide_embeddings.onehot.offsets
        # each value's bucket: how many cut points lie at or below it (searchsorted, right side)
        per_feature = [
            buckets.weight[
                f * buckets.buckets + torch.searchsorted(buckets.cuts[f], b.numerical[:, f].contiguous(), right=True)
            ]
            for f in range(b.numerical.shape[1])
        ]
        by_hand = (
            model.wide_embeddings.onehot.weight[rows].sum((1, 2))
            + b.numerical @ model.wide_dense.weight[0]
            + 0.25
            + torch.stack(per_feature, 1).sum(1)
        )
    assert min(fitted["buckets"]) > 1  # the batch's values were cut into several buckets
    torch.testing.assert_close(got - base, by_hand, rtol=1e-5, atol=1e-5)
    wide = {id(p) for p in model.wide_parameters()}
    optimizers = build_optimizers(model, "adam", 1e-3, "adam", 1e-2, "adagrad", 0.02)
    # the tables in the sparse optimizer; the linear map's weight and bias and the bucket weights in the dense one
    assert [sum(id(p) in wide for g in o.param_groups for p in g["params"]) for o in optimizers][:2] == [1, 3]
