"""The inference server: KServe v2 over HTTP (as Triton), with dynamic batching.

Concurrent requests wait up to ``batch_window_ms`` in a queue and are scored together (up to
``max_batch_size`` samples) on one model thread, so many small requests cost few model calls.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from ctrkit import __version__
from ctrkit.serve.predictor import Predictor
from ctrkit.serve.protocol import HEADER_LENGTH, RequestError, encode_response, parse_request

DEFAULT_MAX_BODY = 64 << 20


class Batcher:
    """Collects requests for a short window and scores them in one model call."""

    def __init__(self, predictor: Predictor, window_ms: float = 1.0, max_batch_size: int = 8192):
        self.predictor = predictor
        self.window = window_ms / 1e3
        self.max_batch_size = max_batch_size
        self.queue: asyncio.Queue | None = None
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="ctrkit-model")
        self.calls = 0
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self.queue = asyncio.Queue()
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        self.pool.shutdown(wait=False)

    async def score(
        self, numerical: np.ndarray, categorical: np.ndarray, multi_hot: np.ndarray | None = None
    ) -> np.ndarray:
        future = asyncio.get_running_loop().create_future()
        await self.queue.put(((numerical, categorical) + (() if multi_hot is None else (multi_hot,)), future))
        return await future

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            first = await self.queue.get()
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
                items.append(item)
                size += len(item[0][0])
            inputs = first[0] if len(items) == 1 else _concatenate([arrays for arrays, _ in items])
            try:
                probs = await loop.run_in_executor(self.pool, self.predictor, *inputs)
                self.calls += 1
            except Exception as e:  # the model failed: every waiting request gets the error
                for _, fut in items:
                    if not fut.done():
                        fut.set_exception(e)
                continue
            start = 0
            for arrays, fut in items:
                if not fut.done():
                    fut.set_result(probs[start : start + len(arrays[0])])
                start += len(arrays[0])


def _concatenate(requests: list[tuple[np.ndarray, ...]]) -> tuple[np.ndarray, ...]:
    """Several requests' inputs as one batch; multi-hot bags (B, Fm, L) are padded with -1 to the longest L."""
    out = [np.concatenate([r[0] for r in requests]), np.concatenate([r[1] for r in requests])]
    if len(requests[0]) > 2:
        width = max(r[2].shape[2] for r in requests)
        out.append(np.concatenate([np.pad(r[2], ((0, 0), (0, 0), (0, width - r[2].shape[2])), constant_values=-1)
                                   for r in requests]))  # fmt: skip
    return tuple(out)


def create_app(
    predictor: Predictor,
    name: str,
    window_ms: float = 1.0,
    max_batch_size: int = 8192,
    max_body: int = DEFAULT_MAX_BODY,
) -> FastAPI:
    """The FastAPI application serving ``predictor`` as model ``name``."""
    batcher = Batcher(predictor, window_ms, max_batch_size)

    @asynccontextmanager
    async def lifespan(app):
        batcher.start()
        yield
        await batcher.stop()

    app = FastAPI(title="ctrkit", lifespan=lifespan)
    app.state.batcher = batcher
    signature = predictor.signature
    tensors = lambda specs: [{"name": t.name, "datatype": t.datatype, "shape": t.shape()} for t in specs]

    def error(status: int, message: str) -> JSONResponse:
        return JSONResponse({"error": message}, status_code=status)

    def unknown(model: str) -> JSONResponse:
        return error(404, f"unknown model '{model}'; this server serves '{name}'")

    @app.get("/v2")
    async def server_metadata():
        return {"name": "ctrkit", "version": __version__, "extensions": ["binary_tensor_data"]}

    @app.get("/v2/health/live")
    async def live():
        return Response(status_code=200)

    @app.get("/v2/health/ready")
    async def ready():
        return Response(status_code=200)

    @app.get("/v2/models/{model}/ready")
    @app.get("/v2/models/{model}/versions/{version}/ready")
    async def model_ready(model: str, version: str = "1"):
        return Response(status_code=200) if model == name else unknown(model)

    @app.get("/v2/models/{model}")
    @app.get("/v2/models/{model}/versions/{version}")
    async def model_metadata(model: str, version: str = "1"):
        if model != name:
            return unknown(model)
        return {
            "name": name,
            "versions": ["1"],
            "platform": f"ctrkit_{predictor.backend}",
            "inputs": tensors(signature.inputs),
            "outputs": tensors([signature.output]),
        }

    @app.post("/v2/models/{model}/infer")
    @app.post("/v2/models/{model}/versions/{version}/infer")
    async def infer(model: str, request: Request, version: str = "1"):
        if model != name:
            return unknown(model)
        body, seen = bytearray(), 0
        async for chunk in request.stream():  # an oversized body is read to its end (not kept), so the
            seen += len(chunk)  # client gets the 400 rather than a reset connection
            if seen <= max_body:
                body += chunk
        if seen > max_body:
            return error(400, f"the request body of {seen} bytes exceeds the limit of {max_body} bytes")
        try:
            parsed = parse_request(bytes(body), request.headers.get(HEADER_LENGTH), signature)
        except RequestError as e:
            return error(400, str(e))
        if len(parsed.numerical) > max_batch_size:
            return error(400, f"batch of {len(parsed.numerical)} samples exceeds the limit of {max_batch_size}")
        probs = await batcher.score(parsed.numerical, parsed.categorical, parsed.multi_hot)
        content, headers = encode_response(name, parsed, probs)
        return Response(content=content, headers=headers, media_type=headers["content-type"])

    return app


def serve(
    predictor: Predictor,
    name: str,
    host: str = "127.0.0.1",
    port: int = 8000,
    window_ms: float = 1.0,
    max_batch_size: int = 8192,
    max_body: int = DEFAULT_MAX_BODY,
) -> None:
    """Runs the server until interrupted (uvicorn with uvloop and httptools when installed)."""
    import uvicorn

    app = create_app(predictor, name, window_ms, max_batch_size, max_body)
    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False)
