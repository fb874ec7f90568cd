"""The server under faults: hostile requests, a failing model, huge bags beside small ones, large bodies,
a busy port, and kills. The real server on 127.0.0.1 where the fault comes from outside; the real
Batcher with a stand-in model where it comes from the model."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import numpy as np
import pytest
import tritonclient.http as httpclient

from ctrkit.serve.batcher import Batcher
from tests.faults.conftest import one_line_error
from tests.serve.test_server import Server, infer, request_body


@pytest.fixture(scope="module")
def server(tiny_checkpoint):
    s = Server("--checkpoint", tiny_checkpoint, "--max-body-mb", "64")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def rows(tiny_dataset):
    from ctrkit.data.dataset import SplitBinaryDataset

    batch = SplitBinaryDataset(tiny_dataset, "test").slice(0, 8)
    return batch.numerical.numpy(), batch.categorical.numpy()


def post(server, doc) -> tuple[int, dict]:
    status, body = server.post(doc if isinstance(doc, bytes) else json.dumps(doc).encode())
    return status, json.loads(body)


def test_json_values_are_typed_as_the_protocol_says(server, rows):
    """A float sent as an INT64 id used to be truncated, numeric strings accepted, and a second input of
    the same name silently won: all 400 now, naming the input."""
    good = json.loads(request_body(rows[0][:2], rows[1][:2]))
    num, cat = good["inputs"]
    cases = {
        "float id": [num, {**cat, "data": [[1.9] * len(cat["data"][0])] * 2}],
        "string id": [num, {**cat, "data": [[str(v) for v in r] for r in cat["data"]]}],
        "string numerical": [{**num, "data": [[str(v) for v in r] for r in num["data"]]}, cat],
        "bool id": [num, {**cat, "data": [[True] * len(cat["data"][0])] * 2}],
        "null": [{**num, "data": [[None] * len(num["data"][0])] * 2}, cat],
        "ragged": [num, {**cat, "data": [cat["data"][0], cat["data"][1][:-1]]}],
        "duplicate": [num, cat, {**cat, "data": [[0] * len(cat["data"][0])] * 2}],
    }
    for what, inputs in cases.items():
        status, body = post(server, {"inputs": inputs})
        assert status == 400, (what, body)
        assert "'categorical'" in body["error"] or "'numerical'" in body["error"], (what, body)
    assert post(server, good)[0] == 200


def test_malformed_bodies_are_400s_in_words_and_counted(server, rows):
    """Bodies whose parts have the wrong JSON type were bare 500s with a traceback, and a boolean among numbers was
    read as 1: each a 400 naming the part now, counted as a failure; the server answers the next request."""
    good = json.loads(request_body(rows[0][:2], rows[1][:2]))
    num, cat = good["inputs"]
    cases = {
        "outputs a number": ({**good, "outputs": 5}, "'outputs'"),
        "parameters a list": ({**good, "parameters": [1]}, "'parameters'"),
        "parameters a string": ({**good, "parameters": "binary"}, "'parameters'"),
        "input parameters a list": ({"inputs": [{**num, "parameters": [1]}, cat]}, "'parameters'"),
        "datatype a list": ({"inputs": [{**num, "datatype": ["FP32"]}, cat]}, "datatype"),
        "a boolean among numbers": (
            {"inputs": [{**num, "data": [[True] + r[1:] for r in num["data"]]}, cat]},
            "booleans",
        ),  # fmt: skip
        "a boolean among ids": (
            {"inputs": [num, {**cat, "data": [[1, True] + r[2:] for r in cat["data"]]}]},
            "booleans",
        ),  # fmt: skip
    }
    with urllib.request.urlopen(f"http://{server.url}/metrics", timeout=10) as r:
        before = r.read().decode()
    for what, (doc, message) in cases.items():
        status, body = post(server, doc)
        assert status == 400 and message in body["error"], (what, body)
    with urllib.request.urlopen(f"http://{server.url}/metrics", timeout=10) as r:
        after = r.read().decode()

    def failures(text: str) -> float:
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("nv_inference_request_failure{"))  # fmt: skip

    assert failures(after) - failures(before) == len(cases)
    status, body = post(server, good)
    assert status == 200 and body["model_version"] == "1"


def test_a_body_that_never_arrives_whole_is_a_408(tiny_checkpoint):
    """A client that sends the headers and half the body, then waits, held its request open for ever: after
    --body-timeout-s it gets a 408 in words, counted as a failure, and its connection is closed."""
    s = Server("--checkpoint", tiny_checkpoint, "--body-timeout-s", "1")
    try:
        with socket.create_connection(("127.0.0.1", s.port), timeout=20) as c:
            c.sendall(b'POST /v2/models/dlrm/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{"inputs"')
            started = time.monotonic()
            answer = b""
            while chunk := c.recv(65536):  # until the server closes the connection
                answer += chunk
            waited = time.monotonic() - started
        assert answer.startswith(b"HTTP/1.1 408") and b"did not arrive whole within 1 s (9 bytes came)" in answer
        assert 0.9 < waited < 15
        with urllib.request.urlopen(f"http://{s.url}/metrics", timeout=10) as r:
            assert 'nv_inference_request_failure{model="dlrm",version="1"} 1' in r.read().decode()
        assert s.healthy()
    finally:
        s.stop()


def test_deeply_nested_json_is_a_400_not_a_500(server):
    status, body = post(server, b"[" * 100_000 + b"]" * 100_000)
    assert status == 400 and "nested too deeply" in body["error"]
    assert server.healthy()


def test_a_large_json_body_does_not_stall_other_clients(server, rows):
    """Large JSON bodies are parsed in a worker process: health checks keep being answered while one is
    in flight (parsed on the event loop, a 50 MB body held every other client for seconds)."""
    n = 400_000
    body = request_body(np.repeat(rows[0][:1], n, 0), np.repeat(rows[1][:1], n, 0))
    assert len(body) > 30 << 20
    done = threading.Event()
    status = []

    def big():
        status.append(server.post(body)[0])
        done.set()

    answered = [time.monotonic()]
    thread = threading.Thread(target=big)
    thread.start()
    while not done.is_set() and len(answered) < 5000:
        with urllib.request.urlopen(f"http://{server.url}/v2/health/live", timeout=60) as r:
            assert r.status == 200
        answered.append(time.monotonic())
    thread.join(120)
    assert status == [400]  # parsed: more samples than --max-batch-size
    in_flight = answered[-1] - answered[0]
    longest_wait = max(b - a for a, b in zip(answered, answered[1:]))
    assert longest_wait < 0.5 * in_flight, (longest_wait, in_flight)


def test_a_busy_port_fails_before_saying_it_serves(tiny_checkpoint):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        proc = subprocess.run([sys.executable, "-m", "ctrkit", "serve", "--checkpoint", str(tiny_checkpoint),
                               "--port", str(port)], capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 2
    assert "serving" not in proc.stderr
    one_line_error(proc.stderr, "serve", f"127.0.0.1:{port}", "--port")


def test_killed_under_load_clients_get_errors_and_a_restart_serves(tiny_checkpoint, rows):
    s = Server("--checkpoint", tiny_checkpoint)
    failures, successes = [], []

    def client_run():
        client = httpclient.InferenceServerClient(s.url, connection_timeout=5, network_timeout=5)
        for _ in range(300):
            try:
                infer(client, rows[0][:4], rows[1][:4], binary=True)
                successes.append(1)
            except Exception as e:  # the server died: an error, never a hang
                failures.append(type(e).__name__)
                return

    threads = [threading.Thread(target=client_run) for _ in range(4)]
    for t in threads:
        t.start()
    while not successes:
        time.sleep(0.01)
    s.proc.kill()
    s.proc.wait(10)
    for t in threads:
        t.join(30)
        assert not t.is_alive()
    assert failures  # the clients saw the failure
    again = Server("--checkpoint", tiny_checkpoint)
    try:
        client = httpclient.InferenceServerClient(again.url)
        assert infer(client, rows[0][:4], rows[1][:4], binary=True).shape == (4, 1)
    finally:
        again.stop()


def test_sigterm_stops_a_busy_server(tiny_checkpoint, rows):
    s = Server("--checkpoint", tiny_checkpoint)
    client = httpclient.InferenceServerClient(s.url)
    infer(client, rows[0][:4], rows[1][:4], binary=True)
    s.proc.terminate()
    assert s.proc.wait(20) is not None


# ------------------------------------------------------------------ the batcher with a stand-in model
class Recorder:
    """A stand-in multi-hot model that records the shape of every batch it scores."""

    def __init__(self):
        self.shapes = []

    def __call__(self, numerical, categorical, multi_hot=None):
        if multi_hot is not None:
            self.shapes.append(multi_hot.shape)
            if multi_hot.shape[1] != 1:
                raise MemoryError("stand-in: this batch would not fit")
        return numerical[:, :1].copy()


def score_together(batcher, requests):
    async def run():
        batcher.start()
        try:
            return await asyncio.gather(*(batcher.score(*r) for r in requests), return_exceptions=True)
        finally:
            await batcher.stop()

    return asyncio.run(asyncio.wait_for(run(), 30))


def request(rows, bag, value, features=1):
    return (np.full((rows, 1), float(value), np.float32), np.zeros((rows, 1), np.int64),
            np.zeros((rows, features, bag), np.int64))  # fmt: skip


def test_one_long_bag_is_not_padded_into_a_large_batch():
    """A 1-row request with a very long bag queued beside a large one used to pad every row to its
    length (a MemoryError that killed the loop); it is scored on its own now."""
    model = Recorder()
    results = score_together(Batcher(model, window_ms=200.0), [request(2000, 1, 1.0), request(1, 300_000, 2.0),
                                                              request(500, 2, 3.0)])  # fmt: skip
    assert [r[0, 0] for r in results] == [1.0, 2.0, 3.0]
    assert max(rows * f * width for rows, f, width in model.shapes) <= 2 * 300_000 + (1 << 16)
    assert (1, 1, 300_000) in model.shapes


def test_a_failing_batch_fails_its_requests_and_the_loop_goes_on():
    """Requests that cannot be scored together (here: a model error) get the error; the loop serves the
    next request, and ``alive`` stays true."""
    model = Recorder()
    batcher = Batcher(model, window_ms=200.0)

    async def run():
        batcher.start()
        bad = await asyncio.gather(batcher.score(*request(2, 3, 1.0, features=2)), return_exceptions=True)
        good = await batcher.score(*request(2, 3, 5.0))
        alive = batcher.alive
        await batcher.stop()
        return bad, good, alive

    bad, good, alive = asyncio.run(asyncio.wait_for(run(), 30))
    assert isinstance(bad[0], MemoryError) and good[0, 0] == 5.0 and alive


def test_incompatible_requests_in_one_batch_fail_without_killing_the_loop():
    model = Recorder()
    results = score_together(Batcher(model, window_ms=200.0), [request(2, 3, 1.0), request(2, 3, 2.0, features=2)])
    assert all(isinstance(r, Exception) for r in results)  # cannot be concatenated: both told so


def test_a_dead_batcher_is_not_ready_and_refuses_requests():
    batcher = Batcher(Recorder(), window_ms=1.0)

    async def run():
        batcher.start()
        batcher._task.cancel()  # the loop ends, as a bug would end it
        await asyncio.sleep(0.05)
        try:
            await batcher.score(*request(1, 1, 1.0))
        except RuntimeError as e:
            return batcher.alive, str(e)
        return batcher.alive, None

    alive, error = asyncio.run(asyncio.wait_for(run(), 30))
    assert not alive and "stopped" in error


def _parser_workers(parent: int) -> set[int]:
    """Pids of the live spawned multiprocessing workers of process ``parent`` (a server's large-body parser), not
    those of other tests' servers running beside this one."""
    from pathlib import Path

    pids = set()
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
                if ppid == parent and b"spawn_main" in (proc / "cmdline").read_bytes():
                    pids.add(int(proc.name))
            except (OSError, ValueError, IndexError):
                continue
    return pids


def _alive(pids: set[int]) -> set[int]:
    """Those of ``pids`` still running their worker (a zombie's command line is empty)."""
    from pathlib import Path

    alive = set()
    for pid in pids:
        try:
            if b"spawn_main" in (Path("/proc") / str(pid) / "cmdline").read_bytes():
                alive.add(pid)
        except OSError:
            continue
    return alive


@pytest.mark.parametrize("how", ["terminate", "kill"])
def test_a_stopped_server_leaves_no_parser_process(tiny_checkpoint, how):
    s = Server("--checkpoint", tiny_checkpoint)
    deadline = time.monotonic() + 30
    while not _parser_workers(s.proc.pid) and time.monotonic() < deadline:  # its worker starts with it
        time.sleep(0.1)
    workers = _parser_workers(s.proc.pid)
    assert workers
    getattr(s.proc, how)()
    s.proc.wait(20)
    deadline = time.monotonic() + 10
    while _alive(workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(workers)
