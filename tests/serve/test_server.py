"""The real server on 127.0.0.1, queried with the real tritonclient (JSON and binary) and plain HTTP."""

import json
import random
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.http as httpclient

from ctrkit.data.dataset import SplitBinaryDataset
from tests.conftest import free_port, run_cli

N_ROWS = 300


class Server:
    def __init__(self, *args):
        self.port = free_port()
        self.url = f"127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "ctrkit", "serve", *map(str, args), "--port", str(self.port), "--threads", "1"]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while not self.healthy():
            assert self.proc.poll() is None, self.proc.stderr.read()
            assert time.monotonic() < deadline, "server did not become ready"
            time.sleep(0.2)

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.url}/v2/health/ready", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def post(self, body: bytes, headers=None, model="dlrm", path=None):
        """POSTs ``body`` to ``path`` (default: ``model``'s infer route); returns (status, body)."""
        path = path or f"/v2/models/{model}/infer"
        req = urllib.request.Request(f"http://{self.url}{path}", data=body, method="POST", headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=20)


@pytest.fixture(scope="module")
def rows(tiny_dataset):
    batch = SplitBinaryDataset(tiny_dataset, "test").slice(0, N_ROWS)
    return batch.numerical.numpy(), batch.categorical.numpy()


@pytest.fixture(scope="module")
def predicted(tiny_checkpoint, tiny_dataset, tmp_path_factory):
    """`ctrkit predict` on the test mapping: what the server must answer."""
    out = tmp_path_factory.mktemp("pred") / "p.npy"
    assert run_cli("predict", "--checkpoint", tiny_checkpoint, "--dataset", tiny_dataset, "--out", out)[0] == 0
    return np.load(out)[:N_ROWS]


@pytest.fixture(scope="module", params=["checkpoint", "onnx", "mmap"])
def server(request, tiny_checkpoint, tmp_path_factory):
    if request.param == "checkpoint":
        s = Server("--checkpoint", tiny_checkpoint, "--max-body-mb", "1")
    elif request.param == "mmap":
        s = Server(
            "--checkpoint", tiny_checkpoint, "--max-body-mb", "1", "--embedding-store", "mmap", "--cache-rows", "50"
        )
    else:
        out = tmp_path_factory.mktemp("export") / "onnx"
        assert run_cli("export", "--checkpoint", tiny_checkpoint, "--format", "onnx", "--out", out)[0] == 0
        s = Server("--model-dir", out, "--max-body-mb", "1")
    yield s
    s.stop()


def infer(client, numerical, categorical, binary):
    a = httpclient.InferInput("numerical", list(numerical.shape), "FP32")
    a.set_data_from_numpy(numerical, binary_data=binary)
    b = httpclient.InferInput("categorical", list(categorical.shape), "INT64")
    b.set_data_from_numpy(categorical, binary_data=binary)
    out = httpclient.InferRequestedOutput("probability", binary_data=binary)
    return client.infer("dlrm", [a, b], outputs=[out]).as_numpy("probability")


@pytest.mark.parametrize("binary", [False, True])
def test_predictions_equal_ctrkit_predict(server, rows, predicted, binary):
    client = httpclient.InferenceServerClient(server.url)
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("dlrm")
    meta = client.get_model_metadata("dlrm")
    assert [(i["name"], i["datatype"], i["shape"]) for i in meta["inputs"]] == [
        ("numerical", "FP32", [-1, 4]),
        ("categorical", "INT64", [-1, 8]),
    ]
    numerical, categorical = rows
    got = infer(client, numerical, categorical, binary)
    assert got.shape == (N_ROWS, 1) and got.dtype == np.float32
    np.testing.assert_allclose(got[:, 0], predicted, atol=1e-5)
    # one row at a time gives the same numbers as the whole batch (dynamic batching changes nothing)
    np.testing.assert_allclose(infer(client, numerical[:1], categorical[:1], binary)[:, 0], predicted[:1], atol=1e-5)


def request_body(numerical, categorical):
    return json.dumps(
        {
            "inputs": [
                {"name": "numerical", "datatype": "FP32", "shape": list(numerical.shape), "data": numerical.tolist()},
                {
                    "name": "categorical",
                    "datatype": "INT64",
                    "shape": list(categorical.shape),
                    "data": categorical.tolist(),
                },
            ]
        }
    ).encode()


def test_bad_requests_get_400_naming_the_input(server, rows):
    numerical, categorical = rows[0][:2], rows[1][:2]
    good = json.loads(request_body(numerical, categorical))
    cases = {
        "shape": ({**good, "inputs": [{**good["inputs"][0], "shape": [2, 5]}, good["inputs"][1]]}, "numerical"),
        "dtype": ({**good, "inputs": [good["inputs"][0], {**good["inputs"][1], "datatype": "FP32"}]}, "INT64"),
        "missing": ({**good, "inputs": [good["inputs"][0]]}, "missing input(s) categorical"),
        "count": ({**good, "inputs": [{**good["inputs"][0], "data": [1.0]}, good["inputs"][1]]}, "holds 1 values"),
        "huge": (
            {
                **good,
                "inputs": [{**good["inputs"][0], "shape": [2**62, numerical.shape[1]], "data": []}, good["inputs"][1]],
            },
            "holds 0 values",
        ),  # fmt: skip
    }
    for what, (doc, expect) in cases.items():
        status, body = server.post(json.dumps(doc).encode())
        assert status == 400 and expect in json.loads(body)["error"], (what, body)
    status, body = server.post(b"{not json")
    assert status == 400 and "not valid JSON" in json.loads(body)["error"]
    status, body = server.post(b"x" * (2 << 20))  # over --max-body-mb 1
    assert status == 400 and "exceeds the limit" in json.loads(body)["error"]
    status, body = server.post(request_body(numerical, categorical), headers={"Inference-Header-Content-Length": "9"})
    assert status == 400
    status, _ = server.post(request_body(numerical, categorical), model="other")
    assert status == 404
    status, body = server.post(request_body(numerical, categorical))
    assert status == 200 and len(json.loads(body)["outputs"][0]["data"]) == 2  # still serving


def test_fuzzed_bodies_never_crash_it(server, rows):
    rng = random.Random(0)
    base = request_body(rows[0][:3], rows[1][:3])
    statuses = []
    for i in range(150):
        body = bytearray(base)
        for _ in range(rng.randint(1, 8)):
            body[rng.randrange(len(body))] = rng.randrange(256)
        if i % 5 == 0:
            body = bytes(rng.randrange(256) for _ in range(rng.randint(0, 300)))
        headers = {"Inference-Header-Content-Length": str(rng.randint(-5, len(body) + 5))} if i % 7 == 0 else {}
        statuses.append(server.post(bytes(body), headers)[0])
    assert set(statuses) <= {200, 400}, sorted(set(statuses))
    assert server.healthy() and server.proc.poll() is None


def test_bounded_load_has_no_failures(server, rows, predicted):
    numerical, categorical = rows
    per_client = 500

    def client_run(k):
        client = httpclient.InferenceServerClient(server.url)
        for j in range(per_client):
            i = (k * per_client + j) % N_ROWS
            got = infer(client, numerical[i : i + 1], categorical[i : i + 1], binary=True)
            np.testing.assert_allclose(got[:, 0], predicted[i : i + 1], atol=1e-5)  # batched with others: same answer
        return per_client

    with ThreadPoolExecutor(8) as pool:
        done = sum(pool.map(client_run, range(8)))
    assert done == 8 * per_client and server.healthy()


def test_unfinished_headers_are_closed_after_the_header_timeout(tiny_checkpoint):
    """Connections that never finish a request's headers (the first request's, or the next one's on a kept-alive
    connection) are closed after --header-timeout-s, unanswered, and hold no one meanwhile: a normal client is
    answered while they wait."""
    import socket

    s = Server("--checkpoint", tiny_checkpoint, "--header-timeout-s", "1")
    held = []
    try:
        for _ in range(200):
            c = socket.create_connection(("127.0.0.1", s.port), timeout=15)
            c.sendall(b"POST /v2/models/dlrm/infer HTTP/1.1\r\nHost: x\r\nContent-")
            held.append(c)
        assert s.healthy()
        kept = socket.create_connection(("127.0.0.1", s.port), timeout=15)
        held.append(kept)
        kept.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = b""
        while b"\r\n\r\n" not in answer:
            answer += kept.recv(4096)
        head, body = answer.split(b"\r\n\r\n", 1)
        length = int(
            next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
        )
        while len(body) < length:
            body += kept.recv(4096)
        assert head.startswith(b"HTTP/1.1 200")
        kept.sendall(b"GET /v2/health/live HTTP/1.1\r\nHo")  # the next request's headers, never finished
        for c in held:
            assert c.recv(4096) == b""  # closed by the server, unanswered (a socket.timeout before: held for ever)
        assert s.healthy()
    finally:
        for c in held:
            c.close()
        s.stop()


def test_every_tritonclient_method_works_or_is_refused_in_words(tiny_checkpoint, rows):
    """Each method of tritonclient.http.InferenceServerClient against ctrkit's server: it works as Triton answers it
    (configuration, statistics, compressed requests, the shared-memory status), or the client raises Triton's error
    shape with a message (never FastAPI's {"detail": "Not Found"}, which it cannot decode, and nothing ignored in
    silence: an unknown output, class_count, a load with a config of its own)."""
    from tritonclient.utils import InferenceServerException

    numerical, categorical = rows
    s = Server("--checkpoint", tiny_checkpoint)
    client = httpclient.InferenceServerClient(s.url)
    try:
        want = infer(client, numerical, categorical, True)

        def inputs():
            a = httpclient.InferInput("numerical", list(numerical.shape), "FP32")
            a.set_data_from_numpy(numerical, binary_data=True)
            b = httpclient.InferInput("categorical", list(categorical.shape), "INT64")
            b.set_data_from_numpy(categorical, binary_data=True)
            return [a, b]

        def scores(**kwargs):
            return client.infer("dlrm", inputs(), **kwargs).as_numpy("probability")

        def round_trip():  # a body made by generate_request_body, posted, its answer read by parse_response_body
            body, json_size = client.generate_request_body(inputs())
            headers = {"Inference-Header-Content-Length": str(json_size)} if json_size is not None else {}
            request = urllib.request.Request(f"http://{s.url}/v2/models/dlrm/infer", data=body, headers=headers)
            with urllib.request.urlopen(request, timeout=10) as r:
                answer, length = r.read(), r.headers.get("Inference-Header-Content-Length")
            parsed = client.parse_response_body(answer, header_length=int(length) if length else None)
            return parsed.as_numpy("probability")

        class Headers:  # a client plugin: adds a header to every request
            def __call__(self, request):
                request.headers["x-ctrkit-test"] = "1"

        def refused(call, *words):
            with pytest.raises(InferenceServerException) as e:
                call()
            said = str(e.value)
            assert all(w in said for w in words) and "Not Found" not in said and "detail" not in said, said
            return said

        calls = {
            "is_server_live": lambda: client.is_server_live() is True,
            "is_server_ready": lambda: client.is_server_ready() is True,
            "is_model_ready": lambda: client.is_model_ready("dlrm") is True,
            "get_server_metadata": lambda: client.get_server_metadata()["name"] == "ctrkit",
            "get_model_metadata": lambda: client.get_model_metadata("dlrm")["name"] == "dlrm",
            "get_model_config": lambda: [(i["name"], i["data_type"]) for i in client.get_model_config("dlrm")["input"]]
            == [("numerical", "TYPE_FP32"), ("categorical", "TYPE_INT64")],
            "get_model_repository_index": lambda: client.get_model_repository_index()[0]["name"] == "dlrm",
            "get_inference_statistics": lambda: client.get_inference_statistics("dlrm")["model_stats"][0][
                "inference_stats"]["success"]["count"] >= 1,
            "get_system_shared_memory_status": lambda: client.get_system_shared_memory_status() == [],
            "get_cuda_shared_memory_status": lambda: client.get_cuda_shared_memory_status() == [],
            "unregister_system_shared_memory": lambda: client.unregister_system_shared_memory() is None,
            "unregister_cuda_shared_memory": lambda: client.unregister_cuda_shared_memory() is None,
            "register_system_shared_memory": lambda: refused(
                lambda: client.register_system_shared_memory("r", "/k", 64), "shared memory is not taken"),
            "register_cuda_shared_memory": lambda: refused(
                lambda: client.register_cuda_shared_memory("r", b"handle", 0, 64), "shared memory is not taken"),
            "get_trace_settings": lambda: refused(client.get_trace_settings, "does not trace"),
            "update_trace_settings": lambda: refused(lambda: client.update_trace_settings(settings={"trace_rate": "1"}),
                                                     "does not trace"),
            "get_log_settings": lambda: refused(client.get_log_settings, "no log settings"),
            "update_log_settings": lambda: refused(lambda: client.update_log_settings({"log_info": True}),
                                                   "no log settings"),
            "load_model": lambda: refused(lambda: client.load_model("dlrm", config="{}"), "serves one model"),
            "unload_model": lambda: refused(lambda: client.unload_model("dlrm"), "serves one model"),
            "infer": lambda: np.allclose(scores(), want, atol=1e-7)
            and np.allclose(scores(request_compression_algorithm="gzip"), want, atol=1e-7)
            and np.allclose(scores(request_compression_algorithm="deflate"), want, atol=1e-7)
            and bool(refused(lambda: scores(outputs=[httpclient.InferRequestedOutput("logit")]), "unknown output"))
            and bool(refused(lambda: scores(outputs=[httpclient.InferRequestedOutput("probability", class_count=1)]),
                             "class_count")),
            "async_infer": lambda: np.allclose(client.async_infer("dlrm", inputs()).get_result().as_numpy(
                "probability"), want, atol=1e-7),
            "generate_request_body": lambda: np.allclose(round_trip(), want, atol=1e-7),
            "parse_response_body": lambda: np.allclose(round_trip(), want, atol=1e-7),  # a body the client made
            "register_plugin": lambda: client.register_plugin(Headers()) is None,  # (the client's own: headers added)
            "plugin": lambda: isinstance(client.plugin(), Headers) and np.allclose(scores(), want, atol=1e-7),
            "unregister_plugin": lambda: client.unregister_plugin() is None and client.plugin() is None,
        }  # fmt: skip
        methods = {n for n in dir(httpclient.InferenceServerClient) if not n.startswith("_") and n != "close"}
        assert methods == set(calls), sorted(methods ^ set(calls))  # every method the client has, none left out
        for name, call in calls.items():
            assert call(), name
        assert s.healthy()
    finally:
        client.close()
        s.stop()
