"""The inference server: KServe v2 over HTTP (as Triton), with dynamic batching.

Concurrent requests wait up to ``batch_window_ms`` in a queue and are scored together (up to
``max_batch_size`` samples) on one model thread, so many small requests cost few model calls.
"""

from __future__ import annotations

import asyncio
import json
import logging
import multiprocessing
import os
import socket
import threading
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from ctrkit import __version__
from ctrkit.serve.metrics import CONTENT_TYPE, ServerMetrics
from ctrkit.serve.predictor import Predictor
from ctrkit.serve.protocol import HEADER_LENGTH, RequestError, encode_response, parse_request

DEFAULT_MAX_BODY = 64 << 20
PADDING_SLACK = 1 << 16  # padding elements always allowed in a batch
LARGE_BODY = 1 << 20  # bodies from this size on are parsed in a worker process
log = logging.getLogger("ctrkit.serve")


class Batcher:
    """Collects requests for a short window and scores them in one model call."""

    def __init__(
        self,
        predictor: Predictor,
        window_ms: float = 1.0,
        max_batch_size: int = 8192,
        metrics: ServerMetrics | None = None,
        key: tuple[str, str] = ("model", "1"),
    ):
        self.predictor = predictor
        self.metrics, self.key = metrics, key
        self.window = window_ms / 1e3
        self.max_batch_size = max_batch_size
        self.queue: asyncio.Queue | None = None
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="ctrkit-model")
        self.calls = 0
        self._busy = False  # a batch taken off the queue and not yet answered
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self.queue = asyncio.Queue()
        self._task = asyncio.get_running_loop().create_task(self._loop())
        self._task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task) -> None:
        """The loop ended (stopped, or died of a bug): log why and fail every queued request."""
        if not task.cancelled() and task.exception() is not None:
            log.error("the batching loop stopped: %r; the server now answers 503", task.exception())
        while self.queue is not None and not self.queue.empty():
            _, fut, _ = self.queue.get_nowait()
            if not fut.done():
                fut.set_exception(RuntimeError("the batching loop has stopped"))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        self.pool.shutdown(wait=False)

    async def score(
        self, numerical: np.ndarray, categorical: np.ndarray, multi_hot: np.ndarray | None = None
    ) -> np.ndarray:
        if not self.alive:
            raise RuntimeError("the batching loop has stopped")
        future = asyncio.get_running_loop().create_future()
        arrays = (numerical, categorical) + (() if multi_hot is None else (multi_hot,))
        await self.queue.put((arrays, future, time.monotonic()))
        return await future

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
        held = None  # a request kept for the next batch because padding it into this one costs too much
        while True:
            first = held if held is not None else await self.queue.get()
            self._busy, held = True, None
            items, size = [first], len(first[0][0])
            deadline = time.monotonic() + self.window
            while size < self.max_batch_size:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                try:
                    item = await asyncio.wait_for(self.queue.get(), left)
                except asyncio.TimeoutError:
                    break
                if not _fits(items, item):
                    held = item
                    break
                items.append(item)
                size += len(item[0][0])
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
                self._busy = held is not None
                continue
            start = 0
            for arrays, fut, _ in items:
                if not fut.done():
                    fut.set_result(probs[start : start + len(arrays[0])])
                start += len(arrays[0])
            self._busy = held is not None


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


_signature = None  # the served model's signature, in a LargeBodyParser's worker process


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
    return parse_request(body, header_length, _signature)


class LargeBodyParser:
    """Parses request bodies of ``LARGE_BODY`` bytes or more in a worker process: ``json.loads`` of tens
    of MB holds the GIL for seconds, which in a thread would stall every other client. A worker that dies
    (out of memory) fails its request and is replaced."""

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

    def shutdown(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)
            self.pool = None


@dataclass
class Served:
    """One model version being served: its predictor and its batching loop."""

    predictor: Predictor
    batcher: Batcher


def version_order(version: str) -> tuple[int, str]:
    """Sort key of version names: numbered versions by their number (so "10" comes after "2")."""
    return (int(version) if version.isdigit() else -1, version)


def newest(versions: dict[str, Served]) -> str:
    """The newest of ``versions`` (numbered directories: the largest number), as Triton's ``latest`` policy."""
    return max(versions, key=version_order)


def create_app(
    predictor: Predictor | None,
    name: str,
    window_ms: float = 1.0,
    max_batch_size: int = 8192,
    max_body: int = DEFAULT_MAX_BODY,
    repository: ModelRepository | None = None,
) -> FastAPI:
    """The FastAPI application serving ``predictor`` as model ``name`` (version 1), or, with ``repository``,
    every model of a Triton-layout model repository (each version; the newest where a request names none),
    with the repository extension's index, load and unload."""
    metrics = ServerMetrics()
    models: dict[str, dict[str, Served]] = {}  # name -> version -> served; replaced whole, never edited
    parser = ThreadPoolExecutor(2, thread_name_prefix="ctrkit-parse")  # responses out
    large: dict = {}  # signature -> its LargeBodyParser, started with the first version that has it
    retiring: set[asyncio.Task] = set()

    def start(model: str, version: str, p: Predictor) -> Served:
        key = (model, version)
        metrics.ensure(key)
        served = Served(p, Batcher(p, window_ms, max_batch_size, metrics, key))
        served.batcher.start()
        if p.signature not in large:  # the worker starts with the model, not on the first large request
            large[p.signature] = LargeBodyParser(p.signature)
            large[p.signature].start()
        return served

    async def retire(old: dict[str, Served]) -> None:
        """Stops replaced or unloaded versions once the requests already queued on them are answered."""
        for served in old.values():
            await served.batcher.drain()

    def swap(model: str, versions: dict[str, Served] | None) -> None:
        old = models.pop(model, None)
        if versions:
            models[model] = versions
        if old:
            task = asyncio.get_running_loop().create_task(retire(old))
            retiring.add(task)
            task.add_done_callback(retiring.discard)

    async def load(model: str) -> None:
        """(Re)loads every version of ``model`` from the repository, off the event loop; the versions
        it replaces keep answering until the new ones serve."""
        loaded = await asyncio.get_running_loop().run_in_executor(None, repository.load, model)
        swap(model, {v: start(model, v, p) for v, p in loaded.items()})

    @asynccontextmanager
    async def lifespan(app):
        if repository is None:
            swap(name, {"1": start(name, "1", predictor)})
        else:
            for model in repository.names():
                try:
                    await load(model)
                except Exception as e:  # a broken model (a missing or corrupt file) does not stop the others
                    log.error("model '%s' not loaded: %s", model, e)
                    repository.failed[model] = str(e)
        yield
        for versions in list(models.values()):
            for served in versions.values():
                await served.batcher.stop()
        parser.shutdown(wait=False)
        for worker in large.values():
            worker.shutdown()

    app = FastAPI(title="ctrkit", lifespan=lifespan)
    app.state.models = models
    app.state.metrics = metrics
    tensors = lambda specs: [{"name": t.name, "datatype": t.datatype, "shape": t.shape()} for t in specs]

    def error(status: int, message: str) -> JSONResponse:
        return JSONResponse({"error": message}, status_code=status)

    def lookup(model: str, version: str | None) -> Served | JSONResponse:
        versions = models.get(model)
        if versions is None:
            if repository is None:
                return error(404, f"unknown model '{model}'; this server serves '{name}'")
            known = model in repository.names()
            return error(404, f"model '{model}' is not loaded" if known else f"unknown model '{model}'")
        version = version or newest(versions)
        if version not in versions:
            return error(404, f"model '{model}' has no version '{version}' (versions: {', '.join(sorted(versions))})")
        return versions[version]

    @app.get("/v2")
    async def server_metadata():
        extensions = ["binary_tensor_data"] + (["model_repository"] if repository is not None else [])
        return {"name": "ctrkit", "version": __version__, "extensions": extensions}

    @app.get("/metrics")
    async def prometheus_metrics():
        return Response(content=metrics.render(), media_type=CONTENT_TYPE)

    @app.get("/v2/health/live")
    async def live():
        return Response(status_code=200)

    @app.get("/v2/health/ready")
    async def ready():
        alive = all(s.batcher.alive for versions in models.values() for s in versions.values())
        return Response(status_code=200 if alive else 503)

    @app.get("/v2/models/{model}/ready")
    @app.get("/v2/models/{model}/versions/{version}/ready")
    async def model_ready(model: str, version: str | None = None):
        served = lookup(model, version)
        if isinstance(served, JSONResponse):
            return served
        return Response(status_code=200 if served.batcher.alive else 503)

    @app.get("/v2/models/{model}")
    @app.get("/v2/models/{model}/versions/{version}")
    async def model_metadata(model: str, version: str | None = None):
        served = lookup(model, version)
        if isinstance(served, JSONResponse):
            return served
        signature = served.predictor.signature
        return {
            "name": model,
            "versions": sorted(models[model], key=version_order),
            "platform": f"ctrkit_{served.predictor.backend}",
            "inputs": tensors(signature.inputs),
            "outputs": tensors([signature.output]),
        }

    @app.post("/v2/models/{model}/infer")
    @app.post("/v2/models/{model}/versions/{version}/infer")
    async def infer(model: str, request: Request, version: str | None = None):
        served = lookup(model, version)
        if isinstance(served, JSONResponse):
            return served
        arrived = time.monotonic()
        response, served = await answer(model, version, served, request)
        metrics.request(served.batcher.key, response.status_code == 200, time.monotonic() - arrived)
        return response

    async def answer(model: str, version: str | None, served: Served, request: Request) -> tuple[Response, Served]:
        """The response (or error response) to one request for a served model version, and the version
        that answered it (a version loaded while the body arrived answers in place of the one looked up)."""
        signature = served.predictor.signature
        body, seen = bytearray(), 0
        async for chunk in request.stream():  # an oversized body is read to its end (not kept), so the
            seen += len(chunk)  # client gets the 400 rather than a reset connection
            if seen <= max_body:
                body += chunk
        if seen > max_body:
            return error(400, f"the request body of {seen} bytes exceeds the limit of {max_body} bytes"), served
        try:
            if len(body) < LARGE_BODY:
                parsed = parse_request(bytes(body), request.headers.get(HEADER_LENGTH), signature)
            else:  # parsing holds the GIL for seconds: in another process, so other clients are answered
                parsed = await large[signature].parse(bytes(body), request.headers.get(HEADER_LENGTH))
        except RequestError as e:
            return error(400, str(e)), served
        except BrokenProcessPool:
            return error(503, "the request parser ran out of memory on this request; send a smaller body"), served
        if len(parsed.numerical) > max_batch_size:
            return error(400, f"batch of {len(parsed.numerical)} samples exceeds the limit of {max_batch_size}"), served
        current = lookup(model, version)  # a version loaded while the body arrived serves it
        served = current if isinstance(current, Served) and current.predictor.signature == signature else served
        if not served.batcher.alive:
            return error(503, "the model's batching loop has stopped; restart the server"), served
        try:  # no await between the lookup above and the request joining that batcher's queue
            probs = await served.batcher.score(parsed.numerical, parsed.categorical, parsed.multi_hot)
        except MemoryError:
            return error(503, "not enough memory to score this request; send fewer or shorter rows"), served
        except Exception as e:
            return error(500, f"the model failed on this request: {type(e).__name__}: {e}"), served
        content, headers = await asyncio.get_running_loop().run_in_executor(
            parser, encode_response, model, parsed, probs
        )
        return Response(content=content, headers=headers, media_type=headers["content-type"]), served

    if repository is not None:

        @app.post("/v2/repository/index")
        async def repository_index(request: Request):
            body = await request.body()
            only_ready = bool(json.loads(body or b"{}").get("ready", False)) if body.strip() else False
            out = []
            for model in repository.names():
                if model in models:
                    out += [{"name": model, "version": v, "state": "READY"}
                            for v in sorted(models[model], key=version_order)]  # fmt: skip
                elif not only_ready:
                    reason = repository.failed.get(model, "unloaded")
                    out.append({"name": model, "state": "UNAVAILABLE", "reason": reason})
            return out

        @app.post("/v2/repository/models/{model}/load")
        async def repository_load(model: str):
            try:
                await load(model)
            except Exception as e:  # a missing or corrupt model file: the running versions stay
                repository.failed[model] = str(e)
                return error(400, f"failed to load '{model}': {e}")
            repository.failed.pop(model, None)
            return Response(status_code=200)

        @app.post("/v2/repository/models/{model}/unload")
        async def repository_unload(model: str):
            if model not in repository.names() and model not in models:
                return error(400, f"unknown model '{model}'")
            swap(model, None)
            return Response(status_code=200)

    return app


class ModelRepository:
    """A Triton-layout model repository as ``ctrkit export --format triton`` writes it: ``DIR/NAME/``
    holding ``config.pbtxt`` and ``ctrkit_model.json``, and numbered version directories (``1/``,
    ``2/``, ...) each holding the model file (and optionally its own ``ctrkit_model.json``)."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        if not self.root.is_dir():
            raise ValueError(f"{self.root}: model repository not found")
        self.failed: dict[str, str] = {}
        if not self.names():
            raise ValueError(f"{self.root}: no model directories (NAME/config.pbtxt) in this repository")

    def names(self) -> list[str]:
        return sorted(p.parent.name for p in self.root.glob("*/config.pbtxt"))

    def versions(self, model: str) -> list[str]:
        folder = self.root / model
        return sorted((p.name for p in folder.iterdir() if p.is_dir() and p.name.isdigit()), key=version_order)

    def load(self, model: str) -> dict[str, Predictor]:
        """Every version of ``model``, loaded (a ValueError naming what is wrong otherwise)."""
        folder = self.root / model
        if not (folder / "config.pbtxt").is_file():
            raise ValueError(f"{folder}: no such model in the repository (expected {folder / 'config.pbtxt'})")
        versions = self.versions(model)
        if not versions:
            raise ValueError(f"{folder}: no numbered version directories")
        return {v: Predictor.from_export(folder, v) for v in versions}


def serve(
    predictor: Predictor | None,
    name: str,
    host: str = "127.0.0.1",
    port: int = 8000,
    window_ms: float = 1.0,
    max_batch_size: int = 8192,
    max_body: int = DEFAULT_MAX_BODY,
    sock: socket.socket | None = None,
    repository: ModelRepository | None = None,
) -> None:
    """Runs the server until interrupted (uvicorn with uvloop and httptools when installed), on ``sock``
    when given (see ``bind``), else on a socket bound to ``host``:``port`` now; ``repository`` instead
    of ``predictor`` serves a model repository."""
    import uvicorn

    app = create_app(predictor, name, window_ms, max_batch_size, max_body, repository)
    sock = sock if sock is not None else bind(host, port)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    server.run(sockets=[sock])


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host``:``port``; a port in use is a one-line ValueError."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as e:
        sock.close()
        raise ValueError(f"cannot listen on {host}:{port}: {e.strerror or e}; choose another --port") from None
    sock.set_inheritable(True)
    return sock
