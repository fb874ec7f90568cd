"""The sharding planner: placement rules and balance."""

import pytest

from ctrkit.distributed.planner import plan_sharding


def test_table_wise_balances_memory_largest_first():
    plan = plan_sharding([1000, 10, 900, 50, 80], dim=4, world_size=2)
    assert set(plan.strategy) == {"table"}
    assert {s.feature: s.rank for s in plan.shards} == {0: 0, 2: 1, 4: 1, 3: 1, 1: 0}  # 10 goes to the lighter rank 0
    assert plan.memory_bytes(0) == (1000 + 10) * 4 * 4 and plan.memory_bytes(1) == (900 + 80 + 50) * 4 * 4


def test_auto_splits_wide_tables_by_columns_and_large_ones_by_rows():
    plan = plan_sharding([100, 5000, 20], dim=16, world_size=3, column_split_dim=8, row_budget_bytes=100 * 16 * 4)
    assert plan.strategy == ("column", "row", "column")
    rows = sorted((s.row_lo, s.row_hi, s.rank) for s in plan.shards if s.feature == 1)
    assert rows == [(0, 1666, 0), (1666, 3333, 1), (3333, 5000, 2)]  # every row exactly once
    cols = sorted((s.col_lo, s.col_hi) for s in plan.shards if s.feature == 0)
    assert cols == [(0, 8), (8, 16)]
    assert "table   1 (5,000 x 16) row-wise" in plan.describe()


def test_bad_requests_are_refused():
    with pytest.raises(ValueError, match="sharding strategy must be one of"):
        plan_sharding([10], 4, 2, "diagonal")
    with pytest.raises(ValueError, match="column-wise sharding needs dim >= world size"):
        plan_sharding([10], 2, 4, "column")


def test_deferred_tables_draw_any_shard_as_the_whole_table_holds_it():
    """A rank that builds only its shards (tables deferred on the meta device) starts from exactly the
    rows and columns the single-process model's tables hold, for row and column splits alike."""
    import torch

    from ctrkit.distributed.planner import Shard
    from ctrkit.distributed.sharded_embeddings import ShardedEmbeddingCollection
    from ctrkit.models.embeddings import EmbeddingCollection
    from ctrkit.models.storage import DEFERRED

    cards = (3, 2 * 65_536 + 77, 1000)
    torch.manual_seed(5)
    whole = EmbeddingCollection(cards, 8)
    after_whole = torch.rand(1)
    torch.manual_seed(5)
    deferred = EmbeddingCollection(cards, 8, storage=DEFERRED)
    assert deferred.weight.is_meta and torch.equal(torch.rand(1), after_whole)  # the same RNG use
    for s in [Shard(1, 0, 0, 5, 0, 8), Shard(1, 1, 65_536 - 3, 2 * 65_536 + 77, 0, 8),
              Shard(0, 0, 0, 3, 2, 6), Shard(2, 1, 10, 900, 4, 8)]:  # fmt: skip
        got = ShardedEmbeddingCollection._initial(deferred, s)
        assert torch.equal(got, whole.table(s.feature)[s.row_lo : s.row_hi, s.col_lo : s.col_hi]), s
    bound = 1 / cards[1] ** 0.5
    assert whole.table(1).abs().max() <= bound and whole.table(1).std() > bound / 3  # U(-b, b), not zeros


def test_the_default_row_budget_is_a_share_of_the_ranks_memory(monkeypatch):
    import os

    import torch

    from ctrkit.distributed.env import DistEnv
    from ctrkit.distributed.hybrid import ROW_BUDGET_FRACTION, default_row_budget

    host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    env = DistEnv(0, 4, 0, "gloo", torch.device("cpu"))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert default_row_budget(env) == int(host / 2 * ROW_BUDGET_FRACTION)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    budget = default_row_budget(env)
    assert budget == int(host / 4 * ROW_BUDGET_FRACTION)
    # a table over the budget is split by rows, one under it stays whole
    rows = budget // (16 * 4) + 1
    plan = plan_sharding([rows, 1000], 16, 4, "auto", row_budget_bytes=budget)
    assert plan.strategy == ("row", "table")


def test_a_redraw_of_the_shards_is_the_same_redraw_of_the_whole_tables():
    """reinit_embeddings redraws tables each epoch: every rank's shards after a redraw hold exactly the
    rows and columns of the single-process tables' redraw, and each draw differs from the others."""
    import torch

    from ctrkit.distributed.sharded_embeddings import ShardedEmbeddingCollection
    from ctrkit.models.embeddings import EmbeddingCollection

    cards = (3, 65_536 + 77, 1000)
    torch.manual_seed(5)
    whole = EmbeddingCollection(cards, 8)
    first = whole.weight.detach().clone()
    plans = [plan_sharding(cards, 8, 3, strategy) for strategy in ("row", "column", "table")]
    ranks = [ShardedEmbeddingCollection(whole, plan, r) for plan in plans for r in range(3)]
    whole.reset_tables(draw=2)
    second = whole.weight.detach().clone()
    whole.reset_tables(draw=2)
    assert torch.equal(whole.weight, second)  # a draw is a function of (seed, draw) alone
    assert not torch.equal(first, second)
    whole.reset_tables(draw=0)
    assert torch.equal(whole.weight, first)  # draw 0 is the initial table
    for rank in ranks:
        rank.reset_tables(draw=2)
        for s, w in zip(rank.local, rank.shards):
            off = sum(cards[: s.feature])
            want = second[off + s.row_lo : off + s.row_hi, s.col_lo : s.col_hi]
            assert torch.equal(w.detach(), want), s


def test_small_tables_are_replicated_on_every_rank_under_auto():
    plan = plan_sharding([10, 5000, 40], dim=8, world_size=3, replicate_below_bytes=40 * 8 * 4)
    assert plan.strategy == ("replicated", "table", "replicated")
    for f, card in ((0, 10), (2, 40)):
        assert sorted((s.rank, s.row_lo, s.row_hi, s.col_lo, s.col_hi) for s in plan.shards if s.feature == f) == [
            (r, 0, card, 0, 8) for r in range(3)
        ]
    # every rank holds the copies; only the large table is served to other ranks
    assert [plan.memory_bytes(r) for r in range(3)] == [(5000 + 50) * 32, 50 * 32, 50 * 32]
    assert [len(plan.exchanged_on_rank(r)) for r in range(3)] == [1, 0, 0]
    assert "table   0 (10 x 8) replicated: every rank" in plan.describe()
    # forced strategies and one rank never replicate
    assert "replicated" not in plan_sharding([10, 40], 8, 3, "table", replicate_below_bytes=10**6).strategy
    assert plan_sharding([10, 40], 8, 1, replicate_below_bytes=10**6).strategy == ("table", "table")


def test_optimizer_states_are_cut_for_another_placement():
    """Element states are copied where the regions overlap; a row-wise state (the mean of the squared
    gradient over a row's columns) becomes the column-weighted average, exact when the saved pieces split
    the target's columns; a replicated table saved by every rank counts once."""
    import torch

    from ctrkit.distributed.sharded_state import _cut

    gen = torch.Generator().manual_seed(0)
    whole_m, whole_v = torch.rand(6, 4, generator=gen), torch.rand(6, 4, generator=gen)
    squares = torch.rand(6, 4, generator=gen)  # per element: what a row-wise state averages
    # saved: rows 0-3 as two column blocks (1 and 3 wide), rows 3-6 whole, saved twice (a replica)
    pieces = []
    for lo, hi, c0, c1 in ((0, 3, 0, 1), (0, 3, 1, 4), (3, 6, 0, 4), (3, 6, 0, 4)):
        state = {"step": 5, "exp_avg": whole_m[lo:hi, c0:c1], "exp_avg_sq": whole_v[lo:hi, c0:c1],
                 "sum": squares[lo:hi, c0:c1].mean(1)}  # fmt: skip
        pieces.append((("t", lo, hi, c0, c1), state))
    pieces.append((("other", 0, 6, 0, 4), {"step": 9, "exp_avg": torch.zeros(6, 4)}))  # another table
    whole = _cut(("t", 0, 6, 0, 4), pieces)
    assert whole["step"] == 5
    torch.testing.assert_close(whole["exp_avg"], whole_m)
    torch.testing.assert_close(whole["exp_avg_sq"], whole_v)
    torch.testing.assert_close(whole["sum"], squares.mean(1))
    block = _cut(("t", 2, 5, 1, 3), pieces)  # rows 2-5, columns 1-3: from three saved pieces
    torch.testing.assert_close(block["exp_avg"], whole_m[2:5, 1:3])
    assert _cut(("t", 0, 6, 0, 4), [(("t", 0, 6, 0, 4), {})]) is None  # no state saved: none to resume
