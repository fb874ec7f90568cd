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


def _reference_fill(init, out, feature, row_lo, row_hi, col_lo=0, col_hi=None, draw=0):
    """The draw as it was first written: block by block, each from its own generator, into a fresh block."""
    import math

    from ctrkit.models.embeddings import INIT_BLOCK_ROWS

    col_hi = init.dim if col_hi is None else col_hi
    card = init.cardinalities[feature]
    bound = 1.0 / math.sqrt(card)
    for block in range(row_lo // INIT_BLOCK_ROWS, -(-row_hi // INIT_BLOCK_ROWS)):
        lo, hi = block * INIT_BLOCK_ROWS, min((block + 1) * INIT_BLOCK_ROWS, card)
        key = (init.seed, feature, block) if draw == 0 else (init.seed, feature, block, draw)
        generator = torch.Generator().manual_seed(hash(key) & (2**63 - 1))
        values = torch.empty(hi - lo, init.dim).uniform_(-bound, bound, generator=generator)
        a, b = max(lo, row_lo), min(hi, row_hi)
        out[a - row_lo : b - row_lo] = values[a - lo : b - lo, col_lo:col_hi]
    return out


@pytest.mark.parametrize("threads", [1, 2])
def test_tables_drawn_on_threads_in_place_equal_the_block_by_block_draw(threads):
    from ctrkit.models.embeddings import INIT_BLOCK_ROWS

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        torch.manual_seed(11)
        rows = INIT_BLOCK_ROWS * 2 + 123
        emb = EmbeddingCollection((7, rows, 1000), 6)
        init, offsets = emb.init, emb.offsets.tolist()
        for f, card in enumerate(emb.cardinalities):  # whole tables: drawn in place, on threads
            want = _reference_fill(init, torch.empty(card, 6), f, 0, card)
            assert torch.equal(emb.weight[offsets[f] : offsets[f] + card], want), f
        for args in ((1, 5, INIT_BLOCK_ROWS + 9, 0, 6), (1, 100, rows, 2, 5), (2, 0, 1000, 0, 6, 3)):  # shards, redraws
            f, lo, hi, c0, c1, *draw = args
            got = init.fill(torch.empty(hi - lo, c1 - c0), f, lo, hi, c0, c1, *draw)
            assert torch.equal(got, _reference_fill(init, torch.empty(hi - lo, c1 - c0), f, lo, hi, c0, c1, *draw))
        emb.reset_tables(draw=2)
        want = _reference_fill(init, torch.empty(rows, 6), 1, 0, rows, draw=2)
        assert torch.equal(emb.weight[offsets[1] : offsets[1] + rows], want)
    finally:
        torch.set_num_threads(before)
