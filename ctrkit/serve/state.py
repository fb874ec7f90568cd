"""The server's state: the models and versions it serves with their batchers, the parsers of request bodies, the
metrics, and what a request does with them. ``server.py``'s routes are thin wrappers over a ``ServerState``."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from ctrkit.preprocess.transform import RowError
from ctrkit.preprocess.values import BadValues
from ctrkit.serve.batcher import Batcher
from ctrkit.serve.large_body import LARGE_BODY, LargeBodyParser
from ctrkit.serve.metrics import ServerMetrics
from ctrkit.serve.names import check_name, check_version, version_number
from ctrkit.serve.predictor import Predictor
from ctrkit.serve.protocol import HEADER_LENGTH, InferRequest, RequestError, encode_response, parse_request
from ctrkit.serve.repository import ModelRepository

DEFAULT_MAX_BODY = 64 << 20
BODY_TIMEOUT_S = 30.0  # a body that takes longer to arrive gets a 408 (a client that sends half a request and waits)
MAX_INDEX_BODY = 1 << 20  # a repository index request is a small JSON object
INLINE_ROWS = 256  # raw rows transformed on the event loop; a larger request's rows go to a thread
log = logging.getLogger("ctrkit.serve")


class Problem(Exception):
    """A request answered with an error: ``status``, a message in words, and headers."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers

    def response(self) -> JSONResponse:
        return JSONResponse({"error": self.message}, status_code=self.status, headers=self.headers)


@dataclass
class Served:
    """One model version being served: its predictor and its batching loop."""

    predictor: Predictor
    batcher: Batcher


def version_order(version: str) -> int:
    """Sort key of version names: by their number (so "10" comes after "2")."""
    return version_number(version) or 0


def newest(versions: dict[str, Served]) -> str:
    """The newest of ``versions`` (numbered directories: the largest number), as Triton's ``latest`` policy."""
    return max(versions, key=version_order)


@dataclass(frozen=True)
class Limits:
    """How the server batches and what it accepts: ``window_ms`` a request waits for others to batch with,
    ``max_batch_size`` samples a model call, ``max_body`` bytes a request, ``body_timeout_s`` for a body to
    arrive; ``missing_columns`` what a raw column left out of a request means (``RowTransform.check_columns``);
    ``bad_values`` what a raw value preprocessing refuses means (``values.BadValues``)."""

    window_ms: float = 1.0
    max_batch_size: int = 8192
    max_body: int = DEFAULT_MAX_BODY
    body_timeout_s: float = BODY_TIMEOUT_S
    missing_columns: str = "error"
    bad_values: str = "error"


class ServerState:
    """What a server serves: ``predictor`` as model ``name`` (version 1), or, with ``repository``, every model of a
    Triton-layout model repository (each version; the newest where a request names none).

    Attributes:
        models: name -> version -> ``Served``; a model's versions are replaced whole, never edited.
        metrics: the Prometheus metrics.
    """

    def __init__(self, predictor: Predictor | None, name: str, limits: Limits, repository: ModelRepository | None):
        self.predictor, self.name, self.limits, self.repository = predictor, name, limits, repository
        self.metrics = ServerMetrics()
        self.models: dict[str, dict[str, Served]] = {}
        self.encoder = ThreadPoolExecutor(2, thread_name_prefix="ctrkit-parse")  # responses out
        # raw rows -> ids, off the event loop (Polars releases the GIL): a large request never stalls other clients
        self.transformer = ThreadPoolExecutor(2, thread_name_prefix="ctrkit-transform")
        self.large: dict = {}  # signature -> its LargeBodyParser, started with the first version that has it
        self.retiring: set[asyncio.Task] = set()

    # models and versions

    def _start(self, model: str, version: str, p: Predictor) -> Served:
        key = (model, version)
        self.metrics.ensure(key)
        served = Served(p, Batcher(p, self.limits.window_ms, self.limits.max_batch_size, self.metrics, key))
        served.batcher.start()
        if p.signature not in self.large:  # the worker starts with the model, not on the first large request
            self.large[p.signature] = LargeBodyParser(p.signature)
            self.large[p.signature].start()
        return served

    @staticmethod
    async def _retire(old: dict[str, Served]) -> None:
        """Stops replaced or unloaded versions once the requests already queued on them are answered."""
        for served in old.values():
            await served.batcher.drain()

    def _loaded(self, model: str, only: list[str] | None) -> dict[str, Predictor]:
        """``model``'s versions (``only``: those) loaded from the repository and warmed (``Predictor.warm``), in a
        thread: ready to answer at their steady speed when swapped in."""
        loaded = self.repository.load(model, only)
        for version, p in loaded.items():
            try:
                p.warm()
            except Exception as e:  # a model that cannot score a row of missing values still serves requests
                log.warning("model '%s' version %s not warmed: %s", model, version, e)
        return loaded

    def swap(self, model: str, versions: dict[str, Served] | None) -> None:
        """Serves ``versions`` as ``model`` (None: unloads it); the versions replaced retire once answered."""
        old = self.models.pop(model, None)
        if versions:
            self.models[model] = versions
        if old:
            self._retire_later(old)

    def _retire_later(self, old: dict[str, Served]) -> None:
        """Stops ``old`` versions once the requests already queued on them are answered, off this call."""
        task = asyncio.get_running_loop().create_task(self._retire(old))
        self.retiring.add(task)
        task.add_done_callback(self.retiring.discard)

    async def load(self, model: str) -> None:
        """(Re)loads every version of ``model`` from the repository, off the event loop; the versions it replaces
        keep answering until the new ones serve."""
        loaded = await asyncio.get_running_loop().run_in_executor(None, self._loaded, model, None)
        self.swap(model, {v: self._start(model, v, p) for v, p in loaded.items()})

    async def startup(self) -> None:
        """Serves the predictor, or every model of the repository that loads (a broken one does not stop the
        others: the index says why it is unavailable)."""
        if self.repository is None:
            self.swap(self.name, {"1": self._start(self.name, "1", self.predictor)})
            return
        for model in self.repository.names():
            try:
                await self.load(model)
            except Exception as e:  # a missing or corrupt file
                log.error("model '%s' not loaded: %s", model, e)
                self.repository.failed[model] = str(e)

    async def poll(self, seconds: float) -> None:
        """Every ``seconds``, the repository's version directories read (Triton's POLL mode): a version placed (whole,
        by an export's rename) is loaded and joins the versions serving, which answer meanwhile and are not
        reloaded; a version removed stops once its queued requests are answered; a new model is loaded, a model
        whose directory went unloaded. A version that fails to load leaves the others serving, its reason in the
        index."""
        seen = {m: self.repository.stamps(m) for m in self.models}
        while True:
            await asyncio.sleep(seconds)
            try:
                names = self.repository.names()
            except OSError:
                continue
            for model in names:
                try:
                    stamps = self.repository.stamps(model)
                except (OSError, ValueError):
                    continue
                if seen.get(model) == stamps or not stamps:
                    continue
                before, seen[model] = seen.get(model, {}), stamps
                try:
                    await self._follow(model, [v for v, ino in stamps.items() if before.get(v) != ino])
                    self.repository.failed.pop(model, None)
                    log.info("model '%s' follows the repository: versions %s", model, ", ".join(stamps))
                except Exception as e:  # a missing or corrupt file: the versions serving stay
                    log.error("model '%s' not reloaded: %s", model, e)
                    self.repository.failed[model] = str(e)
            for model in set(seen) - set(names):
                del seen[model]
                self.swap(model, None)

    async def _follow(self, model: str, changed: list[str]) -> None:
        """``model``'s served versions made the repository's: the ``changed`` ones (new, or placed anew) loaded off
        the event loop and started, the unchanged ones kept as they serve, the ones gone retired."""
        loaded = await asyncio.get_running_loop().run_in_executor(None, self._loaded, model, changed)
        on_disk = set(self.repository.versions(model))
        current = self.models.get(model, {})
        started = {v: self._start(model, v, p) for v, p in loaded.items()}
        versions = {**{v: s for v, s in current.items() if v in on_disk and v not in started}, **started}
        gone = {v: s for v, s in current.items() if v not in versions or versions[v] is not s}
        if versions:
            self.models[model] = versions
        else:
            self.models.pop(model, None)
        if gone:
            self._retire_later(gone)

    async def shutdown(self) -> None:
        for versions in list(self.models.values()):
            for served in versions.values():
                await served.batcher.stop()
        self.encoder.shutdown(wait=False)
        self.transformer.shutdown(wait=False)
        for worker in self.large.values():
            worker.shutdown(wait=True)

    def lookup(self, model: str, version: str | None) -> Served:
        """The served version a request names (its newest where it names none); Problem where there is none."""
        try:  # names are single path components, versions numbers (Triton's rules)
            check_name(model)
            version is None or check_version(version)
        except ValueError as e:
            raise Problem(400, str(e)) from None
        versions = self.models.get(model)
        if versions is None:
            if self.repository is None:
                raise Problem(404, f"unknown model '{model}'; this server serves '{self.name}'")
            known = model in self.repository.names()
            raise Problem(404, f"model '{model}' is not loaded" if known else f"unknown model '{model}'")
        version = version or newest(versions)
        if version not in versions:
            raise Problem(404, f"model '{model}' has no version '{version}' (versions: {', '.join(sorted(versions))})")
        return versions[version]

    @property
    def ready(self) -> bool:
        return all(s.batcher.alive for versions in self.models.values() for s in versions.values())

    def metadata(self, model: str, version: str | None) -> dict:
        served = self.lookup(model, version)
        signature = served.predictor.signature
        tensors = lambda specs: [{"name": t.name, "datatype": t.datatype, "shape": t.shape()} for t in specs]  # noqa: E731
        return {
            "name": model,
            "versions": sorted(self.models[model], key=version_order),
            "platform": f"ctrkit_{served.predictor.backend}",
            "inputs": tensors(signature.raw_inputs + signature.inputs),
            "outputs": tensors([signature.output]),
        }

    def config(self, model: str, version: str | None) -> dict:
        """The model configuration extension: the version's inputs, output and batching as a Triton config says them
        (as JSON); the raw columns and the id inputs are each optional where a model takes both."""
        served = self.lookup(model, version)
        signature = served.predictor.signature
        optional = bool(signature.raw_inputs)

        def tensor(t, is_input: bool) -> dict:
            kind = "TYPE_STRING" if t.datatype == "BYTES" else f"TYPE_{t.datatype}"
            return {"name": t.name, "data_type": kind, "dims": t.shape()[1:],
                    **({"optional": True} if is_input and optional else {})}  # fmt: skip

        return {
            "name": model,
            "platform": f"ctrkit_{served.predictor.backend}",
            "max_batch_size": self.limits.max_batch_size,
            "input": [tensor(t, True) for t in signature.raw_inputs + signature.inputs],
            "output": [tensor(signature.output, False)],
            "dynamic_batching": {"max_queue_delay_microseconds": round(self.limits.window_ms * 1000)},
            "version_policy": {"all": {}},
        }

    def statistics(self, model: str | None, version: str | None) -> dict:
        """The statistics extension: each served version's requests and model calls, counted as /metrics counts
        them (all models, one model's versions, or one version)."""
        if model:
            served = self.lookup(model, version)  # (an unknown model or version: its Problem)
            keys = [served.batcher.key] if version else [(model, v) for v in self.models[model]]
        else:
            keys = [(m, v) for m, versions in self.models.items() for v in versions]
        count = lambda name, key: self.metrics.counters[name].get(key, 0.0)  # noqa: E731
        stats = []
        for key in sorted(keys, key=lambda k: (k[0], version_order(k[1]))):
            calls = int(count("nv_inference_exec_count", key))
            pair = lambda n, us: {"count": n, "ns": round(us * 1000)}  # noqa: E731
            stats.append({  # (only what the metrics count: no last-inference time, input or output phases, cache)
                "name": key[0], "version": key[1],
                "inference_count": int(count("nv_inference_count", key)), "execution_count": calls,
                "inference_stats": {
                    "success": pair(int(count("nv_inference_request_success", key)),
                                    count("nv_inference_request_duration_us", key)),
                    "fail": pair(int(count("nv_inference_request_failure", key)), 0.0),
                    "queue": pair(calls, count("nv_inference_queue_duration_us", key)),
                    "compute_infer": pair(calls, count("nv_inference_compute_infer_duration_us", key)),
                },
            })  # fmt: skip
        return {"model_stats": stats}

    # requests

    async def read_body(self, request: Request, limit: int) -> tuple[bytes, int]:
        """The body (its first ``limit`` bytes: an oversized one is read to its end, not kept, so the client gets
        the 400 rather than a reset connection) and its size; a 408 Problem when it does not arrive in time."""
        body, seen = bytearray(), [0]

        async def collect() -> None:
            async for chunk in request.stream():
                seen[0] += len(chunk)
                if seen[0] <= limit:
                    body.extend(chunk)

        timeout = self.limits.body_timeout_s
        try:
            await asyncio.wait_for(collect(), timeout)
        except asyncio.TimeoutError:
            raise Problem(
                408,
                f"the request body did not arrive whole within {timeout:g} s ({seen[0]} bytes came)",
                {"connection": "close"},
            ) from None
        return bytes(body), seen[0]

    async def infer(self, model: str, version: str | None, request: Request) -> Response:
        """The response to an inference request, counted in the metrics of the version that answered it."""
        served = self.lookup(model, version)
        arrived = time.monotonic()
        try:
            response, served = await self._answer(model, version, served, request)
        except Problem as e:
            response = e.response()
        self.metrics.request(served.batcher.key, response.status_code == 200, time.monotonic() - arrived)
        return response

    async def _parse(self, request: Request, signature):
        """The request's tensors (a Problem where its body is late, too large or malformed)."""
        limit = self.limits.max_body
        body, seen = await self.read_body(request, limit)
        if seen > limit:
            raise Problem(400, f"the request body of {seen} bytes exceeds the limit of {limit} bytes")
        body = _decoded(body, request.headers.get("content-encoding"), limit)
        try:
            if len(body) < LARGE_BODY:
                parsed = parse_request(bytes(body), request.headers.get(HEADER_LENGTH), signature)
            else:  # parsing holds the GIL for seconds: in another process, so other clients are answered
                parsed = await self.large[signature].parse(bytes(body), request.headers.get(HEADER_LENGTH))
        except RequestError as e:
            raise Problem(400, str(e)) from None
        except BrokenProcessPool:
            raise Problem(503, "the request parser ran out of memory on this request; send a smaller body") from None
        if parsed.rows > self.limits.max_batch_size:
            raise Problem(400, f"batch of {parsed.rows} samples exceeds the limit of {self.limits.max_batch_size}")
        return parsed

    async def _answer(self, model: str, version: str | None, served: Served, request: Request
                      ) -> tuple[Response, Served]:  # fmt: skip
        """The response to one request for a served model version, and the version that answered it (a version
        loaded while the body arrived answers in place of the one looked up)."""
        signature = served.predictor.signature
        parsed = await self._parse(request, signature)
        try:  # a version loaded while the body arrived serves it
            current = self.lookup(model, version)
        except Problem:
            current = None
        served = current if current is not None and current.predictor.signature == signature else served
        try:
            if not served.batcher.alive:
                raise Problem(503, "the model's batching loop has stopped; restart the server")
            if parsed.raw is not None:
                parsed, served = await self._transform(model, version, served, parsed)
            try:  # no await between the transform's version check and the request joining that batcher's queue
                probs = await served.batcher.score(parsed.numerical, parsed.categorical, parsed.multi_hot)
            except MemoryError:
                raise Problem(503, "not enough memory to score this request; send fewer or shorter rows") from None
            except Exception as e:
                raise Problem(500, f"the model failed on this request: {type(e).__name__}: {e}") from None
        except Problem as e:
            return e.response(), served
        content, headers = await asyncio.get_running_loop().run_in_executor(
            self.encoder, encode_response, model, parsed, probs, served.batcher.key[1]
        )
        return Response(content=content, headers=headers, media_type=headers["content-type"]), served

    async def _transform(self, model: str, version: str | None, served: Served, parsed: InferRequest
                         ) -> tuple[InferRequest, Served]:  # fmt: skip
        """``parsed``'s raw rows as ``served``'s inputs: up to INLINE_ROWS rows here (a one-row request's transform
        takes less than a hand-off to a thread), more in a thread, so that the event loop serves other clients
        meanwhile. The ids must be those of the version that scores them: should it stop while its thread ran (a
        version loaded in its place), the current version's transform runs instead."""
        loop = asyncio.get_running_loop()
        for _ in range(3):
            transform = served.predictor.transform
            bad = BadValues(self.limits.bad_values)
            try:
                if parsed.rows <= INLINE_ROWS:
                    inputs = transform.from_request(parsed.raw, parsed.rows, self.limits.missing_columns, bad)
                else:
                    inputs = await loop.run_in_executor(self.transformer, transform.from_request, parsed.raw,
                                                        parsed.rows, self.limits.missing_columns, bad)  # fmt: skip
            except RowError as e:
                raise Problem(400, str(e)) from None
            if served.batcher.alive:
                return parsed.with_inputs(*inputs, bad_values_missing=bad.count), served
            served = self.lookup(model, version)  # (a Problem where none is served now)
            if served.predictor.transform is None:
                break
        raise Problem(503, "the model's versions changed while this request was read; send it again")

    # the repository extension

    async def _small_object(self, request: Request, what: str, example: str) -> dict:
        """A repository request's body: a JSON object of at most MAX_INDEX_BODY bytes, or nothing ({})."""
        body, seen = await self.read_body(request, MAX_INDEX_BODY)
        if seen > MAX_INDEX_BODY:
            raise Problem(400, f"the {what} request of {seen} bytes exceeds the limit of {MAX_INDEX_BODY} bytes")
        try:
            doc = json.loads(body) if body.strip() else {}
        except (ValueError, UnicodeDecodeError, RecursionError):
            raise Problem(400, f"the {what} request must be a JSON object (such as {example}) or empty") from None
        if not isinstance(doc, dict):
            raise Problem(400, f"the {what} request must be a JSON object, got {json.dumps(doc)[:40]}")
        return doc

    async def index(self, request: Request) -> list[dict]:
        """The repository's models: each loaded version READY (a version that failed UNAVAILABLE, with why), each
        model not loaded UNAVAILABLE (``{"ready": true}``: the ready ones only)."""
        doc = await self._small_object(request, "index", '{"ready": true}')
        only_ready, failed = bool(doc.get("ready", False)), self.repository.failed
        out = []
        for model in self.repository.names():
            if model in self.models:
                out += [
                    {"name": model, "version": v, "state": "READY"}
                    for v in sorted(self.models[model], key=version_order)
                ]
                out += [
                    {"name": model, "version": key.split("/")[1], "state": "UNAVAILABLE", "reason": why}
                    for key, why in failed.items()
                    if key.startswith(f"{model}/")
                ]
            elif not only_ready:
                out.append({"name": model, "state": "UNAVAILABLE", "reason": failed.get(model, "unloaded")})
        return out

    async def load_model(self, model: str, request: Request) -> None:
        """The repository extension's load: the model's versions (re)loaded; where that fails, the running
        versions stay and the request gets a 400 saying why. A load that brings a config or files of its own is
        refused (ctrkit loads the repository's files as they are)."""
        _checked(model)
        given = (await self._small_object(request, "load", '{"parameters": {}}')).get("parameters") or {}
        extra = sorted(k for k in given if k == "config" or k.startswith("file:")) if isinstance(given, dict) else []
        if extra:
            raise Problem(400, f"a load with {', '.join(extra)} is not taken: ctrkit loads the model repository's "
                               "files as they are (write them there, then load)")  # fmt: skip
        try:
            await self.load(model)
        except Exception as e:  # a missing or corrupt model file
            self.repository.failed[model] = str(e)
            raise Problem(400, f"failed to load '{model}': {e}") from None
        self.repository.failed.pop(model, None)

    def unload_model(self, model: str) -> None:
        _checked(model)
        if model not in self.repository.names() and model not in self.models:
            raise Problem(400, f"unknown model '{model}'")
        self.swap(model, None)


def _decoded(body: bytes, encoding: str | None, limit: int) -> bytes:
    """A request body as sent with ``Content-Encoding`` gzip or deflate (tritonclient's request compression),
    decompressed up to ``limit`` bytes; other encodings are refused."""
    encoding = (encoding or "identity").strip().lower()
    if encoding == "identity":
        return body
    if encoding not in ("gzip", "deflate"):
        raise Problem(400, f"Content-Encoding '{encoding}' is not taken: send gzip, deflate or none")
    stream = zlib.decompressobj(wbits=31 if encoding == "gzip" else 15)
    try:
        out = stream.decompress(body, limit + 1)
    except zlib.error as e:
        raise Problem(400, f"the {encoding} body does not decompress: {e}") from None
    if len(out) > limit:
        raise Problem(400, f"the request body decompresses to more than the limit of {limit} bytes")
    if not stream.eof:
        raise Problem(400, f"the {encoding} body is cut off")
    return out


def _checked(model: str) -> None:
    try:
        check_name(model)
    except ValueError as e:
        raise Problem(400, str(e)) from None
