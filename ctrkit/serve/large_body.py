"""Request bodies of ``LARGE_BODY`` bytes or more, parsed in a worker process: ``json.loads`` of tens of MB holds
the GIL for seconds, which in a thread would stall every other client."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from ctrkit.models.signature import Signature
from ctrkit.serve.protocol import parse_request

LARGE_BODY = 1 << 18  # bodies from this size on are parsed in a worker process (docs/decisions/serving-stalls.md)

_signature: Signature | None = None  # the served model's signature, in a LargeBodyParser's worker process


def _init_worker(signature, parent: int) -> None:
    global _signature
    _signature = signature
    threading.Thread(target=_exit_with_parent, args=(parent,), daemon=True).start()


def _exit_with_parent(parent: int) -> None:
    """A parser worker ends when the server process does, however it ended (SIGKILL included)."""
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(0)


def _parse_in_worker(body: bytes, header_length: str | None):
    if _signature is None:
        raise RuntimeError("a parser worker started without the model's signature")
    return parse_request(body, header_length, _signature)


class LargeBodyParser:
    """Parses the large request bodies of one model signature in a worker process. A worker that dies (out of
    memory) fails its request and is replaced."""

    def __init__(self, signature):
        self.signature = signature
        self.pool: ProcessPoolExecutor | None = None

    def start(self) -> None:
        context = multiprocessing.get_context("spawn")  # never fork a process with threads
        self.pool = ProcessPoolExecutor(
            1, mp_context=context, initializer=_init_worker, initargs=(self.signature, os.getpid())
        )
        self.pool.submit(int)  # starts the worker now, not on the first large request

    async def parse(self, body: bytes, header_length: str | None):
        try:
            return await asyncio.get_running_loop().run_in_executor(self.pool, _parse_in_worker, body, header_length)
        except BrokenProcessPool:
            self.shutdown()
            self.start()
            raise

    def shutdown(self, wait: bool = False) -> None:
        """Stops the worker; ``wait`` until it has exited (at the server's end: a pool left to exit by itself leaves
        its queues' semaphores for the resource tracker to report as leaked)."""
        if self.pool is not None:
            self.pool.shutdown(wait=wait, cancel_futures=True)
            self.pool = None
