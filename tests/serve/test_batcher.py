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


def test_a_dead_loop_answers_the_requests_it_held():
    """A batching loop that dies of a bug outside the model call (here: arrays it cannot measure) answers the request
    it had taken off the queue, and the ones queued behind it, instead of leaving them waiting for ever."""

    async def run():
        batcher = Batcher(Echo(), window_ms=50.0, max_batch_size=1000)
        batcher.start()
        held = asyncio.ensure_future(batcher.score(None, None))  # len(None): the loop's own step fails
        await asyncio.sleep(0)
        behind = asyncio.ensure_future(batcher.score(np.zeros((1, 2), np.float32), np.zeros((1, 1), np.int64)))
        done, pending = await asyncio.wait([held, behind], timeout=5)
        for f in pending:
            f.cancel()
        alive = batcher.alive
        await batcher.stop()
        return [f.exception() if f in done else None for f in (held, behind)], alive

    errors, alive = asyncio.run(run())
    assert not alive
    assert all(isinstance(e, RuntimeError) and "batching loop has stopped" in str(e) for e in errors), errors
