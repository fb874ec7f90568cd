"""`GET /metrics`: Prometheus text with Triton's metric names, read back with the Prometheus client
library's own parser; the counters equal what was sent to the real server on 127.0.0.1."""

import json
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families

from ctrkit.data.dataset import SplitBinaryDataset
from tests.serve.test_server import Server, infer, request_body


def scrape(server) -> dict[str, dict]:
    with urllib.request.urlopen(f"http://{server.url}/metrics", timeout=5) as r:
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = r.read().decode()
    samples: dict[str, dict] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:  # the parser names a counter's samples NAME_total; Triton's are NAME
            assert s.labels["model"] == "dlrm" and s.labels["version"] == "1", s
            name = family.name if family.type == "counter" else s.name
            samples.setdefault(name, {})[s.labels.get("le")] = s.value
    return samples


def test_metrics_count_what_was_sent(tiny_checkpoint, tiny_dataset):
    batch = SplitBinaryDataset(tiny_dataset, "test").slice(0, 64)
    numerical, categorical = batch.numerical.numpy(), batch.categorical.numpy()
    server = Server("--checkpoint", tiny_checkpoint, "--batch-window-ms", "5")
    try:
        before = scrape(server)
        assert (
            before["nv_inference_request_success"][None] == 0 and before["ctrkit_inference_batch_size_count"][None] == 0
        )
        sizes = [1 + (k % 7) for k in range(48)]  # 48 requests of 1..7 samples from 6 concurrent clients

        def send(k):
            client = httpclient.InferenceServerClient(server.url)
            n = sizes[k]
            return len(infer(client, numerical[:n], categorical[:n], binary=k % 2 == 0))

        with ThreadPoolExecutor(6) as pool:
            assert sum(pool.map(send, range(len(sizes)))) == sum(sizes)
        bad = json.loads(request_body(numerical[:2], categorical[:2]))
        bad["inputs"][0]["shape"] = [2, 99]
        for _ in range(3):
            assert server.post(json.dumps(bad).encode())[0] == 400
        assert server.post(request_body(numerical[:2], categorical[:2]), model="other")[0] == 404  # no such model

        m = scrape(server)
        assert m["nv_inference_request_success"][None] == len(sizes)
        assert m["nv_inference_request_failure"][None] == 3
        assert m["nv_inference_count"][None] == sum(sizes)  # samples
        executions = m["nv_inference_exec_count"][None]
        assert 1 <= executions <= len(sizes)  # concurrent requests share model calls
        assert m["ctrkit_inference_batch_size_count"][None] == executions
        assert m["ctrkit_inference_batch_size_sum"][None] == sum(sizes)
        assert m["ctrkit_inference_batch_size_bucket"]["+Inf"] == executions
        buckets = [m["ctrkit_inference_batch_size_bucket"][le] for le in sorted(
            (k for k in m["ctrkit_inference_batch_size_bucket"] if k != "+Inf"), key=float)]  # fmt: skip
        assert buckets == sorted(buckets)  # cumulative
        assert m["ctrkit_inference_batch_size_bucket"]["1"] <= sizes.count(1)
        for name in ("nv_inference_request_duration_us", "nv_inference_queue_duration_us",
                     "nv_inference_compute_infer_duration_us"):  # fmt: skip
            assert m[name][None] > 0, name
        # a request's end-to-end time includes its queueing and its batch's compute
        assert m["nv_inference_request_duration_us"][None] >= m["nv_inference_queue_duration_us"][None]
        assert np.isfinite(list(m["nv_inference_request_duration_us"].values())).all()
    finally:
        server.stop()
