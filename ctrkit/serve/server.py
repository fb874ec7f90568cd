"""The inference server: KServe v2 over HTTP (as Triton), with dynamic batching.

Concurrent requests wait up to ``batch_window_ms`` in a queue and are scored together (up to
``max_batch_size`` samples) on one model thread, so many small requests cost few model calls. The routes here are
thin: what is served and what a request does with it is a ``state.ServerState``.
"""

from __future__ import annotations

import asyncio
import socket
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from ctrkit import __version__
from ctrkit.serve.metrics import CONTENT_TYPE
from ctrkit.serve.predictor import Predictor
from ctrkit.serve.repository import ModelRepository
from ctrkit.serve.state import BODY_TIMEOUT_S, DEFAULT_MAX_BODY, Limits, Problem, ServerState

__all__ = ["BODY_TIMEOUT_S", "DEFAULT_MAX_BODY", "bind", "create_app", "serve"]


def create_app(
    predictor: Predictor | None,
    name: str,
    window_ms: float = 1.0,
    max_batch_size: int = 8192,
    max_body: int = DEFAULT_MAX_BODY,
    repository: ModelRepository | None = None,
    body_timeout_s: float = BODY_TIMEOUT_S,
    missing_columns: str = "error",
    poll_s: float = 0.0,
    bad_values: str = "error",
) -> FastAPI:
    """The FastAPI application serving ``predictor`` as model ``name`` (version 1), or, with ``repository``,
    every model of a Triton-layout model repository (each version; the newest where a request names none),
    with the repository extension's index, load and unload. A request body that has not arrived whole after
    ``body_timeout_s`` seconds is answered 408 and its connection closed. A raw-value request's columns follow
    ``RowTransform.check_columns`` with ``missing_columns``, its bad values ``bad_values`` (``values.BadValues``).
    With ``poll_s`` > 0 the repository is polled every ``poll_s`` seconds for versions placed or removed
    (``ServerState.poll``)."""
    # one job: the route table of the v2 protocol: each route hands its request to ServerState in a line or two, and a
    # route read apart from the others would hide which paths the server answers
    limits = Limits(window_ms, max_batch_size, max_body, body_timeout_s, missing_columns, bad_values)
    state = ServerState(predictor, name, limits, repository)

    @asynccontextmanager
    async def lifespan(app):
        await state.startup()
        poller = asyncio.get_running_loop().create_task(state.poll(poll_s)) if repository and poll_s > 0 else None
        yield
        if poller is not None:
            poller.cancel()
        await state.shutdown()

    app = FastAPI(title="ctrkit", lifespan=lifespan)
    app.state.server = state

    @app.exception_handler(Problem)
    async def problem(request: Request, e: Problem):
        return e.response()

    @app.get("/v2")
    async def server_metadata():
        extensions = ["binary_tensor_data"] + (["model_repository"] if repository is not None else [])
        return {"name": "ctrkit", "version": __version__, "extensions": extensions}

    @app.get("/metrics")
    async def prometheus_metrics():
        return Response(content=state.metrics.render(), media_type=CONTENT_TYPE)

    @app.get("/v2/health/live")
    async def live():
        return Response(status_code=200)

    @app.get("/v2/health/ready")
    async def ready():
        return Response(status_code=200 if state.ready else 503)

    @app.get("/v2/models/{model}/ready")
    @app.get("/v2/models/{model}/versions/{version}/ready")
    async def model_ready(model: str, version: str | None = None):
        return Response(status_code=200 if state.lookup(model, version).batcher.alive else 503)

    @app.get("/v2/models/stats")
    @app.get("/v2/models/{model}/stats")
    @app.get("/v2/models/{model}/versions/{version}/stats")
    async def statistics(model: str | None = None, version: str | None = None):
        return state.statistics(model, version)

    @app.get("/v2/models/{model}/config")
    @app.get("/v2/models/{model}/versions/{version}/config")
    async def model_config(model: str, version: str | None = None):
        return state.config(model, version)

    @app.get("/v2/models/{model}")
    @app.get("/v2/models/{model}/versions/{version}")
    async def model_metadata(model: str, version: str | None = None):
        return state.metadata(model, version)

    # what ctrkit's server does not take, answered in Triton's error shape (tritonclient raises it in words)
    @app.get("/v2/systemsharedmemory/status")
    @app.get("/v2/systemsharedmemory/region/{region}/status")
    @app.get("/v2/cudasharedmemory/status")
    @app.get("/v2/cudasharedmemory/region/{region}/status")
    async def shared_memory_status(region: str | None = None):
        return []  # no region is ever registered

    @app.post("/v2/systemsharedmemory/unregister")
    @app.post("/v2/systemsharedmemory/region/{region}/unregister")
    @app.post("/v2/cudasharedmemory/unregister")
    @app.post("/v2/cudasharedmemory/region/{region}/unregister")
    async def shared_memory_unregister(region: str | None = None):
        return Response(status_code=200)  # nothing registered: nothing to unregister

    @app.post("/v2/systemsharedmemory/region/{region}/register")
    @app.post("/v2/cudasharedmemory/region/{region}/register")
    async def shared_memory_register(region: str):
        raise Problem(400, "shared memory is not taken by ctrkit's server: send the tensors in the request body "
                           "(the binary tensor extension is the fast way)")  # fmt: skip

    @app.get("/v2/trace/setting")
    @app.post("/v2/trace/setting")
    @app.get("/v2/models/{model}/trace/setting")
    @app.post("/v2/models/{model}/trace/setting")
    async def trace_setting(model: str | None = None):
        raise Problem(400, "ctrkit's server does not trace requests: GET /metrics has each model's request, queue "
                           "and compute times")  # fmt: skip

    @app.get("/v2/logging")
    @app.post("/v2/logging")
    async def log_settings():
        raise Problem(400, "ctrkit's server has no log settings to read or change: it logs warnings and errors to "
                           "stderr")  # fmt: skip

    @app.post("/v2/models/{model}/infer")
    @app.post("/v2/models/{model}/versions/{version}/infer")
    async def infer(model: str, request: Request, version: str | None = None):
        return await state.infer(model, version, request)

    if repository is not None:

        @app.post("/v2/repository/index")
        async def repository_index(request: Request):
            return await state.index(request)

        @app.post("/v2/repository/models/{model}/load")
        async def repository_load(model: str, request: Request):
            await state.load_model(model, request)
            return Response(status_code=200)

        @app.post("/v2/repository/models/{model}/unload")
        async def repository_unload(model: str):
            state.unload_model(model)
            return Response(status_code=200)

    else:

        @app.post("/v2/repository/index")
        async def one_model_index():
            return [{"name": name, "version": "1", "state": "READY" if state.ready else "UNAVAILABLE"}]

        @app.post("/v2/repository/models/{model}/load")
        @app.post("/v2/repository/models/{model}/unload")
        async def one_model(model: str):
            raise Problem(400, "this server serves one model (--checkpoint or --model-dir): start it with "
                               "--model-repository to load and unload models")  # fmt: skip

    @app.exception_handler(StarletteHTTPException)
    async def no_route(request: Request, e: StarletteHTTPException):  # FastAPI's {"detail": ...}, as Triton says it
        what = "no such route" if e.status_code == 404 else str(e.detail)
        return JSONResponse({"error": f"{request.method} {request.url.path}: {what} on ctrkit's server"},
                            status_code=e.status_code)  # fmt: skip

    @app.exception_handler(RequestValidationError)
    async def bad_route_values(request: Request, e: RequestValidationError):
        return JSONResponse({"error": f"{request.method} {request.url.path}: {e.errors()[0].get('msg', e)}"},
                            status_code=400)  # fmt: skip

    return app


HEADER_TIMEOUT_S = 10.0  # a request's headers must arrive whole within this (`serve --header-timeout-s`)
SHUTDOWN_S = 10.0  # SIGTERM: requests still open this long after it are dropped, so the process always stops


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
    missing_columns: str = "error",
    header_timeout_s: float = HEADER_TIMEOUT_S,
    poll_s: float = 0.0,
    bad_values: str = "error",
) -> None:
    """Runs the server until interrupted (uvicorn with uvloop and httptools when installed), on ``sock``
    when given (see ``bind``), else on a socket bound to ``host``:``port`` now; ``repository`` instead
    of ``predictor`` serves a model repository. A connection that takes longer than ``header_timeout_s`` to send a
    request's headers is closed (``header_timeout``)."""
    import uvicorn

    app = create_app(predictor, name, window_ms, max_batch_size, max_body, repository, body_timeout_s, missing_columns,
                     poll_s, bad_values)  # fmt: skip
    sock = sock if sock is not None else bind(host, port)
    config = uvicorn.Config(app, log_level="warning", access_log=False, timeout_graceful_shutdown=int(SHUTDOWN_S))
    config.load()  # (what uvicorn chooses: httptools where installed, else h11)
    config.http_protocol_class = header_timeout(config.http_protocol_class, header_timeout_s)
    uvicorn.Server(config).run(sockets=[sock])


def header_timeout(protocol: type, seconds: float) -> type:
    """``protocol`` (uvicorn's HTTP protocol class) that closes a connection whose request headers do not arrive
    whole within ``seconds``: after it opens, and after each response (a kept-alive connection's next request);
    uvicorn's own timeouts start once a request's headers are in."""

    class HeaderTimeout(protocol):
        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._arm_header_timer()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm_header_timer()

        def connection_lost(self, exc) -> None:
            timer = getattr(self, "_header_timer", None)
            if timer is not None:
                timer.cancel()
            super().connection_lost(exc)

        def _arm_header_timer(self) -> None:
            timer = getattr(self, "_header_timer", None)
            if timer is not None:
                timer.cancel()
            self._header_timer = self.loop.call_later(seconds, self._header_deadline, self.cycle)

        def _header_deadline(self, cycle) -> None:
            waiting = self.cycle is cycle and (cycle is None or cycle.response_complete)  # no request began since
            if waiting and not self.transport.is_closing():
                self.transport.close()

    return HeaderTimeout


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
