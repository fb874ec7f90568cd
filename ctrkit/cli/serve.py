"""Serving commands: export, serve."""

from __future__ import annotations

import argparse
import sys

from ctrkit.cli.options import add_command, config_from
from ctrkit.serve_config import ExportConfig, ServeConfig


def register(sub: argparse._SubParsersAction) -> None:
    add_command(sub, "export", export, (ExportConfig,))
    add_command(sub, "serve", serve, (ServeConfig,))


def export(args: argparse.Namespace) -> int:
    """a checkpoint as ONNX, TorchScript or a Triton model repository

    Writes the model for serving with its signature: inputs 'numerical' (B, N) FP32 and 'categorical'
    (B, F) INT64 (ids outside a table map to its row 0, the missing/unseen id), with multi-hot features
    also 'multi_hot' (B, Fm, L) INT64 (each sample's ids per multi-hot feature, padded with -1); output
    'probability' (B, 1) FP32; dynamic batch. ONNX is loaded back in onnxruntime and compared with
    PyTorch (max abs diff printed). A Triton export into an existing model repository adds the next
    version of the model (or --version N), leaving its other versions and the other models untouched.
    """
    from ctrkit.export.exporter import export_checkpoint

    cfg: ExportConfig = config_from(args, ExportConfig)
    if cfg.checkpoint is None or cfg.out is None or cfg.format is None:  # (required flags)
        raise ValueError("give --checkpoint, --out and --format")
    summary = export_checkpoint(cfg.checkpoint, cfg.out, cfg.format, cfg.name, cfg.backend, cfg.overwrite,
                                cfg.quantize, cfg.version)  # fmt: skip
    kind = cfg.format + (f", {cfg.quantize}" if cfg.quantize != "none" else "")
    if "version" in summary:
        kind += f", model '{summary['name']}' version {summary['version']}"
    line = f"wrote {cfg.out} ({kind}): " + ", ".join(summary["files"])
    if "max_abs_diff_vs_pytorch" in summary:
        line += f"; onnxruntime vs PyTorch max abs diff {summary['max_abs_diff_vs_pytorch']:.2e}"
    print(line)
    return 0


def serve(args: argparse.Namespace) -> int:
    """a KServe v2 / Triton HTTP inference server

    Serves a checkpoint (PyTorch), an export (--model-dir: ONNX Runtime or TorchScript) or a Triton-layout
    model repository (--model-repository: several models and numbered versions, with the repository
    extension's index, load and unload) over the KServe v2 HTTP protocol as Triton does: /v2/health/live,
    /v2/health/ready, /v2/models/NAME[/versions/V], .../ready, POST .../infer with JSON tensors or the
    binary-tensor extension (the faster choice for clients), with the signature `ctrkit export`
    describes; GET /metrics in Prometheus format with Triton's metric names. A model that carries its
    preprocessing (trained on a `preprocess table` dataset) takes the raw values of the training table's
    columns by name (text as BYTES, numbers as INT64 or FP32, one [B, 1] input a column; --missing-columns
    says what a column left out means), as `predict --input` reads a file; any model takes the id inputs
    (numerical, categorical, multi_hot). Concurrent requests are batched dynamically.
    """
    import torch

    from ctrkit.serve.predictor import load_predictor
    from ctrkit.serve.server import bind
    from ctrkit.serve.server import serve as run_server

    cfg: ServeConfig = config_from(args, ServeConfig)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    if cfg.model_repository is not None:
        from ctrkit.serve.repository import ModelRepository

        if cfg.embedding_store != "memory" or cfg.dtype != "fp32" or cfg.compile or cfg.name:
            raise ValueError("`embedding_store` mmap, `dtype` bf16, `compile` and `name` apply to a `checkpoint`, "
                             "not to a model repository")  # fmt: skip
        repository = ModelRepository(cfg.model_repository)
        sock = bind(cfg.host, cfg.port)
        base = f"http://{cfg.host}:{sock.getsockname()[1]}/v2/models"
        names = repository.names()
        print(
            f"serving the model repository {cfg.model_repository} ({', '.join(names)}): POST {base}/{names[0]}/infer; "
            f"its inputs: GET {base}/{names[0]}",
            file=sys.stderr,
            flush=True,
        )
        run_server(None, "", cfg.host, cfg.port, cfg.batch_window_ms, cfg.max_batch_size,
                   int(cfg.max_body_mb * 2**20), sock=sock, repository=repository,
                   body_timeout_s=cfg.body_timeout_s, missing_columns=cfg.missing_columns,
                   header_timeout_s=cfg.header_timeout_s, poll_s=cfg.poll_s, bad_values=cfg.bad_values)  # fmt: skip
        return 0
    predictor = load_predictor(cfg.checkpoint, cfg.model_dir, cfg.embedding_store, cfg.cache_rows, cfg.dtype,
                               cfg.compile)  # fmt: skip
    name = cfg.name or predictor.meta["model_name"]
    sock = bind(cfg.host, cfg.port)  # a busy port fails here, before anything says it is serving
    url = f"http://{cfg.host}:{sock.getsockname()[1]}/v2/models/{name}"
    print(f"serving {name} ({predictor.backend}): POST {url}/infer; its inputs: GET {url}", file=sys.stderr, flush=True)
    run_server(predictor, name, cfg.host, cfg.port, cfg.batch_window_ms, cfg.max_batch_size,
               int(cfg.max_body_mb * 2**20), sock=sock, body_timeout_s=cfg.body_timeout_s,
               missing_columns=cfg.missing_columns, header_timeout_s=cfg.header_timeout_s,
               bad_values=cfg.bad_values)  # fmt: skip
    return 0
