"""Dynamic batching: concurrent requests share model calls and each gets its own rows back."""

import asyncio

import numpy as np

from ctrkit.serve.batcher import Batcher


class Echo:
    """A stand-in model with the Predictor call signature: returns each row's first numerical value."""

    def __call__(self, numerical, categorical):
        return numerical[:, :1].copy()


def test_concurrent_requests_share_model_calls():
    async def run():
        batcher = Batcher(Echo(), window_ms=50.0, max_batch_size=1000)
        batcher.start()
        requests = [np.full((i % 3 + 1, 2), float(i), np.float32) for i in range(40)]
        results = await asyncio.gather(*(batcher.score(r, np.zeros((len(r), 1), np.int64)) for r in requests))
        await batcher.stop()
        return requests, results, batcher.calls

    requests, results, calls = asyncio.run(run())
    for r, got in zip(requests, results):
        np.testing.assert_array_equal(got[:, 0], r[:, 0])  # every request gets exactly its own rows
    assert calls < 5  # 40 requests within one 50 ms window: a handful of model calls, not 40


def test_max_batch_size_splits_the_queue():
    async def run():
        batcher = Batcher(Echo(), window_ms=50.0, max_batch_size=4)
        batcher.start()
        requests = [np.full((2, 1), float(i), np.float32) for i in range(10)]
        results = await asyncio.gather(*(batcher.score(r, np.zeros((2, 1), np.int64)) for r in requests))
        await batcher.stop()
        return results, batcher.calls

    results, calls = asyncio.run(run())
    assert [float(r[0, 0]) for r in results] == [float(i) for i in range(10)]
    assert calls == 5  # 2 requests of 2 rows fill a batch of 4


class BagSums:
    """A stand-in multi-hot model: each row's sum of its non-padding ids, and the batch's bag length."""

    def __call__(self, numerical, categorical, multi_hot):
        total = np.where(multi_hot >= 0, multi_hot, 0).sum((1, 2))
        return np.stack([total, np.full(len(total), multi_hot.shape[2])], 1).astype(np.float32)


def test_multi_hot_requests_of_different_bag_lengths_are_padded_together():
    async def run():
        batcher = Batcher(BagSums(), window_ms=50.0, max_batch_size=1000)
        batcher.start()
        bags = [np.arange(2 * 2 * (i + 1)).reshape(2, 2, i + 1) for i in range(4)]  # bag lengths 1..4
        results = await asyncio.gather(
            *(batcher.score(np.zeros((2, 1), np.float32), np.zeros((2, 1), np.int64), b) for b in bags)
        )
        await batcher.stop()
        return bags, results, batcher.calls

    bags, results, calls = asyncio.run(run())
    assert calls == 1
    for b, got in zip(bags, results):
        np.testing.assert_array_equal(got[:, 0], b.sum((1, 2)))  # -1 padding added nothing
        assert (got[:, 1] == 4).all()  # one batch, padded to the longest bag


def test_a_dead_loop_answers_the_requests_it_held(monkeypatch):
    """A batching loop that dies of a bug outside the model call (here: in its batch assembly) answers the requests it
    had taken off the queue, and the ones queued behind them, instead of leaving them waiting for ever."""
    from ctrkit.serve import batcher as batcher_module

    def broken(items, item):
        raise TypeError("a bug in the batch assembly")

    monkeypatch.setattr(batcher_module, "_fits", broken)

    async def run():
        batcher = Batcher(Echo(), window_ms=200.0, max_batch_size=1000)
        batcher.start()
        one = lambda: batcher.score(np.zeros((1, 2), np.float32), np.zeros((1, 1), np.int64))  # noqa: E731
        first = asyncio.ensure_future(one())  # taken off the queue first
        await asyncio.sleep(0.01)
        second = asyncio.ensure_future(one())  # taken while the first waits for company: the assembly dies
        done, pending = await asyncio.wait([first, second], timeout=5)
        for f in pending:
            f.cancel()
        alive = batcher.alive
        await batcher.stop()
        return [f.exception() if f in done else None for f in (first, second)], alive

    errors, alive = asyncio.run(run())
    assert not alive
    assert all(isinstance(e, RuntimeError) and "batching loop has stopped" in str(e) for e in errors), errors


def test_a_large_request_never_holds_a_small_one_for_its_whole_model_call():
    """A request of more than call_rows rows is scored in calls of call_rows rows, and a small request that arrives
    meanwhile goes before its remaining parts; each request still gets exactly its own rows, in order."""
    calls = []

    class Recording(Echo):
        def __call__(self, numerical, categorical):
            calls.append(len(numerical))
            return super().__call__(numerical, categorical)

    async def run():
        batcher = Batcher(Recording(), window_ms=0.0, max_batch_size=1000, call_rows=10)
        batcher.start()
        big = np.arange(95, dtype=np.float32).reshape(-1, 1).repeat(2, 1)
        small = np.full((1, 2), -7.0, np.float32)
        large = asyncio.ensure_future(batcher.score(big, np.zeros((95, 1), np.int64)))
        await asyncio.sleep(0)
        got_small = await batcher.score(small, np.zeros((1, 1), np.int64))
        small_done, got_large = len(calls), await large
        await batcher.stop()
        return got_large, got_small, small_done

    got_large, got_small, small_done = asyncio.run(run())
    np.testing.assert_array_equal(got_large[:, 0], np.arange(95, dtype=np.float32))
    assert got_small[0, 0] == -7.0
    assert max(calls) <= 10 and sum(calls) == 96  # parts of at most 10 rows
    assert small_done < len(calls)  # answered before the large request's last part was scored
