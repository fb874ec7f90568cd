"""Dynamic batching: concurrent requests to one model joined into one forward pass, within bounds on padding; a request
of more than ``call_rows`` rows is scored in calls of that many, and requests of at most that many go before them, so
a one-row request never waits behind a large request's whole model call (docs/decisions/serving-stalls.md)."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ctrkit.serve.metrics import ServerMetrics
from ctrkit.serve.predictor import Predictor

log = logging.getLogger("ctrkit.serve")

PADDING_SLACK = 1 << 16  # padding elements always allowed in a batch
CALL_ROWS = 1024  # a larger request is scored in model calls of this many rows, requests of at most this many first


class Batcher:
    """Collects requests for a short window and scores them in one model call."""

    def __init__(
        self,
        predictor: Predictor,
        window_ms: float = 1.0,
        max_batch_size: int = 8192,
        metrics: ServerMetrics | None = None,
        key: tuple[str, str] = ("model", "1"),
        call_rows: int = CALL_ROWS,
    ):
        self.predictor = predictor
        self.metrics, self.key = metrics, key
        self.window = window_ms / 1e3
        self.max_batch_size = max_batch_size
        self.call_rows = max(1, min(call_rows, max_batch_size))
        # (0: a request of at most call_rows rows, 1: a part of a larger one; arrival order; the request)
        self.queue: asyncio.PriorityQueue | None = None
        self._order = itertools.count()
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="ctrkit-model")
        self.calls = 0
        self._busy = False  # a batch taken off the queue and not yet answered
        self._taken: list = []  # the requests taken off the queue and not yet answered (failed if the loop dies)
        self._task: asyncio.Task | None = None

    @property
    def _queue(self) -> asyncio.PriorityQueue:
        """The queue of a started batcher (``start``)."""
        if self.queue is None:
            raise RuntimeError("the batching loop has not started")
        return self.queue

    def start(self) -> None:
        self.queue = asyncio.PriorityQueue()
        self._task = asyncio.get_running_loop().create_task(self._loop())
        self._task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task) -> None:
        """The loop ended (stopped, or died of a bug): log why and fail every queued request."""
        if not task.cancelled() and task.exception() is not None:
            log.error("the batching loop stopped: %r; the server now answers 503", task.exception())
        left = list(self._taken)
        while self.queue is not None and not self.queue.empty():
            left.append(self.queue.get_nowait()[2])
        for _, fut, _ in left:
            if not fut.done():
                fut.set_exception(RuntimeError("the batching loop has stopped"))
        self._taken = []

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        self.pool.shutdown(wait=False)

    async def score(
        self, numerical: np.ndarray, categorical: np.ndarray, multi_hot: np.ndarray | None = None
    ) -> np.ndarray:
        if not self.alive:
            raise RuntimeError("the batching loop has stopped")
        loop, now = asyncio.get_running_loop(), time.monotonic()
        arrays = (numerical, categorical) + (() if multi_hot is None else (multi_hot,))
        rows = len(numerical)
        futures = []
        for a in range(0, max(rows, 1), self.call_rows):  # a large request: parts of call_rows rows, after the small
            futures.append(loop.create_future())
            part = arrays if rows <= self.call_rows else tuple(x[a : a + self.call_rows] for x in arrays)
            self._queue.put_nowait((int(rows > self.call_rows), next(self._order), (part, futures[-1], now)))
        if len(futures) == 1:
            return await futures[0]
        parts = await asyncio.gather(*futures, return_exceptions=True)  # (every part's exception retrieved)
        failed = next((p for p in parts if isinstance(p, BaseException)), None)
        if failed is not None:
            raise failed
        return np.concatenate([p for p in parts if not isinstance(p, BaseException)])

    async def drain(self) -> None:
        """Stops once every request already queued has been answered (a replaced or unloaded version)."""
        while self.queue is not None and (not self.queue.empty() or self._busy) and self.alive:
            await asyncio.sleep(0.005)
        await self.stop()

    @property
    def alive(self) -> bool:
        """The batching loop is running (readiness answers 503 once it is not)."""
        return self._task is not None and not self._task.done()

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            entry = await self._queue.get()
            self._busy = True
            first = entry[2]
            items = self._taken = [first]
            size = len(first[0][0])
            deadline = time.monotonic() + self.window
            while size < self.max_batch_size:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                try:
                    entry = await asyncio.wait_for(self._queue.get(), left)
                except asyncio.TimeoutError:
                    break
                item = entry[2]
                self._taken = [*items, item]
                rows = len(item[0][0])
                # a large request's part never makes a call longer than call_rows rows; padding never more than
                # doubles a multi-hot batch: such a request goes back to the queue, at its place, for the next call
                if (
                    (entry[0] and size + rows > self.call_rows)
                    or size + rows > self.max_batch_size
                    or not _fits(items, item)
                ):
                    self._queue.put_nowait(entry)
                    self._taken = items
                    break
                items.append(item)
                self._taken = items
                size += rows
            try:  # whatever fails (padding, the model) fails these requests, never the loop
                inputs = first[0] if len(items) == 1 else _concatenate([arrays for arrays, _, _ in items])
                began = time.monotonic()
                probs = await loop.run_in_executor(self.pool, self.predictor, *inputs)
                self.calls += 1
                if self.metrics is not None:
                    queued = [began - enqueued for _, _, enqueued in items]
                    self.metrics.execution(self.key, size, queued, time.monotonic() - began)
            except Exception as e:
                log.error("scoring a batch of %d request(s) failed: %s: %s", len(items), type(e).__name__, e)
                for _, fut, _ in items:
                    if not fut.done():
                        fut.set_exception(e)
                self._busy, self._taken = False, []
                continue
            start = 0
            for arrays, fut, _ in items:
                if not fut.done():
                    fut.set_result(probs[start : start + len(arrays[0])])
                start += len(arrays[0])
            self._busy, self._taken = False, []


def _concatenate(requests: list[tuple[np.ndarray, ...]]) -> tuple[np.ndarray, ...]:
    """Several requests' inputs as one batch; multi-hot bags (B, Fm, L) are padded with -1 to the longest L."""
    out = [np.concatenate([r[0] for r in requests]), np.concatenate([r[1] for r in requests])]
    if len(requests[0]) > 2:
        width = max(r[2].shape[2] for r in requests)
        out.append(np.concatenate([np.pad(r[2], ((0, 0), (0, 0), (0, width - r[2].shape[2])), constant_values=-1)
                                   for r in requests]))  # fmt: skip
    return tuple(out)


def _padded_size(items: list) -> int:
    """Elements of the multi-hot rectangle (B, Fm, L) the requests of ``items`` make together."""
    rows = sum(len(arrays[0]) for arrays, *_ in items)
    width = max(arrays[2].shape[2] for arrays, *_ in items)
    return rows * items[0][0][2].shape[1] * width


def _fits(items: list, item) -> bool:
    """Whether ``item`` may join the batch ``items``: always for one-hot models; with multi-hot bags,
    only while padding every bag to the longest one at most doubles the elements the requests carry
    (one request with a very long bag beside many short ones is scored on its own)."""
    if len(item[0]) <= 2:
        return True
    both = [*items, item]
    carried = sum(arrays[2].size for arrays, *_ in both)
    return _padded_size(both) <= 2 * carried + PADDING_SLACK
