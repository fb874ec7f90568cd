"""Typed, frozen configuration of export and serving; the flags are generated from these dataclasses as from
``config.py``'s."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ctrkit.config import BAD_VALUES, EXPORT_FORMATS, QUANTIZATIONS, option
from ctrkit.field_types import SECONDS, THREADS, Range, check_ranges


@dataclass(frozen=True)
class ServeConfig:
    """How ``ctrkit serve`` runs a model: a checkpoint's (PyTorch) or an export's."""

    checkpoint: Path | None = option(None, "checkpoint written by `ctrkit train`", exclusive="source", required=True)
    model_dir: Path | None = option(None, "directory written by `ctrkit export`", exclusive="source")
    model_repository: Path | None = option(
        None,
        "a Triton-layout model repository (NAME/config.pbtxt, NAME/1/, NAME/2/, ...: `ctrkit export --format "
        "triton` directories put side by side): every model and version, the newest where a request names none, "
        "with the repository extension's index, load and unload",
        exclusive="source",
    )
    poll_s: float = option(
        0.0,
        "with --model-repository: every this many seconds, load the versions placed in the repository (or "
        "removed) since, the old versions answering until the new ones serve (Triton's POLL mode; 0: never, load on "
        "request only)",
        bounds=Range(0, 86400, unit="seconds; 0: never"),
    )
    host: str = option("127.0.0.1", "address to bind (127.0.0.1: this machine only)")
    port: int = option(8000, "TCP port, 0 to 65535 (0: any free one)", bounds=Range(0, 65535))
    name: str | None = option(None, "model name in the URLs", unset="the model type, e.g. dlrm")
    batch_window_ms: float = option(
        1.0,
        "how long a request may wait for others to be scored with it",
        bounds=Range(0, 1000, unit="milliseconds"),
    )
    max_batch_size: int = option(8192, "samples per model call and request", bounds=Range(1, 2**31 - 1))
    max_body_mb: float = option(
        64.0,
        "largest request body accepted, in MB",
        bounds=Range(0, 65536, lo_open=True, unit="MB"),
    )
    body_timeout_s: float = option(
        30.0,
        "seconds a request's body may take to arrive whole; a slower one gets a 408 and its connection is closed",
        bounds=SECONDS,
    )
    header_timeout_s: float = option(
        10.0,
        "seconds a connection may take to send a request's headers whole (the first, or the next on a kept-alive "
        "connection); a slower one is closed unanswered, so connections that never finish a header cannot hold the "
        "server",
        bounds=SECONDS,
    )
    embedding_store: str = option(
        "memory",
        "memory: tables in RAM; mmap: tables stay in the memory-mapped checkpoint and only cache_rows hot rows are "
        "kept in memory, so tables larger than RAM can be served (checkpoints only)",
        ("memory", "mmap"),
    )
    cache_rows: int = option(1 << 20, "rows of each mmap store cache, one per table collection", bounds=Range(0, 2**62))
    dtype: str = option(
        "fp32",
        "weights of a checkpoint's model: fp32, or bf16 (fast where the CPU has native bf16 instructions)",
        ("fp32", "bf16"),
    )
    compile: bool = option(
        False,
        "run a checkpoint's model through torch.compile with weight freezing (the first requests of each new "
        "shape wait for compilation)",
    )
    threads: int | None = option(None, "torch intra-op threads", unset="torch's choice", bounds=THREADS)
    missing_columns: str = option(
        "error",
        "a raw column the model reads, left out of a request: error (a 400 naming it) or missing (missing in every "
        "row); columns the model does not read are ignored. predict --input follows the same rule",
        ("error", "missing"),
    )
    bad_values: str = option(
        "error",
        "a raw value preprocessing refuses (text for a number, a number beyond float32, a timestamp not of the "
        "column's format): error (a 400 naming its row and column) or missing (scored as missing; the response's "
        "parameter bad_values_missing counts them). predict --input follows the same rule",
        BAD_VALUES,
    )

    def validate(self) -> None:
        check_ranges(self)
        if self.poll_s and self.model_repository is None:
            raise ValueError("`poll_s` applies to a --model-repository")


@dataclass(frozen=True)
class ExportConfig:
    """``ctrkit export``: which checkpoint, in which format, where."""

    checkpoint: Path | None = option(None, "checkpoint written by `ctrkit train`", required=True)
    format: str | None = option(None, "what to write", EXPORT_FORMATS, required=True)
    out: Path | None = option(
        None,
        "directory to create; for triton, the model repository to create or add a version to",
        required=True,
        writes="file",
    )
    name: str | None = option(None, "model name in a Triton repository", unset="the model type")
    version: int | None = option(
        None,
        "triton: the version to write; an existing one is replaced only with --overwrite",
        unset="one after the model's newest version in the repository (1 for a new model)",
        bounds=Range(1, 2**63 - 1),
    )
    backend: str = option(
        "onnx",
        "the model of a Triton repository: onnx (ONNX Runtime: what NVIDIA's Triton containers serve, no Python in "
        "the serving path), torchscript (LibTorch), or python (Triton's Python backend running the ONNX model behind "
        "the preprocessing the checkpoint carries: raw values in; the one a Triton without the onnxruntime backend, "
        "such as `make triton`'s CPU build, serves)",
        ("onnx", "torchscript", "python"),
    )
    quantize: str = option(
        "none",
        "int8: ONNX with int8 linear layers (onnxruntime dynamic quantization, per-batch activation scales; "
        "embeddings stay float32), for throughput on CPUs with int8 dot-product instructions",
        QUANTIZATIONS,
    )
    overwrite: bool = option(False, "replace an existing output directory (triton: an existing --version)")
