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

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from ctrkit import __version__
from ctrkit.preprocess.transform import RowError
from ctrkit.serve.batcher import Batcher
from ctrkit.serve.metrics import CONTENT_TYPE, ServerMetrics
from ctrkit.serve.names import check_name, check_version
from ctrkit.serve.predictor import Predictor
from ctrkit.serve.protocol import HEADER_LENGTH, RequestError, encode_response, parse_request
from ctrkit.serve.repository import ModelRepository

DEFAULT_MAX_BODY = 64 << 20
BODY_TIMEOUT_S = 30.0  # a body that takes longer to arrive gets a 408 (a client that sends half a request and waits)
LARGE_BODY = 1 << 20  # bodies from this size on are parsed in a worker process
MAX_INDEX_BODY = 1 << 20  # a repository index request is a small JSON object
log = logging.getLogger("ctrkit.serve")


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

    def shutdown(self, wait: bool = False) -> None:
        """Stops the worker; ``wait`` until it has exited (at the server's end: a pool left to exit by itself leaves
        its queues' semaphores for the resource tracker to report as leaked)."""
        if self.pool is not None:
            self.pool.shutdown(wait=wait, cancel_futures=True)
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
    body_timeout_s: float = BODY_TIMEOUT_S,
) -> FastAPI:
    """The FastAPI application serving ``predictor`` as model ``name`` (version 1), or, with ``repository``,
    every model of a Triton-layout model repository (each version; the newest where a request names none),
    with the repository extension's index, load and unload. A request body that has not arrived whole after
    ``body_timeout_s`` seconds is answered 408 and its connection closed."""
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
            worker.shutdown(wait=True)

    app = FastAPI(title="ctrkit", lifespan=lifespan)
    app.state.models = models
    app.state.metrics = metrics
    tensors = lambda specs: [{"name": t.name, "datatype": t.datatype, "shape": t.shape()} for t in specs]

    class BodyTimeout(Exception):
        pass

    async def read_body(request: Request, limit: int) -> tuple[bytes, int]:
        """The body (its first ``limit`` bytes: an oversized one is read to its end, not kept, so the client gets
        the 400 rather than a reset connection) and its size; BodyTimeout when it does not arrive in time."""
        body, seen = bytearray(), [0]

        async def collect() -> None:
            async for chunk in request.stream():
                seen[0] += len(chunk)
                if seen[0] <= limit:
                    body.extend(chunk)

        try:
            await asyncio.wait_for(collect(), body_timeout_s)
        except asyncio.TimeoutError:
            raise BodyTimeout(seen[0]) from None
        return bytes(body), seen[0]

    def too_slow(seen: int) -> JSONResponse:
        return JSONResponse(
            {"error": f"the request body did not arrive whole within {body_timeout_s:g} s ({seen} bytes came)"},
            status_code=408,
            headers={"connection": "close"},
        )

    def error(status: int, message: str) -> JSONResponse:
        return JSONResponse({"error": message}, status_code=status)

    def lookup(model: str, version: str | None) -> Served | JSONResponse:
        try:  # names are single path components, versions numbers (Triton's rules)
            check_name(model)
            version is None or check_version(version)
        except ValueError as e:
            return error(400, str(e))
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
            "inputs": tensors(signature.raw_inputs + signature.inputs),
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
        try:
            body, seen = await read_body(request, max_body)
        except BodyTimeout as e:
            return too_slow(e.args[0]), served
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
        if parsed.rows > max_batch_size:
            return error(400, f"batch of {parsed.rows} samples exceeds the limit of {max_batch_size}"), served
        current = lookup(model, version)  # a version loaded while the body arrived serves it
        served = current if isinstance(current, Served) and current.predictor.signature == signature else served
        if not served.batcher.alive:
            return error(503, "the model's batching loop has stopped; restart the server"), served
        if parsed.raw is not None:  # here, not awaited: the ids must be this version's, and it must not change
            try:
                parsed = parsed.with_inputs(*served.predictor.transform.from_request(parsed.raw, parsed.rows))
            except RowError as e:
                return error(400, str(e)), served
        try:  # no await between the lookup above and the request joining that batcher's queue
            probs = await served.batcher.score(parsed.numerical, parsed.categorical, parsed.multi_hot)
        except MemoryError:
            return error(503, "not enough memory to score this request; send fewer or shorter rows"), served
        except Exception as e:
            return error(500, f"the model failed on this request: {type(e).__name__}: {e}"), served
        content, headers = await asyncio.get_running_loop().run_in_executor(
            parser, encode_response, model, parsed, probs, served.batcher.key[1]
        )
        return Response(content=content, headers=headers, media_type=headers["content-type"]), served

    if repository is not None:

        @app.post("/v2/repository/index")
        async def repository_index(request: Request):
            try:
                body, seen = await read_body(request, MAX_INDEX_BODY)
            except BodyTimeout as e:
                return too_slow(e.args[0])
            if seen > MAX_INDEX_BODY:
                return error(400, f"the index request of {seen} bytes exceeds the limit of {MAX_INDEX_BODY} bytes")
            try:
                doc = json.loads(body) if body.strip() else {}
            except (ValueError, UnicodeDecodeError, RecursionError):
                return error(400, 'the index request must be a JSON object (such as {"ready": true}) or empty')
            if not isinstance(doc, dict):
                return error(400, f"the index request must be a JSON object, got {json.dumps(doc)[:40]}")
            only_ready = bool(doc.get("ready", False))
            out = []
            for model in repository.names():
                if model in models:
                    out += [{"name": model, "version": v, "state": "READY"}
                            for v in sorted(models[model], key=version_order)]  # fmt: skip
                    out += [{"name": model, "version": key.split("/")[1], "state": "UNAVAILABLE", "reason": why}
                            for key, why in repository.failed.items() if key.startswith(f"{model}/")]  # fmt: skip
                elif not only_ready:
                    reason = repository.failed.get(model, "unloaded")
                    out.append({"name": model, "state": "UNAVAILABLE", "reason": reason})
            return out

        @app.post("/v2/repository/models/{model}/load")
        async def repository_load(model: str):
            try:
                check_name(model)
            except ValueError as e:
                return error(400, str(e))
            try:
                await load(model)
            except Exception as e:  # a missing or corrupt model file: the running versions stay
                repository.failed[model] = str(e)
                return error(400, f"failed to load '{model}': {e}")
            repository.failed.pop(model, None)
            return Response(status_code=200)

        @app.post("/v2/repository/models/{model}/unload")
        async def repository_unload(model: str):
            try:
                check_name(model)
            except ValueError as e:
                return error(400, str(e))
            if model not in repository.names() and model not in models:
                return error(400, f"unknown model '{model}'")
            swap(model, None)
            return Response(status_code=200)

    return app


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
    body_timeout_s: float = BODY_TIMEOUT_S,
) -> None:
    """Runs the server until interrupted (uvicorn with uvloop and httptools when installed), on ``sock``
    when given (see ``bind``), else on a socket bound to ``host``:``port`` now; ``repository`` instead
    of ``predictor`` serves a model repository."""
    import uvicorn

    app = create_app(predictor, name, window_ms, max_batch_size, max_body, repository, body_timeout_s)
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
