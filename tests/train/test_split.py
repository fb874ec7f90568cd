"""The training step split over threads (ctrkit/thread_split.py) against the unsplit step."""

import subprocess
import sys
import threading

import pytest
import torch
import torch.nn.functional as F

from ctrkit import thread_split as split
from ctrkit.data.batch import Batch, MultiHot, PaddedMultiHot
from ctrkit.models.registry import create_model, make_config
from ctrkit.train.optim import build_optimizers
from ctrkit.train.step import TrainStep

CPU = torch.device("cpu")


def test_slices_cover_the_batch_in_order():
    assert split.slices(10, 3) == [slice(0, 3), slice(3, 6), slice(6, 10)]
    assert split.slices(2, 2) == [slice(0, 1), slice(1, 2)]


def test_assign_deals_the_largest_first_to_the_least_loaded():
    assert split.assign([1.0, 5.0, 3.0, 3.0], 2) == [[0, 1], [2, 3]]  # 5 | 3, 3 | 5 + 1
    assert split.assign([2.0, 2.0], 3) == [[0], [1], []]


def test_assign_puts_the_row_producers_first_largest_first():
    """The optimizers that hand rows over run before the others on their worker, the costliest first, so the rows
    are ready early; the dealing itself is unchanged."""
    costs, producers = [1.0, 0.5, 3.0, 2.0, 4.0], [False, True, False, True, True]
    assert split.assign(costs, 2) == [[0, 1, 4], [2, 3]]  # 4 + 1 + 0.5 | 3 + 2
    assert split.assign(costs, 2, first=producers) == [[4, 1, 0], [3, 2]]


def test_sparse_gradients_concatenate_in_slice_order_as_the_whole_batch_gives_them():
    torch.manual_seed(0)
    table = torch.nn.Parameter(torch.randn(9, 3))
    ids = torch.tensor([4, 1, 4, 8, 0, 1])
    head = torch.randn(3)

    def grad(part):
        return torch.autograd.grad((F.embedding(part, table, sparse=True) @ head).pow(2).sum(), table)[0]

    whole = grad(ids)
    joined = split.sum_gradients([grad(ids[:2]), None, grad(ids[2:])])
    assert torch.equal(joined._indices(), whole._indices())
    torch.testing.assert_close(joined._values(), whole._values())  # products over fewer rows: rounding only
    dense = [torch.full((2,), 1.0), torch.full((2,), 2.0), torch.full((2,), 4.0)]
    assert torch.equal(split.sum_gradients(dense), torch.full((2,), 7.0))
    assert split.sum_gradients([None, None]) is None


def test_multi_hot_rows_hold_each_sample_s_bags():
    # 2 features x 4 samples, feature-major bags; bag f * 4 + b
    bags = [[1], [], [2, 3], [4], [5, 6, 7], [8], [], [9]]
    offsets = torch.tensor([0] + [sum(len(b) for b in bags[: i + 1]) for i in range(len(bags))])
    mh = MultiHot(torch.tensor([i for b in bags for i in b]), offsets, 2)
    part = mh.rows(1, 3, 4)  # samples 1 and 2
    got = [part.ids[part.offsets[i] : part.offsets[i + 1]].tolist() for i in range(4)]
    assert got == [bags[1], bags[2], bags[5], bags[6]]
    padded = PaddedMultiHot(torch.arange(8).view(4, 2, 1))
    batch = Batch(torch.zeros(4, 1), torch.arange(8).view(4, 2), torch.ones(4), padded)
    assert batch.rows(slice(2, 4)).multi_hot.ids.flatten().tolist() == [4, 5, 6, 7]
    assert batch.rows(slice(2, 4)).categorical.tolist() == [[4, 5], [6, 7]]


def test_workers_run_one_intra_op_thread_and_the_caller_keeps_its_count(two_threads):
    team = split.ThreadTeam(2)
    counts = team.run([torch.get_num_threads, torch.get_num_threads])
    assert counts == [1, 1]
    assert torch.get_num_threads() == 2
    names = team.run([lambda: threading.current_thread().name] * 2)
    assert names == ["ctrkit-step-0", "ctrkit-step-1"]


def test_a_worker_s_exception_is_raised_in_the_caller(two_threads):
    team = split.ThreadTeam(2)

    def fail():
        raise IndexError("row 99 outside the table")

    with pytest.raises(IndexError, match="row 99"):
        team.run([lambda: 1, fail])
    assert team.run([lambda: 2, lambda: 3]) == [2, 3]  # the team still works
    with pytest.raises(ValueError, match="3 jobs for a team of 2 threads"):
        team.run([lambda: 4] * 3)


def _model(name: str, dropout: float = 0.0, multi_hot: bool = False):
    shape = {"num_numerical": 4, "cardinalities": (50, 30, 20), "embedding_dim": 8}
    if name == "dlrm":
        shape.update(bottom_mlp=(16, 8), top_mlp=(16, 1))
    elif name == "dcnv2":
        shape.update(bottom_mlp=(16, 8), top_mlp=(16, 1), cross_layers=2, cross_projection_dim=8)
    else:
        shape.update(deep_mlp=(16, 16), dropout=dropout)
    if multi_hot:
        shape.update(multi_hot_cardinalities=(40,), multi_hot_combiners=("sum",))
    return create_model(name, make_config(name, shape))


def _batches(n: int, size: int, multi_hot: bool = False, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        cat = torch.stack([torch.randint(0, c, (size,), generator=g) for c in (50, 30, 20)], 1)
        mh = None
        if multi_hot:
            lengths = torch.randint(0, 4, (size,), generator=g)
            offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
            mh = MultiHot(torch.randint(0, 40, (int(lengths.sum()),), generator=g), offsets, 1)
        out.append(Batch(torch.randn(size, 4, generator=g), cat, torch.randint(0, 2, (size,), generator=g).float(), mh))
    return out


def _train(name, mode, opt="sgd", steps=4, size=64, amp=None, dropout=0.0, multi_hot=False, **penalties):
    torch.manual_seed(0)
    model = _model(name, dropout, multi_hot)
    step = TrainStep(model, build_optimizers(model, opt, 0.05, opt, 0.05, "sgd", 0.05), CPU, amp, split=mode,
                     **penalties)  # fmt: skip
    calls = []
    original = split.ThreadTeam.run

    def counted(team, jobs):
        calls.append(len(jobs))
        return original(team, jobs)

    split.ThreadTeam.run = counted
    try:
        losses = [step(b).item() for b in _batches(steps, size, multi_hot)]
    finally:
        split.ThreadTeam.run = original
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}, calls


@pytest.mark.parametrize("name, opt", [("dlrm", "sgd"), ("dcnv2", "sgd"), ("wide_deep", "sgd"), ("dlrm", "adagrad")])
def test_the_split_step_is_the_unsplit_step(two_threads, name, opt):
    whole, w, calls = _train(name, "off", opt)
    assert calls == []
    parts, p, calls = _train(name, "on", opt)
    assert calls and calls[0] == 2  # the batch ran as two slices
    torch.testing.assert_close(parts, whole, rtol=1e-5, atol=1e-6)
    for k in w:
        torch.testing.assert_close(p[k], w[k], rtol=1e-4, atol=1e-5, msg=k)
    start = _train(name, "off", opt, steps=0)[1]
    assert any(not torch.equal(p[k], start[k]) for k in p)  # it trained


def test_the_split_step_with_multi_hot_features_and_penalties(two_threads):
    kw = dict(multi_hot=True, embedding_l2=1e-2, weight_decay=1e-2)
    whole, w, _ = _train("dlrm", "off", **kw)
    parts, p, calls = _train("dlrm", "on", **kw)
    assert calls
    torch.testing.assert_close(parts, whole, rtol=1e-5, atol=1e-6)
    for k in w:
        torch.testing.assert_close(p[k], w[k], rtol=1e-4, atol=1e-5, msg=k)


def test_split_steps_with_dropout_are_reproducible(two_threads):
    a = _train("wide_deep", "on", dropout=0.3)
    b = _train("wide_deep", "on", dropout=0.3)
    assert a[0] == b[0]
    assert all(torch.equal(a[1][k], b[1][k]) for k in a[1])
    unsplit = _train("wide_deep", "off", dropout=0.3)
    assert unsplit[0] != a[0]  # other masks: each slice draws its own


def test_the_split_step_under_bf16_autocast(two_threads):
    whole, _, _ = _train("dlrm", "off", amp=torch.bfloat16)
    parts, _, calls = _train("dlrm", "on", amp=torch.bfloat16)
    assert calls
    torch.testing.assert_close(parts, whole, rtol=2e-2, atol=2e-2)


def test_auto_splits_only_batches_of_enough_samples_a_thread(two_threads):
    assert _train("dlrm", "auto", size=2 * split.MIN_ROWS - 2, steps=1)[2] == []
    assert _train("dlrm", "auto", size=2 * split.MIN_ROWS, steps=1)[2] == [2, 2]


def test_on_is_refused_where_the_step_cannot_split(two_threads):
    model = _model("dlrm")
    opts = build_optimizers(model, "sgd", 0.1, "sgd", 0.1, "sgd", 0.1)
    with pytest.raises(ValueError, match="cannot split the batch over threads: the model is compiled"):
        TrainStep(model, opts, CPU, compile=True, split="on")
    with pytest.raises(ValueError, match="cannot split the batch over threads: the device is meta, not the CPU"):
        TrainStep(model, opts, torch.device("meta"), split="on")
    assert TrainStep(model, opts, torch.device("meta")).split_threads == 1  # auto: GPUs take the unsplit step
    with pytest.raises(ValueError, match="expected auto, on or off"):
        TrainStep(model, opts, CPU, split="yes")
    torch.set_num_threads(1)
    with pytest.raises(ValueError, match="torch runs one thread"):
        TrainStep(model, opts, CPU, split="on")
    assert TrainStep(model, opts, CPU, split="auto").split_threads == 1


@pytest.mark.parametrize("kind", ["adam", "adagrad"])
def test_deferred_row_updates_run_in_any_parts_equal_the_step(kind):
    from ctrkit import native
    from ctrkit.train.optim import SparseRowOptimizer

    if native.library() is None:
        pytest.skip("no C compiler: the tables' steps have no row updates to defer")
    g = torch.Generator().manual_seed(0)
    ids, values = torch.randint(0, 500, (3000,), generator=g), torch.randn(3000, 8, generator=g)
    start = torch.randn(500, 8, generator=g)

    def run(parts: int | None) -> torch.Tensor:
        table = torch.nn.Parameter(start.clone())
        opt = SparseRowOptimizer([table], kind, 0.1)
        for _ in range(2):
            table.grad = torch.sparse_coo_tensor(ids.view(1, -1), values, table.shape, check_invariants=False)
            if parts is None:
                opt.step()
                continue
            before = table.detach().clone()
            updates = opt.step_deferring_rows()
            assert len(updates) == 1 and torch.equal(table.detach(), before)  # returned, not run
            for part in reversed(range(parts)):
                updates[0](part, parts)
        return table.detach()

    whole = run(None)
    assert not torch.equal(whole, start)
    for parts in (2, 3, 7):
        assert torch.equal(run(parts), whole)


def test_a_resumed_split_run_with_dropout_equals_the_uninterrupted_one(tiny_dataset, tmp_path, two_threads):
    from ctrkit.checkpoint import load_checkpoint
    from ctrkit.config import TrainConfig
    from ctrkit.data.dataset import SplitBinaryDataset
    from ctrkit.data.feature_spec import FeatureSpec
    from ctrkit.train.trainer import Placement, RunInfo, RunOutputs, TrainData, Trainer
    from tests.conftest import trainer_of

    spec = FeatureSpec.from_yaml(tiny_dataset)
    shape = dict(num_numerical=len(spec.numerical_features), cardinalities=tuple(spec.cardinalities),
                 embedding_dim=8, deep_mlp=(32, 32), dropout=0.3)  # fmt: skip
    cfg = TrainConfig(batch_size=512, max_steps=12, evals_per_epoch=0, seed=3, split_batch="on")

    def build(run: TrainConfig, save=None) -> Trainer:
        torch.manual_seed(run.seed)
        model_cfg = make_config("wide_deep", shape)
        model = create_model("wide_deep", model_cfg)
        train, test = SplitBinaryDataset(spec, "train"), SplitBinaryDataset(spec, "test")
        info = RunInfo("wide_deep", model_cfg, spec.summary())
        return trainer_of(model, info, TrainData(train, test), run, Placement(CPU), RunOutputs(save, progress=False))

    straight = build(cfg)
    straight.fit()
    assert straight.step_fn.split_threads == 2
    build(TrainConfig(**{**cfg.to_dict(), "max_steps": 5}), save=tmp_path / "mid.pt").fit()
    resumed = build(cfg)
    resumed.store.restore(load_checkpoint(tmp_path / "mid.pt"))
    resumed.fit()
    for k, v in straight.model.state_dict().items():
        torch.testing.assert_close(resumed.model.state_dict()[k], v, rtol=0, atol=0, msg=k)


def test_summed_dense_gradients_take_their_parameters_layout():
    """A slice's dense gradient in another layout (a transposed product) comes back in the parameter's, as
    backward() stores it: torch's fused Adam steps a transposed gradient wrongly, and the split step's sums go to
    it straight."""
    param = torch.nn.Parameter(torch.randn(4, 3))
    parts = [torch.randn(3, 4).t(), None, torch.randn(3, 4).t()]
    total = split.sum_gradients(parts, param)
    assert total.stride() == param.stride() and torch.equal(total, parts[0] + parts[2])
    one = split.sum_gradients([parts[0]], param)
    assert one.stride() == param.stride() and torch.equal(one, parts[0])
    stepped = []
    for grad in (one, parts[0].contiguous()):
        p = torch.nn.Parameter(param.detach().clone())
        p.grad = grad
        torch.optim.Adam([p], lr=0.1, fused=True).step()
        stepped.append(p.detach())
    assert torch.equal(*stepped)


def test_row_pieces_are_taken_by_whichever_worker_is_free(two_threads):
    """The tables' row updates go to the workers in pieces as the optimizers hand them over: a worker whose own
    optimizers are done waits for the others' updates and takes their pieces; every piece runs once; after a failure
    no further piece starts."""
    team = split.ThreadTeam(2)
    rows = split.RowWork(producers=2, parts=4)
    ran, lock = [], threading.Lock()

    def update(name):
        def run(part, parts):
            with lock:
                ran.append((name, part, parts, threading.current_thread().name))

        return run

    slow_done = threading.Event()

    def fast_worker():  # no optimizer of its own that defers rows: straight to the pieces
        rows.work()

    def slow_worker():
        rows.add([update("first-order")])
        slow_done.wait(5)  # the other worker takes pieces meanwhile
        rows.add([update("tables")])
        rows.work()

    threading.Timer(0.2, slow_done.set).start()
    team.run([fast_worker, slow_worker])
    assert sorted(r[:3] for r in ran) == [(n, k, 4) for n in ("first-order", "tables") for k in range(4)]
    assert {r[3] for r in ran if r[0] == "first-order"} == {"ctrkit-step-0"}  # taken while the other one waited
    failed = split.RowWork(producers=2, parts=2)  # one producer fails before handing over: nobody waits for it
    failed.add([update("never")])
    failed.fail()
    failed.work()
    assert not [r for r in ran if r[0] == "never"]


def test_a_failing_optimizer_in_the_split_step_is_raised_and_nothing_hangs(two_threads):
    model = _model("dlrm")
    opts = build_optimizers(model, "adagrad", 0.05, "adagrad", 0.05, "sgd", 0.05)
    step = TrainStep(model, opts, CPU, split="on")
    table_opt = next(o for o in opts if getattr(o, "is_table_optimizer", False) and not o.is_wide)

    def broken():
        raise IndexError("row 99 outside the table")

    table_opt.step_deferring_rows = broken
    batch = _batches(1, 64)[0]
    raised = []

    def run():
        try:
            step(batch)
        except IndexError as e:
            raised.append(e)

    caller = threading.Thread(target=run, daemon=True)  # a hang fails the test instead of stalling the suite
    caller.start()
    caller.join(60)
    assert not caller.is_alive() and len(raised) == 1 and "row 99" in str(raised[0])
    del table_opt.step_deferring_rows
    assert torch.isfinite(step(batch))  # the team and the step still work


def test_the_workers_end_before_the_interpreter_finalizes():
    """A process that used a team exits with its workers ended (joined at exit, not left as daemon threads for the
    interpreter to kill inside torch's C++, which aborts the process). The probe is an exit handler registered
    before the team's, so it runs after it."""
    code = (
        "import atexit, threading, sys\n"
        "import torch\n"
        "torch.set_num_threads(2)\n"
        "names = lambda: sorted(t.name for t in threading.enumerate() if t.name.startswith('ctrkit-'))\n"
        "atexit.register(lambda: print(names()))\n"
        "from ctrkit import thread_split\n"
        "team = thread_split.team(2)\n"
        "print(team.run([lambda: torch.ones(3).sum().item(), lambda: torch.ones(4).sum().item()]))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[:2] == ["[3.0, 4.0]", "[]"]
