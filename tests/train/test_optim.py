import pytest
import torch
import torch.nn.functional as F

from ctrkit import native
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


def _run(make_opt, ids_per_step, sparse, steps=4, rows=12, dim=3, seed=0):
    """Trains a lookup + linear head with the optimizer from ``make_opt``; returns the table."""
    torch.manual_seed(seed)
    weight = torch.nn.Parameter(torch.randn(rows, dim))
    head = torch.randn(dim, 1)
    opt = make_opt([weight])
    for ids in ids_per_step[:steps]:
        opt.zero_grad()
        out = F.embedding(ids, weight, sparse=sparse).sum(1) @ head
        (out.pow(2).mean() + out.mean()).backward()
        opt.step()
    return weight.detach()


# every step touches every row (so lazy and dense updates coincide), with repeated ids
ALL_ROWS = [torch.tensor([[i % 12, (i * 5 + s) % 12, 3] for i in range(12)]) for s in range(4)]
SOME_ROWS = [torch.tensor([[1, 1, 5], [5, 7, 1]]), torch.tensor([[2, 7, 7]]), torch.tensor([[1, 9, 0]])] * 2


def test_sparse_adagrad_matches_torch_adagrad():
    from ctrkit.train.optim import SparseRowOptimizer

    for ids in (ALL_ROWS, SOME_ROWS):
        ours = _run(lambda p: SparseRowOptimizer(p, "adagrad", lr=0.1), ids, sparse=True)
        ref = _run(lambda p: torch.optim.Adagrad(p, lr=0.1), ids, sparse=False)
        torch.testing.assert_close(ours, ref)


def test_sparse_adam_matches_adam_when_rows_are_all_touched_and_sparse_adam_otherwise():
    from ctrkit.train.optim import SparseRowOptimizer

    ours = _run(lambda p: SparseRowOptimizer(p, "adam", lr=0.05), ALL_ROWS, sparse=True)
    ref = _run(lambda p: torch.optim.Adam(p, lr=0.05), ALL_ROWS, sparse=False)
    torch.testing.assert_close(ours, ref)
    ours = _run(lambda p: SparseRowOptimizer(p, "adam", lr=0.05), SOME_ROWS, sparse=True)
    lazy = _run(lambda p: torch.optim.SparseAdam(p, lr=0.05), SOME_ROWS, sparse=True)
    torch.testing.assert_close(ours, lazy, rtol=1e-5, atol=1e-6)  # eps sits in a different place
    untouched = [r for r in range(12) if r not in {0, 1, 2, 5, 7, 9}]
    torch.manual_seed(0)
    start = torch.randn(12, 3)
    torch.testing.assert_close(ours[untouched], start[untouched])  # lazy: rows not looked up never move


@pytest.mark.parametrize("kind", ["adam", "adagrad"])
@pytest.mark.parametrize("sparse", [True, False])
def test_fused_cpu_update_equals_the_elementwise_one_and_torchs(kind, sparse):
    """On the CPU, Adam and Adagrad run as torch's fused kernels over the gathered rows (or the whole table
    for a dense gradient); other devices run the elementwise operations. Both give torch's optimizer's
    values, and rows a sparse step did not look up stay where they were."""
    from ctrkit.train.optim import SparseRowOptimizer

    def ours(fused, native_kernels=False):
        def make(p):
            opt = SparseRowOptimizer(p, kind, lr=0.05)
            opt.fused_on_cpu, opt.native_on_cpu = fused, native_kernels
            return opt

        return _run(make, SOME_ROWS, sparse=sparse, steps=6)

    fused, elementwise = ours(True), ours(False)
    torch.testing.assert_close(fused, elementwise, rtol=1e-6, atol=1e-7)
    if native.library() is not None:  # ctrkit/native/rows.c: the same update in one pass
        torch.testing.assert_close(ours(True, True), fused, rtol=1e-6, atol=1e-7)
    torch.manual_seed(0)
    start = torch.randn(12, 3)
    assert not torch.equal(fused[[1, 5, 7]], start[[1, 5, 7]])
    if sparse:
        untouched = [r for r in range(12) if r not in {0, 1, 2, 5, 7, 9}]
        assert torch.equal(fused[untouched], start[untouched])
        if kind == "adagrad":  # lazy Adam has no dense equivalent on rows that miss steps
            ref = _run(lambda p: torch.optim.Adagrad(p, lr=0.05), SOME_ROWS, sparse=False, steps=6)
            torch.testing.assert_close(fused, ref)
    else:
        make_ref = torch.optim.Adam if kind == "adam" else torch.optim.Adagrad
        ref = _run(lambda p: make_ref(p, lr=0.05), SOME_ROWS, sparse=False, steps=6)
        torch.testing.assert_close(fused, ref)


def test_rowwise_adagrad_against_a_loop():
    from ctrkit.train.optim import SparseRowOptimizer

    ours = _run(lambda p: SparseRowOptimizer(p, "rowwise_adagrad", lr=0.1), SOME_ROWS, sparse=True)
    acc = torch.zeros(12)  # reference: one accumulator per row holding the mean squared gradient

    def update(weight, g, r):
        acc[r] += g.pow(2).mean()
        weight[r] -= 0.1 * g / (acc[r].sqrt() + 1e-10)

    torch.testing.assert_close(ours, _loop_reference(update))


def _loop_reference(update, ids_per_step=SOME_ROWS, steps=4, rows=12, dim=3, seed=0):
    """``_run``'s training written as a loop: dense gradients, then ``update(weight, grad_of_row, row)``
    for each row the step looked up (in place, under no_grad); returns the table."""
    torch.manual_seed(seed)
    weight = torch.nn.Parameter(torch.randn(rows, dim))
    head = torch.randn(dim, 1)
    for ids in ids_per_step[:steps]:
        weight.grad = None
        out = F.embedding(ids, weight).sum(1) @ head
        (out.pow(2).mean() + out.mean()).backward()
        with torch.no_grad():
            for r in ids.unique().tolist():
                update(weight, weight.grad[r], r)
    return weight.detach()


def test_make_optimizer_choices_and_errors():
    from ctrkit.train.optim import SparseRowOptimizer, make_optimizer

    p = [torch.nn.Parameter(torch.zeros(4, 2))]
    assert isinstance(make_optimizer("adam", p, 0.1, sparse=False), torch.optim.Adam)
    assert isinstance(make_optimizer("adagrad", p, 0.1, sparse=True), SparseRowOptimizer)
    assert isinstance(make_optimizer("sgd", p, 0.1, sparse=True), SparseSGD)
    with pytest.raises(ValueError, match="rowwise_adagrad .* embedding tables only"):
        make_optimizer("rowwise_adagrad", p, 0.1, sparse=False)
    with pytest.raises(ValueError, match="unknown optimizer 'lamb'"):
        make_optimizer("lamb", p, 0.1, sparse=False)


def test_ftrl_against_a_loop_of_tensorflows_formula():
    """FTRL-Proximal as TensorFlow's Ftrl computes it (lr power -1/2, accumulators from 0.1, no L1/L2),
    written out per weight; rows not looked up keep their weights and state."""
    from ctrkit.train.optim import SparseRowOptimizer

    ours = _run(lambda p: SparseRowOptimizer(p, "ftrl", lr=0.05), SOME_ROWS, sparse=True)
    n, z = torch.full((12, 3), 0.1), torch.zeros(12, 3)

    def update(weight, grad, r):
        for c in range(3):
            g, w = grad[c].item(), weight[r, c].item()
            n_new = n[r, c].item() + g * g
            z[r, c] += g - (n_new**0.5 - n[r, c].item() ** 0.5) / 0.05 * w
            n[r, c] = n_new
            weight[r, c] = -z[r, c] * 0.05 / n_new**0.5

    torch.testing.assert_close(ours, _loop_reference(update))
    assert not torch.equal(ours, torch.zeros_like(ours))


def test_rmsprop_is_for_the_dense_part():
    from ctrkit.train.optim import make_optimizer

    p = [torch.nn.Parameter(torch.zeros(4, 2))]
    assert isinstance(make_optimizer("rmsprop", p, 0.1, sparse=False), torch.optim.RMSprop)
    with pytest.raises(ValueError, match="rmsprop applies to the dense part"):
        make_optimizer("rmsprop", p, 0.1, sparse=True)


def test_step_schedule_is_the_wide_deep_seeds():
    # warmup over 4 steps, then base/4 for the first half of the 16 steps left, base/8 after
    s = LRSchedule(base_lr=8.0, warmup_steps=4, kind="step", total_steps=20)
    assert [s(i) for i in range(4)] == [2.0, 4.0, 6.0, 8.0]
    assert [s(i) for i in (4, 11)] == [2.0, 2.0]
    assert [s(i) for i in (12, 19, 500)] == [1.0, 1.0, 1.0]
    with pytest.raises(ValueError, match="poly or step"):
        LRSchedule(base_lr=1.0, kind="cosine")


@pytest.mark.parametrize("dim,dtype", [(16, torch.float32), (1, torch.float32), (8, torch.bfloat16)])
def test_summed_rows_equal_coalesce(dim, dtype):
    """The sparse optimizers' duplicate-id sum (a sort, then one embedding_bag sum per distinct id) gives
    coalesce's rows and the exact sums, on long-tailed ids with many repeats, one-wide tables included; in
    bf16 it is within one bf16 rounding of the exact sum (it accumulates in fp32; coalesce in bf16 is not)."""
    from ctrkit.train.optim import _summed_rows

    gen = torch.Generator().manual_seed(0)
    ids = (torch.rand(5000, generator=gen) ** 4 * 3000).long()  # (nnz,) skewed: most ids repeat
    values = torch.randn(5000, dim, generator=gen).to(dtype)
    g = torch.sparse_coo_tensor(ids.unsqueeze(0), values, (3000, dim), check_invariants=True)
    rows, sums = _summed_rows(g)
    exact = torch.sparse_coo_tensor(ids.unsqueeze(0), values.double(), (3000, dim), check_invariants=True).coalesce()
    assert len(rows) < 2500  # repeats were summed
    torch.testing.assert_close(rows, exact.indices()[0], rtol=0, atol=0)
    assert sums.dtype == dtype
    if dtype == torch.float32:
        torch.testing.assert_close(sums.double(), exact.values(), rtol=1e-5, atol=1e-5)
    else:
        torch.testing.assert_close(sums.double(), exact.values(), rtol=2**-8, atol=1e-2)
    empty = torch.sparse_coo_tensor(
        torch.zeros((1, 0), dtype=torch.long), torch.zeros(0, dim), (3000, dim), check_invariants=True
    )
    rows, sums = _summed_rows(empty)
    assert rows.shape == (0,) and sums.shape == (0, dim)


def test_summed_rows_reuse_a_sort_only_for_equal_ids():
    """The sort is shared by gradients with equal ids (embeddings and first-order tables), and redone for
    other ids of the same length."""
    from ctrkit.train.optim import SortCache, _summed_rows

    gen = torch.Generator().manual_seed(1)
    a = torch.randint(0, 50, (400,), generator=gen)
    b = a.flip(0) + 1  # same length, other ids
    cache = SortCache()
    for ids, dim in ((a, 4), (a.clone(), 1), (b, 4), (a, 4)):
        g = torch.sparse_coo_tensor(
            ids.unsqueeze(0), torch.randn(400, dim, generator=gen), (60, dim), check_invariants=True
        )
        rows, sums = _summed_rows(g, cache)
        ref = g.coalesce()
        torch.testing.assert_close(rows, ref.indices()[0], rtol=0, atol=0)
        torch.testing.assert_close(sums, ref.values())
    assert cache.sorts == 3  # a, then b, then a again: the equal copy of a reused the first


def test_a_runs_row_optimizers_share_one_sort_cache_and_another_run_has_its_own():
    """No state shared between runs' optimizers (issue #81: a module-level cache was): the row optimizers of one
    ``build_optimizers`` share one cache (the embeddings' and the first-order tables' equal ids sorted once a step),
    those of another model get another."""
    from ctrkit.models.registry import create_model, make_config
    from ctrkit.train.optim import SparseRowOptimizer, build_optimizers

    def caches():
        shape = {"num_numerical": 2, "cardinalities": (30, 40), "embedding_dim": 4, "bottom_mlp": (8, 4),
                 "top_mlp": (8, 1)}  # fmt: skip
        model = create_model("dlrm", make_config("dlrm", shape))
        opts = build_optimizers(model, "adam", 1e-3, "adam", 1e-2, "adagrad", 1e-2)
        return {id(o.sort_cache): o.sort_cache for o in opts if isinstance(o, SparseRowOptimizer)}

    one, two = caches(), caches()
    assert len(one) == 1 and len(two) == 1 and set(one).isdisjoint(two)


def test_sums_on_one_thread_where_idle_threads_sleep(monkeypatch):
    """Where OpenMP's idle threads sleep (OMP_WAIT_POLICY=passive, no GOMP_SPINCOUNT), the duplicate-id sum
    runs on one thread, and gives the same rows and sums, bit for bit, as on every thread; the thread count
    is back afterwards, also after an error. With spinning threads or off the CPU nothing changes."""
    from ctrkit import device
    from ctrkit.train import optim

    if torch.get_num_threads() < 2:
        pytest.skip("needs at least 2 torch threads")
    threads = torch.get_num_threads()
    gen = torch.Generator().manual_seed(2)
    ids = torch.randint(0, 40_000, (60_000,), generator=gen)  # above ATen's grain: parallel on every thread
    g = torch.sparse_coo_tensor(
        ids.unsqueeze(0), torch.randn(60_000, 4, generator=gen), (40_000, 4), check_invariants=True
    )
    seen = []
    sort = optim.SortCache.sorted_ids

    def spy(*args):
        seen.append(torch.get_num_threads())
        return sort(*args)

    monkeypatch.setattr(optim.SortCache, "sorted_ids", spy)
    results = {}
    for policy, spin in (("PASSIVE", None), ("PASSIVE", "3000"), ("ACTIVE", None), (None, None)):
        for name, value in (("OMP_WAIT_POLICY", policy), ("GOMP_SPINCOUNT", spin)):
            if value is None:
                monkeypatch.delenv(name, raising=False)
            else:
                monkeypatch.setenv(name, value)
        results[(policy, spin)] = optim._summed_rows(g, optim.SortCache())
        assert torch.get_num_threads() == threads
    assert seen == [1, threads, threads, threads]
    for rows, sums in list(results.values())[1:]:
        assert torch.equal(rows, results[("PASSIVE", None)][0]) and torch.equal(sums, results[("PASSIVE", None)][1])
    monkeypatch.setenv("OMP_WAIT_POLICY", "passive")
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    with device.one_thread_where_threads_sleep(torch.device("meta")):
        assert torch.get_num_threads() == threads
    with pytest.raises(RuntimeError, match="inside"):
        with device.one_thread_where_threads_sleep(torch.device("cpu")):
            assert torch.get_num_threads() == 1
            raise RuntimeError("inside")
    assert torch.get_num_threads() == threads


@pytest.mark.skipif(native.library() is None, reason="no C compiler: the native kernels are not built")
@pytest.mark.parametrize("num_rows", [1, 5, 2048, 2049, 2_600_000, 2**31 + 7])
def test_native_id_sort_equals_torchs_stable_sort(num_rows):
    """The radix sort of a table's ids (digits of 11 bits: tables of one digit, just over one, several) gives
    torch.sort's stable permutation, the distinct ids and where each one's run starts; ids outside the table
    leave it to torch's sort (None)."""
    from ctrkit.train import optim

    gen = torch.Generator().manual_seed(num_rows % 1000)
    ids = (torch.rand(20_000, generator=gen) ** 3 * num_rows).long()  # skewed: long runs of hot ids
    ids[:3] = torch.tensor([0, num_rows - 1, num_rows - 1])
    got = optim._native_sort(ids, num_rows)
    ordered, order = torch.sort(ids, stable=True)
    rows, counts = torch.unique_consecutive(ordered, return_counts=True)
    for a, b in zip(got, (order, rows, torch.cumsum(counts, 0) - counts)):
        assert a.dtype == torch.int64 and torch.equal(a, b)
    assert optim._native_sort(torch.tensor([0, num_rows]), num_rows) is None
    assert optim._native_sort(torch.tensor([-1, 0]), num_rows) is None


@pytest.mark.skipif(native.library() is None, reason="no C compiler: the native kernels are not built")
@pytest.mark.parametrize("kind", ["adam", "adagrad"])
@pytest.mark.parametrize("dim", [16, 1, 5])
def test_native_row_update_equals_the_fused_one_at_any_thread_count(kind, dim):
    """ctrkit/native/rows.c against _summed_rows + torch's fused kernel over the gathered rows: 60,000 power-law
    ids of a 100,000-row table (many repeats; about 40,000 distinct, so the kernel runs on several threads: below
    32,768 values it takes one), 3 steps, uncoalesced and coalesced gradients; the same bits at 1 and 3 threads;
    rows not looked up untouched; the table's version counter moves as for an in-place update."""
    from ctrkit.train.optim import SparseRowOptimizer

    g = torch.Generator().manual_seed(dim)
    steps = [(torch.rand(60_000, generator=g) ** 2 * 100_000).long() for _ in range(3)]
    grads = [torch.randn(60_000, dim, generator=g) for _ in range(3)]

    def run(native_kernels, coalesce=False, threads=2):
        table = torch.nn.Parameter(torch.randn(100_000, dim, generator=torch.Generator().manual_seed(0)))
        opt = SparseRowOptimizer([table], kind, lr=0.01)
        opt.native_on_cpu = native_kernels
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            for ids, values in zip(steps, grads):
                grad = torch.sparse_coo_tensor(ids.unsqueeze(0), values, table.shape, check_invariants=True)
                table.grad = grad.coalesce() if coalesce else grad
                version = table._version
                opt.step()
                assert table._version > version
        finally:
            torch.set_num_threads(before)
        return table.detach(), opt.state[table]

    (ref, ref_state), (got, got_state) = run(False), run(True)
    torch.testing.assert_close(got, ref, rtol=1e-6, atol=1e-6)
    for key in ref_state:
        if isinstance(ref_state[key], torch.Tensor):
            torch.testing.assert_close(got_state[key], ref_state[key], rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(run(True, coalesce=True)[0], got, rtol=1e-6, atol=1e-6)
    assert torch.equal(run(True, threads=1)[0], got) and torch.equal(run(True, threads=3)[0], got)
    untouched = torch.ones(100_000, dtype=torch.bool)
    untouched[torch.cat(steps)] = False
    start = torch.randn(100_000, dim, generator=torch.Generator().manual_seed(0))
    assert untouched.any() and torch.equal(got[untouched], start[untouched])
    assert not torch.equal(got[~untouched], start[~untouched])


@pytest.mark.skipif(native.library() is None, reason="no C compiler: the native kernels are not built")
def test_native_row_update_refuses_ids_outside_the_table():
    """The C kernel writes rows through pointers: ids past the table are refused before it runs, the table intact."""
    from ctrkit.train.optim import SparseRowOptimizer

    table = torch.nn.Parameter(torch.zeros(10, 4))
    opt = SparseRowOptimizer([table], "adam", lr=0.1)
    table.grad = torch.sparse_coo_tensor(torch.tensor([[3, 12]]), torch.ones(2, 4), (10, 4), check_invariants=False)
    with pytest.raises(IndexError, match="outside a table of 10 rows"):
        opt.step()
    assert torch.equal(table.detach(), torch.zeros(10, 4))


@pytest.mark.skipif(native.library() is None, reason="no C compiler: the native kernels are not built")
def test_native_sgd_equals_scatter_add_bit_for_bit_at_any_thread_count():
    """SparseSGD's C row update (ctrkit/native/rows.c, straight from the uncoalesced gradient) against its ATen
    path (scaled values, scatter_add_): 4,000 power-law ids of a 3,000-row table (many repeats), 3 steps; the same
    bits, at 1, 2 and 3 threads; rows not looked up untouched; the version counter moves."""
    g = torch.Generator().manual_seed(11)
    steps = [((torch.rand(4000, generator=g) ** 3) * 3000).long() for _ in range(3)]
    grads = [torch.randn(4000, 16, generator=g) for _ in range(3)]

    def run(native_kernels, threads=2):
        table = torch.nn.Parameter(torch.randn(3000, 16, generator=torch.Generator().manual_seed(0)))
        opt = SparseSGD([table], lr=0.3)
        opt.native_on_cpu = native_kernels
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            for ids, values in zip(steps, grads):
                table.grad = torch.sparse_coo_tensor(
                    ids.unsqueeze(0), values.clone(), table.shape, check_invariants=True
                )
                version = table._version
                opt.step()
                assert table._version > version
        finally:
            torch.set_num_threads(before)
        return table.detach()

    ref = run(False)
    for threads in (1, 2, 3):
        assert torch.equal(run(True, threads), ref)
    start = torch.randn(3000, 16, generator=torch.Generator().manual_seed(0))
    touched = torch.zeros(3000, dtype=torch.bool)
    touched[torch.cat(steps)] = True
    assert (~touched).any() and torch.equal(ref[~touched], start[~touched])
    assert not torch.equal(ref[touched], start[touched])


@pytest.mark.skipif(native.library() is None, reason="no C compiler: the native kernels are not built")
def test_native_sgd_refuses_ids_outside_the_table():
    table = torch.nn.Parameter(torch.zeros(10, 4))
    opt = SparseSGD([table], lr=0.1)
    for bad in (12, -1):
        ids = torch.tensor([[3, bad]])
        table.grad = torch.sparse_coo_tensor(ids, torch.ones(2, 4), (10, 4), check_invariants=False)
        with pytest.raises(IndexError, match="outside a table of 10 rows"):
            opt.step()
        assert torch.equal(table.detach(), torch.zeros(10, 4))  # counted before any write
