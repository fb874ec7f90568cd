"""Benchmark commands: bench train, preprocess, scale, inference."""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from ctrkit.cli.options import (
    add_device,
    add_output,
    add_seed,
    add_threads,
    config_values,
    int_list,
    name_list,
    write_result,
)
from ctrkit.config import DENSE_OPTIMIZERS, TABLE_OPTIMIZERS


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="benchmarks (training, preprocessing, hybrid-parallel scaling)")
    bsub = p.add_subparsers(
        dest="bench", required=True, metavar="{train,preprocess,scale,inference}", help="what to measure"
    )
    _inference(bsub)
    _scale(bsub)
    _preprocess(bsub)
    _train(bsub)


def _inference(bsub: argparse._SubParsersAction) -> None:
    inf = bsub.add_parser(
        "inference",
        help="inference samples/s and latency per batch size, in process per runtime or through a server",
        description="In process: scores pre-built batches with each of --runtimes for about --seconds per batch "
        "size, the runtimes taking turns for --repeats rounds (samples/s is the median over rounds, with the ratio "
        "to torch fp32 of the same round). With --server: sends --requests binary-tensor requests per batch size "
        "from --concurrency tritonclient clients to a running `ctrkit serve`. Reports samples/s and latency "
        "p50/p90/p99, and the machine's load average before and after (other work competing for the cores).",
    )
    src = inf.add_mutually_exclusive_group(required=True)
    src.add_argument("--checkpoint", type=Path, default=None, help="checkpoint to score in process")
    src.add_argument(
        "--kaggle-shape",
        action="store_true",
        help="a randomly initialised DLRM of the Criteo-Kaggle shape (26 x 100,000 x 16) instead of a checkpoint",
    )
    src.add_argument("--server", default=None, help="host:port of a running `ctrkit serve` to measure through")
    inf.add_argument("--model", default="dlrm", help="model name on the server (default dlrm)")
    inf.add_argument(
        "--batch-sizes", type=int_list, default="1,64,4096", help="comma-separated batch sizes (default 1,64,4096)"
    )
    inf.add_argument(
        "--runtimes",
        type=name_list,
        default="torch,torch-bf16,torch-bf16-compiled,onnx,onnx-int8,torchscript",
        help="in-process runtimes: torch (fp32), torch-bf16 (bf16 weights), torch-bf16-compiled (torch.compile with "
        "weight freezing), onnx (ONNX Runtime), onnx-int8 (ONNX Runtime, int8 linear layers), torchscript "
        "(default: all)",
    )
    inf.add_argument("--seconds", type=float, default=2.0, help="in process: time per batch size (default 2)")
    inf.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="in process: rounds over all runtimes; the median is reported (default 1)",
    )
    inf.add_argument("--requests", type=int, default=2000, help="server: requests per batch size (default 2000)")
    inf.add_argument("--concurrency", type=int, default=8, help="server: concurrent clients (default 8)")
    add_threads(inf)
    add_output(inf)
    inf.set_defaults(handler=inference)


def inference(args: argparse.Namespace) -> int:
    import torch

    from ctrkit.bench.inference_bench import (
        check_in_process_args,
        environment,
        kaggle_checkpoint,
        run_in_process,
        run_through_server,
    )

    if args.threads:
        torch.set_num_threads(args.threads)
    before = environment()
    if min(args.batch_sizes) < 1:
        raise ValueError(f"--batch-sizes: expected positive integers, got {list(args.batch_sizes)}")
    if args.server is not None:
        if args.requests < 1 or args.concurrency < 1:
            raise ValueError("--requests and --concurrency must be >= 1")
        results = run_through_server(args.server, args.model, args.batch_sizes, args.requests, args.concurrency)
    else:
        check_in_process_args(args.runtimes, args.repeats)  # before building a Kaggle-shape checkpoint
        with tempfile.TemporaryDirectory(prefix="ctrkit-kaggle-") as tmp:
            ckpt = args.checkpoint or kaggle_checkpoint(Path(tmp) / "dlrm_kaggle.pt")
            results = run_in_process(ckpt, args.batch_sizes, args.runtimes, args.seconds, repeats=args.repeats)
    for r in results:
        where = r.get("runtime", f"server {r.get('url')} x{r.get('concurrency')}")
        ratio = f"  ({r['vs_torch']:.2f}x torch fp32)" if "vs_torch" in r else ""
        print(
            f"{where:>24} batch {r['batch_size']:>6}: {r['samples_per_s']:>12,.0f} samples/s  p50 "
            f"{r['p50_ms']:.3f} ms  p90 {r['p90_ms']:.3f} ms  p99 {r['p99_ms']:.3f} ms{ratio}"
        )
    after = environment()
    print(f"load average (1 min) before {before['load_average_1min']:.2f}, after {after['load_average_1min']:.2f}")
    env = {**after, "load_average_1min_before": before["load_average_1min"]}
    write_result({"results": results, "environment": env}, args.output)
    return 0


def _scale(bsub: argparse._SubParsersAction) -> None:
    sc = bsub.add_parser(
        "scale",
        help="step time per world size on the Merlin synthetic models, scaled down",
        description="The Merlin Distributed-Embeddings synthetic DLRMs (tiny 55 tables 4.2 GiB, small 107 / 26.3, "
        "medium 311 / 206.2, large 612 / 773.8, jumbo 1,022 / 3,109.5 GiB) divided in size by --scale, power-law "
        "table sizes and ids, Adagrad; each world size runs as its own job (torchrun above 1 rank), the cores "
        "split between its ranks. Reports the median step time.",
    )
    sc.add_argument(
        "--models", type=name_list, default="tiny,small", help="comma-separated synthetic models (default tiny,small)"
    )
    sc.add_argument("--scale", type=float, default=1024.0, help="divide every model's size by this (default 1024)")
    sc.add_argument("--world-sizes", type=int_list, default="1,2", help="comma-separated world sizes (default 1,2)")
    sc.add_argument("--embedding-dim", type=int, default=32, help="embedding width (default 32)")
    sc.add_argument("--batch-size", type=int, default=4096, help="global samples per step (default 4096)")
    sc.add_argument("--warmup", type=int, default=3, help="untimed steps (default 3)")
    sc.add_argument("--steps", type=int, default=15, help="timed steps; the median is reported (default 15)")
    sc.add_argument("--sharding", choices=("auto", "table", "column", "row"), default="auto", help="(default auto)")
    add_seed(sc, "seed of the synthetic batches")
    add_output(sc)
    sc.add_argument("--worker-output", type=Path, default=None, help=argparse.SUPPRESS)  # set for each job
    sc.set_defaults(handler=scale)


def scale(args: argparse.Namespace) -> int:
    from ctrkit.bench.scale_bench import ScaleBenchConfig, run_scale_bench, run_worker
    from ctrkit.distributed.env import init_distributed, launched_by_torchrun

    def config(model: str) -> ScaleBenchConfig:
        return ScaleBenchConfig(
            model, args.scale, args.embedding_dim, args.batch_size, args.warmup, args.steps, args.sharding, args.seed
        )

    if args.worker_output is not None:  # one job of the benchmark (every rank of it)
        env = init_distributed("cpu") if launched_by_torchrun() else None
        result = run_worker(config(args.models[0]), env)
        if env is None or env.is_main:
            args.worker_output.write_text(json.dumps(result))
        return 0
    results = []
    for model in args.models:
        for r in run_scale_bench(config(model), list(args.world_sizes)):
            results.append(r)
            print(
                f"{model} ({r['tables']} tables, {r['embedding_mib']:.1f} MiB at 1/{args.scale:g}), world size "
                f"{r['world_size']}: {r['ms_per_step']:.1f} ms/step, {r['samples_per_s']:,.0f} samples/s"
            )
    write_result(results, args.output)
    return 0


def _preprocess(bsub: argparse._SubParsersAction) -> None:
    pp = bsub.add_parser(
        "preprocess",
        help="preprocessing rows/s and peak RSS",
        description="Runs `ctrkit preprocess criteo` as a child process on a generated raw Criteo file (or "
        "--input) and reports end-to-end rows/s and the child's peak RSS.",
    )
    pp.add_argument("--rows", type=int, default=2_000_000, help="raw rows to generate (default 2000000)")
    pp.add_argument("--input", type=Path, default=None, help="use this raw file instead of generating one")
    pp.add_argument(
        "--engine", default="polars", choices=("polars", "spark"), help="preprocessing engine (default polars)"
    )
    pp.add_argument("--spark-master", default="local[*]", help="Spark master URL for --engine spark (default local[*])")
    add_seed(pp, "seed of the generated file")
    pp.add_argument("--repeats", type=int, default=1, help="runs to take the median time of (default 1)")
    add_output(pp)
    pp.set_defaults(handler=preprocess)


def preprocess(args: argparse.Namespace) -> int:
    from ctrkit.bench.preprocess_bench import run_preprocess_bench

    result = run_preprocess_bench(args.rows, args.input, args.engine, args.seed, args.spark_master, args.repeats)
    print(
        f"preprocess criteo ({result['engine']}): {result['rows']:,} rows in {result['seconds']:.1f} s "
        f"(median of {result['repeats']}) = "
        f"{result['rows_per_s']:,.0f} rows/s, peak RSS {result['peak_rss_mb']:,.0f} MB"
    )
    write_result(result, args.output)
    return 0


def _train(bsub: argparse._SubParsersAction) -> None:
    t = bsub.add_parser(
        "train",
        help="training throughput on synthetic in-memory batches",
        description="Times full training steps (forward, backward, sparse SGD update) on "
        "synthetic in-memory batches. Default: the Criteo-Kaggle DLRM shape "
        "(26 tables x 100,000 rows, dim 16, bottom 13-512-256-64-16, top "
        "512-256-1, batch 2048).",
    )
    t.add_argument("--model", default="dlrm", help="registered model name (default dlrm)")
    t.add_argument("--batch-size", type=int, default=2048, help="samples per step (default 2048)")
    t.add_argument("--num-tables", type=int, default=26, help="categorical features (default 26)")
    t.add_argument("--table-rows", type=int, default=100_000, help="rows per table (default 100000)")
    t.add_argument("--embedding-dim", type=int, default=16, help="embedding width (default 16)")
    t.add_argument("--num-numerical", type=int, default=13, help="numerical features (default 13)")
    t.add_argument("--bottom-mlp", type=int_list, default=None, help="bottom MLP widths (default: the model's)")
    t.add_argument("--top-mlp", type=int_list, default=None, help="top MLP widths (default: the model's)")
    t.add_argument("--warmup", type=int, default=10, help="untimed steps first (default 10)")
    t.add_argument("--steps", type=int, default=50, help="timed steps per repeat (default 50)")
    t.add_argument("--repeats", type=int, default=5, help="timed repeats; the median is reported (default 5)")
    t.add_argument("--amp", action="store_true", help="bf16 autocast (CPU) / fp16 (CUDA)")
    t.add_argument(
        "--dense-gradients",
        action="store_true",
        help="dense embedding gradients (the plain-PyTorch baseline) instead of sparse ones",
    )
    t.add_argument("--optimizer", choices=DENSE_OPTIMIZERS, default=None, help="dense optimizer (default: the model's)")
    t.add_argument(
        "--embedding-optimizer",
        choices=TABLE_OPTIMIZERS,
        default=None,
        help="embedding optimizer (default: the model's)",
    )
    t.add_argument("--compile", action="store_true", help="torch.compile the model (compile time is in the warm-up)")
    add_threads(t)
    add_device(t)
    add_seed(t)
    add_output(t)
    t.set_defaults(handler=train)


def train(args: argparse.Namespace) -> int:
    import torch

    from ctrkit.bench.train_bench import TrainBenchConfig, run_train_bench
    from ctrkit.device import resolve_device

    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = TrainBenchConfig(**config_values(args, TrainBenchConfig))
    result = run_train_bench(cfg, resolve_device(args.device))
    print(
        f"{cfg.model} train, batch {cfg.batch_size}, {'amp ' + result['amp_dtype'] if cfg.amp else 'fp32'}, "
        f"optimizers {result['optimizers']['dense']}/{result['optimizers']['embedding']}, "
        f"{result['threads']} threads: {result['samples_per_s']:,.0f} samples/s (median of {cfg.repeats}), "
        f"{result['ms_per_step']:.2f} ms/step"
    )
    write_result(result, args.output)
    return 0
