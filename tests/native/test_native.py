"""ctrkit.native: the C kernels build with the machine's compiler, agree with a float64 reference and with the
ATen path, do not depend on the thread count, and where they cannot be built training says so and keeps ATen."""

import copy
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ctrkit import native
from ctrkit.models.embeddings import EmbeddingCollection
from ctrkit.models.interaction import DotInteraction, _DotInteractionFn, _NativeDotInteractionFn
from ctrkit.models.mlp import MLP, _LinearChainFn, _LinearReLUFn

HAS_CC = native._compiler() is not None
needs_cc = pytest.mark.skipif(not HAS_CC, reason="no C compiler on this machine")


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """native.library() built anew into an empty cache, the process's library put back afterwards."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(native, "_loaded", [])
    return tmp_path


@needs_cc
def test_the_library_builds_once_per_source_and_cpu(fresh):
    lib = native.library()
    assert lib is not None and all(hasattr(lib, name) for name in native.SIGNATURES)
    built = list((fresh / "ctrkit" / "native").glob("libctrkit_native_*.so"))
    assert len(built) == 1 and not list(built[0].parent.glob("*.tmp"))
    stamp = built[0].stat().st_mtime_ns
    again = native._build(native._compiler(), native.FLAGS)
    assert again == built[0] and built[0].stat().st_mtime_ns == stamp  # reused


def test_a_failing_compiler_leaves_aten_and_says_why_once(fresh, monkeypatch, capsys):
    monkeypatch.setenv("CC", shutil.which("false") or "false")
    monkeypatch.setattr(native, "_compiler", lambda: shutil.which("false"))
    assert native.library() is None and native.library() is None
    err = capsys.readouterr().err
    assert err.count("native CPU kernels unavailable") == 1 and "failed" in err
    assert not list((fresh / "ctrkit" / "native").glob("*"))  # nothing half-written left
    m = DotInteraction(5, 16)
    out = m(torch.randn(4, 16), torch.randn(4, 4, 16, requires_grad=True))
    assert type(out.grad_fn).__name__ == "_DotInteractionFnBackward"


def test_ctrkit_native_0_keeps_aten():
    code = (
        "import torch; from ctrkit import native; from ctrkit.models.interaction import DotInteraction; "
        "m = DotInteraction(5, 16); o = m(torch.randn(4, 16), torch.randn(4, 4, 16, requires_grad=True)); "
        "print(native.library(), type(o.grad_fn).__name__)"
    )
    env = {"CTRKIT_NATIVE": "0", "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["None", "_DotInteractionFnBackward"] and done.stderr == ""


CASES = [
    # (with_dense, self_interaction, width D, dense dtype, embeddings dtype, features F): F + 1 vectors take one
    # to five blocks of 16 in the vector path of an AVX-512 build (blocks of 8 with AVX2, where past 64 vectors
    # the scalar loops run, as at D = 12)
    *[(True, s, d, torch.float32, torch.float32, 9) for s in (False, True) for d in (16, 64, 12)],
    *[(True, s, 16, torch.float32, torch.float32, f) for s in (False, True) for f in (26, 40, 70)],
    (False, False, 16, torch.float32, torch.float32, 9),
    (False, True, 12, torch.float32, torch.float32, 9),
    (True, False, 16, torch.bfloat16, torch.float32, 26),  # bf16 autocast: fp32 tables, bf16 bottom MLP
    (True, True, 32, torch.bfloat16, torch.float32, 9),
    (True, False, 16, torch.bfloat16, torch.bfloat16, 9),
    (False, False, 16, torch.bfloat16, torch.bfloat16, 50),
]


@needs_cc
@pytest.mark.parametrize("with_dense,self_interaction,dim,dense_dtype,emb_dtype,f", CASES)
def test_native_interaction_equals_the_reference(with_dense, self_interaction, dim, dense_dtype, emb_dtype, f):
    """Output and both gradients against DotInteraction's plain ops in float64 (fp32: to float rounding; bf16:
    the same bf16 rounding of the inputs, then within the output's rounding), and against the ATen function."""
    torch.manual_seed(0)
    m = DotInteraction(f + with_dense, dim, self_interaction=self_interaction, with_dense=with_dense)
    dense = torch.randn(33, dim).to(dense_dtype).requires_grad_() if with_dense else None
    emb = torch.randn(33, f, dim).to(emb_dtype).requires_grad_()
    out = m(dense, emb)  # (B, W)
    assert type(out.grad_fn).__name__ == "_NativeDotInteractionFnBackward"
    grad = torch.randn_like(out)
    inputs = [x for x in (dense, emb) if x is not None]
    got = torch.autograd.grad(out, inputs, grad)
    # reference: the plain ops in float64 on the inputs as the model's dtype rounds them
    work = out.dtype
    ref_in = [x.detach().to(work).double().requires_grad_() for x in inputs]
    ref = m._plain(*(ref_in if with_dense else [None, *ref_in]))
    ref_grads = torch.autograd.grad(ref, ref_in, grad.double())
    bf16 = work == torch.bfloat16
    torch.testing.assert_close(out.double(), ref, rtol=1e-2 if bf16 else 1e-5, atol=1e-2 if bf16 else 1e-5)
    for g, r, x in zip(got, ref_grads, inputs):
        assert g.dtype == x.dtype and g.shape == x.shape
        tol = 1e-2 if g.dtype == torch.bfloat16 else 1e-4
        torch.testing.assert_close(g.double(), r, rtol=tol, atol=tol)
    aten = _DotInteractionFn.apply(dense, emb, m.pair_index, m.sym_index, self_interaction, m.padding)
    torch.testing.assert_close(out, aten, rtol=1e-2 if bf16 else 1e-5, atol=1e-2 if bf16 else 1e-5)
    for g, a in zip(got, torch.autograd.grad(aten, inputs, grad)):
        torch.testing.assert_close(g, a, rtol=1e-2 if g.dtype == torch.bfloat16 else 1e-5, atol=1e-4)


@needs_cc
@pytest.mark.parametrize("pad_to", [1, 5, 16])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("self_interaction", [False, True])
def test_native_interaction_rows_end_where_the_output_row_ends(pad_to, dtype, self_interaction):
    """The forward stores each row's dots as whole registers, lanes past its pairs included, for the next row or the
    padding to write over: with no padding (the last registers then reach past the output row and are stored lane
    by lane), odd and wide padding, each sample's output is the plain ops' (float64, to rounding), its padding zeros,
    and no sample's row spills into the next."""
    torch.manual_seed(5)
    m = DotInteraction(27, 16, self_interaction=self_interaction, pad_to=pad_to)
    dense, emb = torch.randn(41, 16).to(dtype), torch.randn(41, 26, 16)
    out = m(dense.requires_grad_(), emb.requires_grad_())
    assert type(out.grad_fn).__name__ == "_NativeDotInteractionFnBackward" and out.shape[1] == m.out_features
    ref = m._plain(dense.detach().double(), emb.detach().to(dtype).double())
    tol = 1e-2 if dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(out.double(), ref, rtol=tol, atol=tol)
    assert not out[:, out.shape[1] - m.padding :].any()
    one = m(dense[-1:], emb[-1:])  # the last sample alone: nothing after its row
    assert torch.equal(one, out[-1:].detach())


@needs_cc
def test_native_interaction_is_the_same_at_any_thread_count():
    torch.manual_seed(1)
    m = DotInteraction(27, 16)
    dense, emb = torch.randn(2048, 16, requires_grad=True), torch.randn(2048, 26, 16, requires_grad=True)
    grad = torch.randn(2048, m.out_features)
    results = []
    threads = torch.get_num_threads()
    try:
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            out = _NativeDotInteractionFn.apply(dense, emb, "f32", m.out_features, False)
            results.append((out, *torch.autograd.grad(out, (dense, emb), grad)))
    finally:
        torch.set_num_threads(threads)
    for other in results[1:]:
        assert all(torch.equal(a, b) for a, b in zip(results[0], other))


def _kernel_results() -> list[torch.Tensor]:
    """The interaction's output and gradients (bf16 under fp32 tables, and fp32) and lazy-Adam, Adagrad and SGD
    tables after 2 steps, from whichever library native.library() returns."""
    from ctrkit.train.optim import SparseRowOptimizer, SparseSGD

    torch.manual_seed(3)
    m = DotInteraction(27, 16)
    results = []
    for dtype in (torch.float32, torch.bfloat16):
        dense, emb = torch.randn(64, 16).to(dtype).requires_grad_(), torch.randn(64, 26, 16, requires_grad=True)
        out = m(dense, emb)
        assert type(out.grad_fn).__name__ == "_NativeDotInteractionFnBackward"
        results += [out, *torch.autograd.grad(out, (dense, emb), torch.randn_like(out))]
    tables = []
    for make in (
        lambda p: SparseRowOptimizer(p, "adam", lr=0.01),
        lambda p: SparseRowOptimizer(p, "adagrad", lr=0.01),
        lambda p: SparseSGD(p, lr=0.01),
    ):
        table = torch.nn.Parameter(torch.randn(500, 16))
        opt = make([table])
        for _ in range(2):
            ids = (torch.rand(300) ** 2 * 500).long()
            table.grad = torch.sparse_coo_tensor(
                ids.unsqueeze(0), torch.randn(300, 16), table.shape, check_invariants=True
            )
            opt.step()
        tables.append(table.detach())
    mlp = MLP(13, (64, 16))
    x = torch.randn(100, 13)
    out = mlp(x)
    return [*results, *tables, out, *torch.autograd.grad(out, list(mlp.parameters()), torch.randn_like(out))]


@needs_cc
@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86-64 instruction sets")
def test_a_build_for_avx2_cpus_gives_the_same_results(fresh, monkeypatch):
    """The kernels compiled for an AVX2-only CPU (-march=x86-64-v3 in place of -march=native: each 16-float vector
    becomes two AVX2 registers) give this machine's build's results, bit for bit."""
    here = _kernel_results()  # this machine's build, into the fresh cache
    monkeypatch.setattr(native, "FLAGS", tuple("-march=x86-64-v3" if f == "-march=native" else f for f in native.FLAGS))
    monkeypatch.setattr(native, "_loaded", [])
    assert native.library() is not None
    built = list((fresh / "ctrkit" / "native").glob("libctrkit_native_*.so"))
    assert len(built) == 2  # a library of its own (the flags are part of the cache key)
    for a, b in zip(_kernel_results(), here):
        assert torch.equal(a, b)


@needs_cc
def test_the_build_is_cached_by_the_sources_text(fresh, tmp_path):
    """The library is cached by its sources' text: a copy of the same sources is the same library, changed text
    (an edited kernel after an upgrade) another one."""
    other = tmp_path / "src"
    other.mkdir()
    for name in (*native.SOURCES, *native.HEADERS):
        shutil.copy(Path(native.__file__).parent / name, other / name)
    compiler = native._compiler()
    assert native._build(compiler, native.FLAGS, other) == Path(native.build()._name)
    (other / "rows.c").write_text((other / "rows.c").read_text() + "\n/* changed */\n")
    assert native._build(compiler, native.FLAGS, other) != Path(native.build()._name)


@needs_cc
def test_vector_square_roots_give_the_scalar_build_s_bits(fresh, monkeypatch):
    """-fno-math-errno lets GCC vectorize the row optimizers' square roots and divisions; the kernels built
    without it (scalar sqrtss and divss behind an errno branch) give the same results, bit for bit."""
    assert "-fno-math-errno" in native.FLAGS
    here = _kernel_results()
    monkeypatch.setattr(native, "FLAGS", tuple(f for f in native.FLAGS if f != "-fno-math-errno"))
    monkeypatch.setattr(native, "_loaded", [])
    assert native.library() is not None
    assert len(list((fresh / "ctrkit" / "native").glob("libctrkit_native_*.so"))) == 2
    for a, b in zip(_kernel_results(), here):
        assert torch.equal(a, b)


MLP_CASES = [  # in_features, sizes, relu_last, dropout: narrow and wide inputs, widths off the vector length
    (13, (512, 64, 16), True, 0.0),
    (40, (70, 33, 1), False, 0.0),
    (100, (256, 256, 1), False, 0.5),
]


@needs_cc
@pytest.mark.parametrize("in_features,sizes,relu_last,dropout", MLP_CASES)
def test_native_mlp_equals_float64_and_aten(in_features, sizes, relu_last, dropout):
    """MLP's training forward through ctrkit/native/mlp.c (bias and ReLU after an unbiased product; the masked
    gradient and the bias's sum in one pass) against the same MLP in float64 and ATen's layers in float32: output,
    input gradient and every parameter's gradient, relative to the reference's norm."""
    torch.manual_seed(len(sizes) + in_features)
    m = MLP(in_features, sizes, relu_last=relu_last, dropout=dropout)
    x, grad = torch.randn(300, in_features), torch.randn(300, sizes[-1])

    def run(model, dtype, use_native):
        model.use_native = use_native
        xx = x.to(dtype).requires_grad_()
        torch.manual_seed(7)  # the same dropout masks
        out = model(xx)
        nodes = {type(n).__name__ for n in _graph_nodes(out.grad_fn)}
        return [out, *torch.autograd.grad(out, (xx, *model.parameters()), grad.to(dtype))], nodes

    got, nodes = run(m, torch.float32, True)
    assert ("_LinearReLUFnBackward" if dropout else "_LinearChainFnBackward") in nodes
    aten, nodes = run(m, torch.float32, False)
    assert "_LinearReLUFnBackward" not in nodes
    ref, _ = run(copy.deepcopy(m).double(), torch.float64, False)
    for a, b, r in zip(got, aten, ref):  # (absolute 1e-5: a bias's gradient can be a sum that cancels)
        assert (a.double() - r).norm() <= 1e-5 * r.norm() + 1e-5
        assert (b.double() - r).norm() <= 1e-5 * r.norm() + 1e-5


@needs_cc
@pytest.mark.parametrize("in_features,sizes,relu_last", [(13, (512, 64, 16), True), (70, (33, 17, 1), False)])
@pytest.mark.parametrize("input_grad", [False, True])
def test_the_chained_mlp_equals_its_layers_one_by_one(in_features, sizes, relu_last, input_grad):
    """An MLP without dropout runs as one autograd node (_LinearChainFn, masked gradients written in place) and
    gives the per-layer functions' output and gradients bit for bit, with or without the input's gradient; the
    gradient handed to it is left as it was."""
    torch.manual_seed(11)
    m = MLP(in_features, sizes, relu_last=relu_last)
    x, grad = torch.randn(257, in_features), torch.randn(257, sizes[-1])
    if relu_last:
        grad[grad.abs() < 0.3] = 0.0
    results = []
    for chain in (True, False):
        m.use_chain = chain
        xx = x.clone().requires_grad_(input_grad)
        out = m(xx)
        nodes = [type(n).__name__ for n in _graph_nodes(out.grad_fn)]
        assert nodes.count("_LinearChainFnBackward") == chain and ("_LinearReLUFnBackward" in nodes) != chain
        given = grad.clone()
        results.append([out, *torch.autograd.grad(out, [*([xx] if input_grad else []), *m.parameters()], given)])
        assert torch.equal(given, grad)
    assert len(results[0]) == len(results[1]) == 1 + input_grad + 2 * len(sizes)
    for a, b in zip(*results):
        assert torch.equal(a, b)


@needs_cc
@pytest.mark.parametrize("in_features,sizes,relu_last", [(13, (512, 64, 16), True), (70, (33, 17, 1), False)])
def test_the_chained_mlp_under_bf16_autocast_equals_autocasts_layers(in_features, sizes, relu_last):
    """Under the CPU's bfloat16 autocast the chained MLP runs autocast's products and gives the layers' output and
    gradients (bfloat16 output, float32 parameter and input gradients) bit for bit at these shapes (the bias's sum
    may differ in its last bit elsewhere); NaN and zero pre-activations keep threshold_backward's rule."""
    torch.manual_seed(12)
    m = MLP(in_features, sizes, relu_last=relu_last)
    x, grad = torch.randn(300, in_features), torch.randn(300, sizes[-1]).bfloat16()
    x[0, 0] = float("nan")
    results = []
    for chain in (True, False):
        m.use_chain = chain
        xx = x.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = m(xx)
        assert out.dtype == torch.bfloat16
        assert (type(out.grad_fn).__name__ == "_LinearChainFnBackward") == chain
        results.append([out, *torch.autograd.grad(out, [xx, *m.parameters()], grad)])
    for a, b in zip(*results):
        assert a.dtype == b.dtype and torch.equal(a.nan_to_num(), b.nan_to_num())
    assert all(g.is_contiguous() for g in results[0][2:])  # the parameters' layout (torch's fused Adam needs it)


@needs_cc
def test_native_lookups_equal_atens_embedding_and_its_sparse_gradient():
    """Training lookups by the prefetching C gather: ATen's output and the same uncoalesced sparse gradient (the
    flat ids, the output's gradient as rows), which the row optimizers then take; ids outside the tables raise as
    ATen's do; without autograd (scoring) ATen's embedding runs."""
    torch.manual_seed(2)
    e = EmbeddingCollection([100, 50, 7], 16)
    ids = torch.stack([torch.randint(0, c, (300,)) for c in (100, 50, 7)], 1)
    grad = torch.randn(300, 3, 16)
    results = []
    for use_native in (True, False):
        e.use_native = use_native
        out = e(ids)
        assert (type(out.grad_fn).__name__ == "_GatherRowsFnBackward") == use_native
        (g,) = torch.autograd.grad(out, [e.weight], grad)
        assert g.is_sparse and not g.is_coalesced()
        results.append((out, g._indices(), g._values()))
    for a, b in zip(*results):
        assert torch.equal(a, b)
    e.use_native = True
    with pytest.raises(IndexError, match="ids outside their tables"):
        e(ids + torch.tensor([0, 0, 100]))
    with torch.no_grad():
        assert torch.equal(e(ids), results[1][0])


@needs_cc
def test_native_mlp_leaves_scoring_to_the_layers(monkeypatch):
    """Without autograd (scoring, export) MLP runs its layers' own operations, not the C kernels; with it, on the
    CPU in float32, it runs them (the whole MLP as one chain; with dropout, layer by layer)."""
    m = MLP(13, (64, 16)).eval()
    calls = []
    monkeypatch.setattr(_LinearChainFn, "apply", lambda *a: calls.append(a) or torch.zeros(4, 16))
    monkeypatch.setattr(_LinearReLUFn, "apply", lambda *a: calls.append(a) or torch.zeros(4, 64))
    with torch.no_grad():
        m(torch.randn(4, 13))
    assert calls == []
    m(torch.randn(4, 13))
    assert len(calls) == 1 and len(calls[0]) == 3 + 4  # input, relu_last, bf16, two weights and two biases
    MLP(13, (64, 16), dropout=0.1)(torch.randn(4, 13))
    assert len(calls) == 3


def _graph_nodes(node):
    seen, todo = [], [node]
    while todo:
        n = todo.pop()
        if n is not None and n not in seen:
            seen.append(n)
            todo += [f for f, _ in n.next_functions]
    return seen


@needs_cc
def test_native_bias_relu_keeps_atens_nan_and_sign_rules_at_any_thread_count():
    """The C passes against torch.relu and threshold_backward on values with NaN, -0.0, zeros and both signs; the
    masked gradient and the bias's gradient are the same bits at 1, 2 and 3 threads, written to a buffer of their
    own or over the gradient (1,025 x 37 values: above the 32,768 below which the kernels take one thread)."""
    lib = native.library()
    torch.manual_seed(5)
    pre = torch.randn(1025, 37)
    pre[0, :6] = torch.tensor([float("nan"), -0.0, 0.0, -1.0, 2.0, float("-inf")])
    bias = torch.randn(37)
    bias[:6] = 0.0
    y = pre.clone()
    lib.ctrkit_bias_relu_f32(y.data_ptr(), bias.data_ptr(), *y.shape)
    torch.testing.assert_close(y, torch.relu(pre + bias), equal_nan=True, rtol=0, atol=0)
    g = torch.randn(1025, 37)
    results, threads = [], torch.get_num_threads()
    try:
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            masked, grad_bias = torch.empty_like(g), torch.empty(37)
            lib.ctrkit_relu_backward_bias_f32(
                g.data_ptr(), y.data_ptr(), masked.data_ptr(), grad_bias.data_ptr(), 1025, 37
            )
            results.append((masked, grad_bias))
            in_place, grad_bias = g.clone(), torch.empty(37)  # the chained MLP's pass, over its own gradient
            lib.ctrkit_relu_backward_bias_f32(in_place.data_ptr(), y.data_ptr(), None, grad_bias.data_ptr(), 1025, 37)
            results.append((in_place, grad_bias))
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(results[0][0], torch.ops.aten.threshold_backward(g, y, 0.0))
    torch.testing.assert_close(results[0][1], results[0][0].double().sum(0).float(), rtol=1e-6, atol=1e-6)
    assert all(torch.equal(a, b) for other in results[1:] for a, b in zip(results[0], other))
