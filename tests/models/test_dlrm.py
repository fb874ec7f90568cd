import math

import pytest
import torch

from ctrkit.models import DLRMConfig, create_model, list_models, register_model
from ctrkit.models.embeddings import EmbeddingCollection
from ctrkit.models.interaction import DotInteraction
from ctrkit.models.mlp import MLP

CARDS = (3, 10, 50, 120)


def small_config(**kw) -> DLRMConfig:
    base = dict(num_numerical=4, cardinalities=CARDS, embedding_dim=8, bottom_mlp=(16, 8), top_mlp=(16, 1))
    return DLRMConfig(**{**base, **kw})


def random_inputs(b: int = 32, cards=CARDS, n_num: int = 4):
    sparse = torch.stack([torch.randint(0, c, (b,)) for c in cards], dim=1)
    return torch.randn(b, n_num), sparse


def test_forward_shape_and_registry():
    assert "dlrm" in list_models()
    model = create_model("dlrm", small_config())
    dense, sparse = random_inputs(32)
    assert model(dense, sparse).shape == (32,)
    assert model.interaction.out_features % 8 == 0


def test_dot_interaction_against_a_loop():
    torch.manual_seed(1)
    b, f, d = 5, 4, 3
    dense, emb = torch.randn(b, d), torch.randn(b, f, d)
    for self_interaction in (False, True):
        layer = DotInteraction(f + 1, d, self_interaction=self_interaction, pad_to=8)
        out = layer(dense, emb)
        vectors = [dense] + [emb[:, i] for i in range(f)]
        expected = [dense]
        for i in range(f + 1):
            for j in range(i + 1 if self_interaction else i):  # lower triangle, row by row
                expected.append((vectors[i] * vectors[j]).sum(1, keepdim=True))
        ref = torch.cat(expected, 1)
        pairs = (f + 1) * (f + 2) // 2 if self_interaction else (f + 1) * f // 2
        assert ref.shape[1] == d + pairs
        assert out.shape[1] == math.ceil((d + pairs) / 8) * 8
        torch.testing.assert_close(out[:, : ref.shape[1]], ref)
        assert torch.count_nonzero(out[:, ref.shape[1] :]) == 0  # the padding is zeros


def test_nvidia_padding_for_criteo_kaggle_shape():
    # 26 embeddings + the dense vector: 16 + 27*26/2 = 367 features, padded to 368
    assert DotInteraction(27, 16).out_features == 368


def test_backward_reaches_every_parameter_and_embedding_gradient_is_sparse():
    model = create_model("dlrm", small_config())
    dense, sparse = random_inputs(64)
    model(dense, sparse).sum().backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, name
        g = p.grad.to_dense() if p.grad.is_sparse else p.grad
        assert torch.count_nonzero(g) > 0, name
    grad = model.embeddings.onehot.weight.grad
    assert grad.is_sparse
    used_rows = set((sparse + model.embeddings.onehot.offsets).flatten().tolist())
    assert set(grad.coalesce().indices()[0].tolist()) == used_rows


def test_flat_table_equals_separate_tables():
    emb = EmbeddingCollection(CARDS, 4)
    _, sparse = random_inputs(16)
    out = emb(sparse)  # (B, F, D)
    for f in range(len(CARDS)):
        torch.testing.assert_close(out[:, f], emb.table(f)[sparse[:, f]])


def test_initialisation_follows_the_reference():
    torch.manual_seed(0)
    emb = EmbeddingCollection((4, 10_000), 64)
    assert emb.table(0).abs().max() <= 1 / math.sqrt(4)
    assert emb.table(1).abs().max() <= 1 / math.sqrt(10_000)
    # uniform(-a, a) has std a/sqrt(3)
    assert emb.table(1).std().item() == pytest.approx(1 / math.sqrt(10_000) / math.sqrt(3), rel=0.02)
    mlp = MLP(512, (256,))
    assert mlp[0].weight.std().item() == pytest.approx(math.sqrt(2 / (512 + 256)), rel=0.02)
    assert mlp[0].bias.std().item() == pytest.approx(math.sqrt(1 / 256), rel=0.2)


def test_without_numerical_features():
    model = create_model("dlrm", small_config(num_numerical=0, bottom_mlp=()))
    _, sparse = random_inputs(8)
    assert model(None, sparse).shape == (8,)
    assert model.bottom_mlp is None


def test_bad_names_and_configs_are_errors():
    with pytest.raises(ValueError, match="unknown model 'dlrmm'; available: .*dlrm"):
        create_model("dlrmm", small_config())
    with pytest.raises(ValueError, match="already registered"):
        register_model("dlrm", DLRMConfig)(object)
    with pytest.raises(ValueError, match="bottom_mlp must end in embedding_dim=8"):
        create_model("dlrm", small_config(bottom_mlp=(16, 4)))
    with pytest.raises(ValueError, match="top_mlp must end in 1"):
        create_model("dlrm", small_config(top_mlp=(16, 2)))
    with pytest.raises(ValueError, match="no config field"):
        create_model("dlrm", {"num_numerical": 1, "cardinalities": [2], "hidden": 3})


@pytest.mark.parametrize("self_interaction", [False, True])
def test_interaction_backward_matches_autograd_reference(self_interaction):
    torch.manual_seed(2)
    b, f, d = 6, 5, 4
    dense = torch.randn(b, d, dtype=torch.float64, requires_grad=True)
    emb = torch.randn(b, f, d, dtype=torch.float64, requires_grad=True)
    layer = DotInteraction(f + 1, d, self_interaction=self_interaction)
    assert torch.autograd.gradcheck(lambda x, e: layer(x, e), (dense, emb))

    # and against plain autograd through bmm + advanced indexing
    weights = torch.randn(b, layer.out_features, dtype=torch.float64)
    (layer(dense, emb) * weights).sum().backward()
    got = dense.grad.clone(), emb.grad.clone()
    dense.grad = emb.grad = None
    vectors = torch.cat([dense.unsqueeze(1), emb], 1)
    rows, cols = torch.tril_indices(f + 1, f + 1, offset=0 if self_interaction else -1)
    ref = torch.cat([dense, torch.bmm(vectors, vectors.transpose(1, 2))[:, rows, cols]], 1)
    (ref * weights[:, : ref.shape[1]]).sum().backward()
    torch.testing.assert_close(got[0], dense.grad)
    torch.testing.assert_close(got[1], emb.grad)


def test_interaction_without_dense_vector_gradients():
    torch.manual_seed(3)
    emb = torch.randn(4, 5, 3, dtype=torch.float64, requires_grad=True)
    layer = DotInteraction(5, 3, with_dense=False)
    assert layer.out_features == 16  # 10 pairs padded to 16
    assert torch.autograd.gradcheck(lambda e: layer(None, e), (emb,))


def _reference_value(init, feature, row, col, draw=0):
    """One table value from the definition (docs/decisions/table-draw.md), in Python integers: the SplitMix64
    finaliser written out here, not taken from ctrkit, at counter row * dim + col + 1 of the table's key."""
    mask = (1 << 64) - 1

    def finalise(z):
        z &= mask
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        return z ^ (z >> 31)

    golden = 0x9E3779B97F4A7C15
    key = finalise(finalise(finalise(init.seed + golden) ^ feature) ^ draw)
    z = finalise(key + (row * init.dim + col + 1) * golden)
    j = ((z >> 39) | 1) - (1 << 24)  # odd, in (-2**24, 2**24)
    scale = torch.tensor(1 / math.sqrt(init.cardinalities[feature]) / (1 << 24), dtype=torch.float32)
    return (torch.tensor(float(j), dtype=torch.float32) * scale).item()


@pytest.mark.parametrize("threads", [1, 2])
def test_tables_drawn_by_the_kernel_equal_torch_operations_and_the_definition(threads):
    """The C kernel (whole tables on threads, shards, column ranges, strided rows, redraws) and torch's operations
    (where the kernel is not built, and on a GPU) draw the same bits, and each value is the definition's."""
    import random

    from ctrkit import native

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        torch.manual_seed(11)
        rows = 70_000
        emb = EmbeddingCollection((7, rows, 1000), 6)
        init, offsets = emb.init, emb.offsets.tolist()
        assert native.library() is not None  # the kernel drew these (CI has a C compiler)
        with native.suspended():
            for f, card in enumerate(emb.cardinalities):  # whole tables
                want = init.fill(torch.empty(card, 6), f, 0, card)
                assert torch.equal(emb.weight[offsets[f] : offsets[f] + card], want), f
        picks = random.Random(3)
        for args in ((1, 5, 66_000, 0, 6), (1, 100, rows, 2, 5), (2, 0, 1000, 0, 6, 3), (0, 2, 7, 1, 2)):
            f, lo, hi, c0, c1, *draw = args
            strided = torch.full((hi - lo, 9), float("nan"))[:, 1 : 1 + c1 - c0]  # rows 9 floats apart
            got = init.fill(strided, f, lo, hi, c0, c1, *draw)
            with native.suspended():
                want = init.fill(torch.empty(hi - lo, c1 - c0), f, lo, hi, c0, c1, *draw)
            assert torch.equal(got, want), args
            for _ in range(20):
                r, c = picks.randrange(lo, hi), picks.randrange(c0, c1)
                assert got[r - lo, c - c0].item() == _reference_value(init, f, r, c, *draw), (args, r, c)
        emb.reset_tables(draw=2)
        want = init.fill(torch.empty(rows, 6), 1, 0, rows, draw=2)
        assert torch.equal(emb.weight[offsets[1] : offsets[1] + rows], want)
    finally:
        torch.set_num_threads(before)


def test_drawn_tables_are_uniform_and_independent():
    """Each table is U(-b, b) (a Kolmogorov-Smirnov test on a million values), and tables of other features, other
    draws and other seeds are uncorrelated."""
    from scipy import stats

    from ctrkit.models.table_draw import TableInit

    card, dim = 15_625, 64
    init = TableInit(seed=123, zero=False, cardinalities=(card, card), dim=dim)
    bound = 1 / math.sqrt(card)
    table = init.fill(torch.empty(card, dim), 0, 0, card)
    assert table.abs().max() <= bound
    assert stats.kstest(table.flatten().double().numpy(), stats.uniform(-bound, 2 * bound).cdf).pvalue > 1e-3
    assert len(torch.unique(table)) > 0.9 * table.numel()
    others = [
        init.fill(torch.empty(card, dim), 1, 0, card),  # another feature
        init.fill(torch.empty(card, dim), 0, 0, card, draw=1),  # a redraw
        TableInit(124, False, (card, card), dim).fill(torch.empty(card, dim), 0, 0, card),  # another seed
    ]
    for other in others:
        assert abs(torch.corrcoef(torch.stack([table.flatten(), other.flatten()]))[0, 1]) < 0.005
    # neighbouring values of one table are uncorrelated too (the counter runs along rows)
    flat = table.flatten()
    assert abs(torch.corrcoef(torch.stack([flat[:-1], flat[1:]]))[0, 1]) < 0.005
    half = init.fill(torch.empty(card, dim, dtype=torch.bfloat16), 0, 0, card)  # other dtypes: the values rounded
    assert torch.equal(half, table.to(torch.bfloat16))
