"""Serving commands: export, serve."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ctrkit.cli.options import add_config_flags, add_overwrite, add_threads, config_values
from ctrkit.config import EXPORT_FORMATS, QUANTIZATIONS, ServeConfig

SIGNATURE_TEXT = (
    "inputs 'numerical' (B, N) FP32 and 'categorical' (B, F) INT64 (ids outside a table map to its row 0, the "
    "missing/unseen id), with multi-hot features also 'multi_hot' (B, Fm, L) INT64 (each sample's ids per "
    "multi-hot feature, padded with -1); output 'probability' (B, 1) FP32"
)


def register(sub: argparse._SubParsersAction) -> None:
    _export(sub)
    _serve(sub)


def _export(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "export",
        help="a checkpoint as ONNX, TorchScript or a Triton model repository",
        description=f"Writes the model for serving: {SIGNATURE_TEXT}, dynamic batch. ONNX is loaded back in "
        "onnxruntime and compared with PyTorch (max abs diff printed).",
    )
    p.add_argument("--checkpoint", required=True, type=Path, help="checkpoint written by `ctrkit train`")
    p.add_argument("--format", required=True, choices=EXPORT_FORMATS, help="what to write")
    p.add_argument("--out", required=True, type=Path, help="directory to create")
    p.add_argument("--name", default=None, help="model name in a Triton repository (default: the model type)")
    p.add_argument(
        "--backend",
        choices=("onnx", "torchscript"),
        default="onnx",
        help="model file inside a Triton repository (default onnx)",
    )
    p.add_argument(
        "--quantize",
        choices=QUANTIZATIONS,
        default="none",
        help="int8: ONNX with int8 linear layers (onnxruntime dynamic quantization, per-batch activation scales; "
        "embeddings stay float32), for throughput on CPUs with int8 dot-product instructions. Default none",
    )
    add_overwrite(p)
    p.set_defaults(handler=export)


def export(args: argparse.Namespace) -> int:
    from ctrkit.export.exporter import export_checkpoint

    summary = export_checkpoint(
        args.checkpoint, args.out, args.format, args.name, args.backend, args.overwrite, args.quantize
    )
    kind = args.format + (f", {args.quantize}" if args.quantize != "none" else "")
    line = f"wrote {args.out} ({kind}): " + ", ".join(summary["files"])
    if "max_abs_diff_vs_pytorch" in summary:
        line += f"; onnxruntime vs PyTorch max abs diff {summary['max_abs_diff_vs_pytorch']:.2e}"
    print(line)
    return 0


def _serve(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve",
        help="a KServe v2 / Triton HTTP inference server",
        description="Serves a checkpoint (PyTorch) or an export (--model-dir: ONNX Runtime or TorchScript) over the "
        "KServe v2 HTTP protocol as Triton does: /v2/health/live, /v2/health/ready, /v2/models/NAME, "
        "/v2/models/NAME/ready, POST /v2/models/NAME/infer with JSON tensors or the binary-tensor extension (the "
        f"faster choice for clients). The model's {SIGNATURE_TEXT}. Concurrent requests are batched dynamically.",
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--checkpoint", type=Path, default=None, help="checkpoint written by `ctrkit train`")
    src.add_argument("--model-dir", type=Path, default=None, help="directory written by `ctrkit export`")
    add_config_flags(p, ServeConfig)
    add_threads(p)
    p.set_defaults(handler=serve)


def serve(args: argparse.Namespace) -> int:
    import torch

    from ctrkit.serve.predictor import load_predictor
    from ctrkit.serve.server import serve as run_server

    cfg = ServeConfig(**config_values(args, ServeConfig))
    cfg.validate()
    if args.threads:
        torch.set_num_threads(args.threads)
    predictor = load_predictor(
        args.checkpoint, args.model_dir, cfg.embedding_store, cfg.cache_rows, cfg.dtype, cfg.compile
    )
    name = cfg.name or predictor.meta["model_name"]
    print(
        f"serving {name} ({predictor.backend}) on http://{cfg.host}:{cfg.port}/v2/models/{name}/infer",
        file=sys.stderr,
        flush=True,
    )
    run_server(predictor, name, cfg.host, cfg.port, cfg.batch_window_ms, cfg.max_batch_size,
               int(cfg.max_body_mb * 2**20))  # fmt: skip
    return 0
