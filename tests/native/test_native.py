"""ctrkit.native: the C kernels build with the machine's compiler, agree with a float64 reference and with the
ATen path, do not depend on the thread count, and where they cannot be built training says so and keeps ATen."""

import platform
import shutil
import subprocess
import sys

import pytest
import torch

from ctrkit import native
from ctrkit.models.interaction import DotInteraction, _DotInteractionFn, _NativeDotInteractionFn

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
    assert native._build(native._compiler()) == built[0] and built[0].stat().st_mtime_ns == stamp  # reused


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
    """The interaction's output and gradients (bf16 under fp32 tables, and fp32) and a lazy-Adam table after 2
    steps, from whichever library native.library() returns."""
    from ctrkit.train.optim import SparseRowOptimizer

    torch.manual_seed(3)
    m = DotInteraction(27, 16)
    results = []
    for dtype in (torch.float32, torch.bfloat16):
        dense, emb = torch.randn(64, 16).to(dtype).requires_grad_(), torch.randn(64, 26, 16, requires_grad=True)
        out = m(dense, emb)
        assert type(out.grad_fn).__name__ == "_NativeDotInteractionFnBackward"
        results += [out, *torch.autograd.grad(out, (dense, emb), torch.randn_like(out))]
    table = torch.nn.Parameter(torch.randn(500, 16))
    opt = SparseRowOptimizer([table], "adam", lr=0.01)
    for _ in range(2):
        ids = (torch.rand(300) ** 2 * 500).long()
        table.grad = torch.sparse_coo_tensor(ids.unsqueeze(0), torch.randn(300, 16), table.shape)
        opt.step()
    return [*results, table.detach()]


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
