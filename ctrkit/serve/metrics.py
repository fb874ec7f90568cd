"""Prometheus metrics of the inference server, under Triton's metric names where Triton has one.

Per model and version: request successes and failures, inferences (samples) and executions (model
calls), and the cumulative request, queue and compute durations in microseconds, as Triton reports
them (a request's queue time ends and its compute time is its batch's model call, so requests scored
together each count the whole call, as in Triton). Triton has no batch-size metric; ctrkit adds the
histogram ``ctrkit_inference_batch_size`` of the samples per model call. Rendered in the Prometheus text
exposition format (version 0.0.4) at ``GET /metrics``; updated from the server's event loop only.
"""

from __future__ import annotations

from collections import defaultdict

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

COUNTERS = {
    "nv_inference_request_success": "Number of successful inference requests, all batch sizes",
    "nv_inference_request_failure": "Number of failed inference requests, all batch sizes",
    "nv_inference_count": "Number of inferences performed (samples: a request of 4 samples counts 4)",
    "nv_inference_exec_count": "Number of model executions performed (batches of requests scored together)",
    "nv_inference_request_duration_us": "Cumulative inference request duration in microseconds",
    "nv_inference_queue_duration_us": "Cumulative inference queuing duration in microseconds",
    "nv_inference_compute_infer_duration_us": "Cumulative compute inference duration in microseconds",
}
BATCH_SIZE = "ctrkit_inference_batch_size"
BATCH_BUCKETS = tuple(float(1 << k) for k in range(0, 17))  # 1, 2, 4, ..., 65,536 samples


class ServerMetrics:
    """Counters and the batch-size histogram, keyed by (model, version)."""

    def __init__(self) -> None:
        self.counters: dict[str, dict[tuple[str, str], float]] = {name: defaultdict(float) for name in COUNTERS}
        self.batches: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0] * len(BATCH_BUCKETS))
        self.batch_sum: dict[tuple[str, str], float] = defaultdict(float)
        self.batch_count: dict[tuple[str, str], int] = defaultdict(int)

    def add(self, name: str, key: tuple[str, str], value: float = 1.0) -> None:
        self.counters[name][key] += value

    def request(self, key: tuple[str, str], ok: bool, seconds: float) -> None:
        """One inference request answered (``ok``) or failed, ``seconds`` from arrival to the answer."""
        self.add("nv_inference_request_success" if ok else "nv_inference_request_failure", key)
        self.add("nv_inference_request_duration_us", key, seconds * 1e6)

    def execution(self, key: tuple[str, str], samples: int, queued_s: list[float], compute_s: float) -> None:
        """One model call on ``samples`` samples for requests that waited ``queued_s`` each."""
        self.add("nv_inference_exec_count", key)
        self.add("nv_inference_count", key, samples)
        self.add("nv_inference_queue_duration_us", key, sum(queued_s) * 1e6)
        self.add("nv_inference_compute_infer_duration_us", key, compute_s * 1e6 * len(queued_s))
        buckets = self.batches[key]
        for i, bound in enumerate(BATCH_BUCKETS):
            if samples <= bound:
                buckets[i] += 1
        self.batch_sum[key] += samples
        self.batch_count[key] += 1

    def ensure(self, key: tuple[str, str]) -> None:
        """Every series of a served model exists (at 0) from its start, as Triton reports them."""
        for name in COUNTERS:
            self.counters[name][key] += 0.0
        self.batches[key]  # noqa: B018 - creates the zero histogram
        self.batch_sum[key] += 0.0
        self.batch_count[key] += 0

    def render(self) -> str:
        lines: list[str] = []
        for name, help_text in COUNTERS.items():
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} counter"]
            lines += [f"{name}{_labels(key)} {_number(v)}" for key, v in sorted(self.counters[name].items())]
        lines += [f"# HELP {BATCH_SIZE} Samples per model execution", f"# TYPE {BATCH_SIZE} histogram"]
        for key in sorted(self.batches):
            for bound, n in zip(BATCH_BUCKETS, self.batches[key]):
                lines.append(f"{BATCH_SIZE}_bucket{_labels(key, le=_number(bound))} {n}")
            lines.append(f"{BATCH_SIZE}_bucket{_labels(key, le='+Inf')} {self.batch_count[key]}")
            lines.append(f"{BATCH_SIZE}_sum{_labels(key)} {_number(self.batch_sum[key])}")
            lines.append(f"{BATCH_SIZE}_count{_labels(key)} {self.batch_count[key]}")
        return "\n".join(lines) + "\n"


def _labels(key: tuple[str, str], **extra: str) -> str:
    pairs = {"model": key[0], "version": key[1], **extra}
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in pairs.items()) + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))
