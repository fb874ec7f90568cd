"""The ``ctrkit`` command line: the only place that parses arguments."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from ctrkit import __version__

EXIT_USER_ERROR = 2


def _int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.replace(" ", "").split(",") if x)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got '{text}'") from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one integer")
    return values


def _add_synth(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "synth",
        help="write synthetic data: a Criteo-like or Outbrain-like dataset, or raw Criteo TSV",
        description="criteo-like (default): train/ and test/ split-binary mappings with power-law ids and a "
        "planted click signal (per-id effects, pairwise latent interactions, nonlinear numerical effects). "
        "outbrain: displays of 2-12 ads with one click each, multi-hot topics and display ids for MAP@12. "
        "criteo: the same click model as raw Criteo-format TSV, for `ctrkit preprocess criteo`.",
    )
    p.add_argument(
        "kind",
        nargs="?",
        choices=("criteo-like", "outbrain", "criteo"),
        default="criteo-like",
        help="criteo-like (default): a split-binary dataset of 13 numerical + 26 categorical features; "
        "outbrain: displays of 2-12 ads with one click each, request- and item-level features, two multi-hot, "
        "display ids for MAP@12; criteo: raw Criteo-format TSV (--out names a file; .gz to compress)",
    )
    p.add_argument("--out", required=True, type=Path, help="dataset directory to create (a file for criteo)")
    p.add_argument("--rows", type=int, default=300_000, help="about this many samples, train + test (default 300000)")
    p.add_argument(
        "--tables",
        type=_int_list,
        default=None,
        help="comma-separated cardinalities of the categorical features (default: 26 Criteo-like "
        "tables of 3 to 200,000 rows)",
    )
    p.add_argument("--num-numerical", type=int, default=13, help="numerical features (default 13)")
    p.add_argument("--test-fraction", type=float, default=0.1, help="share of rows in test/ (default 0.1)")
    p.add_argument("--seed", type=int, default=0, help="random seed of the click model and samples (default 0)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing dataset directory")


def _add_preprocess(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "preprocess",
        help="raw click logs -> a split-binary dataset",
        description="Runs a preprocessing recipe on raw logs and writes a ctrkit dataset (split binary + "
        "feature_spec.yaml), the vocabularies (vocab/<column>.parquet: value, count, id) and summary.json.",
    )
    psub = p.add_subparsers(dest="recipe", required=True, metavar="{criteo}", help="the raw format and its recipe")
    c = psub.add_parser(
        "criteo",
        help="Criteo TSV: label, 13 integers, 26 hashed categories",
        description="Criteo recipe: integers x -> log(max(x, -2) + 3), missing -> 0; categories seen fewer than "
        "--frequency-threshold times in the train split share the rare id 1, the others get ids from 2 by "
        "descending frequency (ties by value), id 0 is missing/unseen; the test split uses the train "
        "vocabulary. Categories are hexadecimal numbers of 1 to 15 digits (case does not matter).",
    )
    c.add_argument("raw", nargs="+", type=Path, help="raw TSV files (plain or .gz) of the train split, in order")
    c.add_argument("--out", required=True, type=Path, help="dataset directory to create")
    split = c.add_mutually_exclusive_group()
    split.add_argument("--test-files", nargs="+", type=Path, default=None, help="raw files of the test split")
    split.add_argument(
        "--test-fraction", type=float, default=None, help="last fraction of the rows as the test split (default 0.1)"
    )
    c.add_argument("--frequency-threshold", type=int, default=3, help="FL: rarer categories share one id (default 3)")
    c.add_argument(
        "--bad-rows",
        choices=("error", "skip"),
        default="error",
        help="error (default): stop at the first malformed row, naming file and line; skip: drop and count "
        "them, keeping the first 20 in rejects.jsonl",
    )
    c.add_argument(
        "--engine",
        choices=("polars", "spark"),
        default="polars",
        help="polars (default): embedded, streaming, memory bounded; spark: Apache Spark (pip install "
        "'ctrkit[spark]'), for data that outgrows one machine. Both write byte-identical datasets",
    )
    c.add_argument(
        "--spark-master",
        default="local[*]",
        help="Spark master URL for --engine spark (default local[*]: all cores of this machine)",
    )
    c.add_argument("--overwrite", action="store_true", help="replace an existing dataset directory")
    c.add_argument("--no-progress", action="store_true", help="no progress bars")


def _add_transcode(sub: argparse._SubParsersAction) -> None:
    t = sub.add_parser(
        "transcode",
        help="CSV/Parquet + feature_spec.yaml -> split binary",
        description="Converts a dataset whose feature_spec.yaml describes CSV (headerless, one column per feature "
        "in the chunk's order) or Parquet chunks into split binary with a new feature_spec.yaml; "
        "'cardinality: auto' is inferred as the largest id + 1.",
    )
    t.add_argument("--input", required=True, type=Path, help="directory holding feature_spec.yaml and the data")
    t.add_argument("--output", required=True, type=Path, help="dataset directory to create")
    t.add_argument("--overwrite", action="store_true", help="replace an existing output directory")
    t.add_argument(
        "--chunk-size",
        type=int,
        default=1 << 20,
        help="rows read and written at a time; memory stays bounded by it, not by the data (default 1048576)",
    )
    g = sub.add_parser(
        "gen-csv",
        help="random CSV data matching a CSV-type feature spec",
        description="Writes the CSV files a feature spec's source_spec names, with ids in range and labels of "
        "both classes, plus a copy of the spec, for trying `ctrkit transcode`.",
    )
    g.add_argument("--feature-spec", required=True, type=Path, help="a feature_spec.yaml with csv chunks")
    g.add_argument("--out", required=True, type=Path, help="directory for the CSV files and the spec")
    g.add_argument("--rows", type=int, default=1000, help="rows per mapping (default 1000)")
    g.add_argument("--seed", type=int, default=0, help="random seed (default 0)")


def _add_train(sub: argparse._SubParsersAction) -> None:
    from ctrkit.config import TrainConfig

    d = TrainConfig()
    S = argparse.SUPPRESS  # training options absent from the command line come from --config, then defaults
    p = sub.add_parser(
        "train",
        help="train a model on a dataset",
        description="Trains a model on the 'train' mapping of a split-binary dataset with the model's optimizers "
        "(sparse embedding updates), evaluating on 'test'. The LR schedule warms up linearly, holds, then decays "
        "polynomially; unset schedule flags are derived from the run length (5% warmup, decay over the last "
        "half). Settings resolve as: flags, then --config, then the model's defaults; the resolved run is "
        "written beside the checkpoint as YAML, which --config accepts back.",
    )
    p.add_argument(
        "--config",
        type=Path,
        default=None,
        help="run YAML (model, model_config, train_config, dataset), e.g. the one written beside a checkpoint",
    )
    p.add_argument("--model", default=S, help="dlrm (default), dcnv2 or wide_deep; `ctrkit models` lists them")
    p.add_argument("--dataset", type=Path, default=S, help="dataset directory holding feature_spec.yaml")
    p.add_argument(
        "--model-config",
        type=Path,
        default=None,
        help="YAML file of model config fields (e.g. embedding_dim, bottom_mlp, top_mlp)",
    )
    p.add_argument("--embedding-dim", type=int, default=None, help="embedding width D (default 16)")
    p.add_argument(
        "--bottom-mlp",
        type=_int_list,
        default=None,
        help="bottom MLP widths, last = embedding dim (default 512,256,64,16)",
    )
    p.add_argument("--top-mlp", type=_int_list, default=None, help="top MLP widths, last = 1 (default 512,256,1)")
    p.add_argument("--epochs", type=int, default=S, help=f"passes over the training data (default {d.epochs})")
    p.add_argument("--max-steps", type=int, default=S, help="stop after this many steps in total")
    p.add_argument("--batch-size", type=int, default=S, help="samples per step (default: the model's; 128 for dlrm)")
    p.add_argument(
        "--eval-batch-size",
        type=int,
        default=S,
        help=f"samples per forward pass in evaluation (default {d.eval_batch_size})",
    )
    p.add_argument("--lr", type=float, default=S, help="peak learning rate of the dense part (default: the model's)")
    p.add_argument(
        "--optimizer",
        choices=("sgd", "adagrad", "adam"),
        default=S,
        help="optimizer of the dense part (default: the model's; `ctrkit models` shows it)",
    )
    p.add_argument(
        "--embedding-optimizer",
        choices=("sgd", "adagrad", "rowwise_adagrad", "adam"),
        default=S,
        help="optimizer of the embedding tables, always with sparse row updates (default: the model's)",
    )
    p.add_argument(
        "--wide-optimizer",
        choices=("sgd", "adagrad", "rowwise_adagrad", "adam"),
        default=S,
        help="optimizer of a model's wide (linear) part, e.g. wide_deep's (default: the model's)",
    )
    p.add_argument(
        "--wide-lr", type=float, default=S, help="peak learning rate of the wide part (default: the model's)"
    )
    p.add_argument(
        "--embedding-lr",
        type=float,
        default=S,
        help="peak learning rate of the embeddings (default: the model's, else --lr)",
    )
    p.add_argument("--warmup-steps", type=int, default=S, help="linear warmup steps (default 5%% of the run)")
    p.add_argument(
        "--decay-start-step", type=int, default=S, help="step where polynomial decay begins (default: half-way)"
    )
    p.add_argument("--decay-steps", type=int, default=S, help="length of the decay (default: half the run)")
    p.add_argument(
        "--decay-power",
        type=float,
        default=S,
        help=f"power of the polynomial decay (default {d.decay_power})",
    )
    p.add_argument("--end-lr", type=float, default=S, help=f"learning rate after the decay (default {d.end_lr})")
    p.add_argument("--seed", type=int, default=S, help=f"seed of weights and batch order (default {d.seed})")
    p.add_argument(
        "--evals-per-epoch",
        type=int,
        default=S,
        help=f"test evaluations per epoch, 0 for only at the end (default {d.evals_per_epoch})",
    )
    p.add_argument("--print-freq", type=int, default=S, help=f"steps between log records (default {d.print_freq})")
    p.add_argument("--amp", action="store_true", default=S, help="mixed precision: bf16 autocast on CPU, fp16 on CUDA")
    p.add_argument("--amp-dtype", choices=("bf16", "fp16"), default=S, help="override the --amp dtype")
    p.add_argument(
        "--compile",
        action="store_true",
        default=S,
        help="torch.compile the model (the seeds' XLA flag); falls back to eager with a message if compiling fails",
    )
    p.add_argument(
        "--save-checkpoint",
        type=Path,
        default=None,
        help="checkpoint file, written atomically at each evaluation and at the end",
    )
    p.add_argument("--checkpoint-every", type=int, default=S, help="also checkpoint every N steps")
    p.add_argument(
        "--load-checkpoint",
        type=Path,
        default=None,
        help="resume from this checkpoint (weights, optimizer, step, RNG; same data and batch size)",
    )
    p.add_argument("--log-path", type=Path, default=None, help="append JSON-lines records (loss, lr, samples/s, eval)")
    p.add_argument("--device", default="auto", help="auto (CUDA if present, else CPU), cpu, cuda, cuda:N")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's choice)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    _add_parallel(p)


def _add_parallel(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "hybrid parallel",
        "Launched by torchrun (torchrun --nproc-per-node N -m ctrkit train ...; --nnodes/--node-rank/"
        "--rdzv-endpoint for several machines), embedding tables are sharded over the ranks and the dense "
        "part is data-parallel; gloo on CPU, NCCL on CUDA. Without torchrun these flags only shape "
        "--print-sharding-plan.",
    )
    g.add_argument(
        "--sharding",
        choices=("auto", "table", "column", "row"),
        default="auto",
        help="auto (default): whole tables balanced over ranks, split by columns above --column-split-dim and "
        "by rows above --row-budget-mb; table, column or row force one strategy for every table",
    )
    g.add_argument(
        "--column-split-dim",
        type=int,
        default=None,
        help="under auto, split tables wider than this into column blocks this wide (default: never)",
    )
    g.add_argument(
        "--row-budget-mb",
        type=float,
        default=None,
        help="under auto, split a table larger than this many MB (fp32) by rows over every rank, so a table "
        "larger than one worker's memory still trains (default: never)",
    )
    g.add_argument("--print-sharding-plan", action="store_true", help="print where every table lives (rank 0)")
    g.add_argument(
        "--dist-timeout",
        type=float,
        default=120.0,
        help="seconds a rank waits in a collective before failing (a dead peer ends the job, not hangs it; "
        "default 120)",
    )


def _add_evaluate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "evaluate",
        help="AUC and log loss of a checkpoint on a dataset mapping",
        description="Scores every sample of a mapping and reports exact AUC (ties counted half) and log loss.",
    )
    p.add_argument("--checkpoint", required=True, type=Path, help="checkpoint written by `ctrkit train`")
    p.add_argument("--dataset", required=True, type=Path, help="dataset directory holding feature_spec.yaml")
    p.add_argument("--mapping", default="test", help="source_spec mapping to score (default test)")
    p.add_argument("--batch-size", type=int, default=16384, help="samples per forward pass (default 16384)")
    p.add_argument("--amp", action="store_true", help="score under bf16 (CPU) / fp16 (CUDA) autocast")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a text line")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")
    _add_parallel(p)


def _add_predict(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "predict",
        help="write click probabilities of a dataset mapping to a .npy file",
        description="Writes one float32 click probability per sample, in dataset order.",
    )
    p.add_argument("--checkpoint", required=True, type=Path, help="checkpoint written by `ctrkit train`")
    p.add_argument("--dataset", required=True, type=Path, help="dataset directory holding feature_spec.yaml")
    p.add_argument("--mapping", default="test", help="source_spec mapping to score (default test)")
    p.add_argument("--out", required=True, type=Path, help="output .npy file")
    p.add_argument("--batch-size", type=int, default=16384, help="samples per forward pass (default 16384)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")
    _add_parallel(p)


def _add_export(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "export",
        help="a checkpoint as ONNX, TorchScript or a Triton model repository",
        description="Writes the model for serving: inputs 'numerical' (B, N) FP32 and 'categorical' (B, F) INT64 "
        "(ids outside a table map to its row 0, the missing/unseen id), with multi-hot features also 'multi_hot' "
        "(B, Fm, L) INT64 (each sample's ids per multi-hot feature, padded with -1), output 'probability' (B, 1) "
        "FP32, dynamic batch. ONNX is loaded back in onnxruntime and compared with PyTorch (max abs diff printed).",
    )
    p.add_argument("--checkpoint", required=True, type=Path, help="checkpoint written by `ctrkit train`")
    p.add_argument("--format", required=True, choices=("onnx", "torchscript", "triton"), help="what to write")
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
        choices=("none", "int8"),
        default="none",
        help="int8: ONNX with int8 linear layers (onnxruntime dynamic quantization, embeddings stay float32; "
        "1.7-2x float32 ONNX at batches of 1024-4096 here, and the fastest runtime through `ctrkit serve`). "
        "Default none",
    )
    p.add_argument("--overwrite", action="store_true", help="replace an existing output directory")


def _add_serve(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve",
        help="a KServe v2 / Triton HTTP inference server",
        description="Serves a checkpoint (PyTorch) or an export (--model-dir: ONNX Runtime or TorchScript) over the "
        "KServe v2 HTTP protocol as Triton does: /v2/health/live, /v2/health/ready, /v2/models/NAME, "
        "/v2/models/NAME/ready, POST /v2/models/NAME/infer with JSON tensors or the binary-tensor extension (the "
        "faster choice for clients). Inputs: numerical (B, N) FP32, categorical (B, F) INT64 and, for models with "
        "multi-hot features, multi_hot (B, Fm, L) INT64 padded with -1; output: probability (B, 1) FP32. "
        "Concurrent requests are batched dynamically.",
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--checkpoint", type=Path, default=None, help="checkpoint written by `ctrkit train`")
    src.add_argument("--model-dir", type=Path, default=None, help="directory written by `ctrkit export`")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    p.add_argument("--name", default=None, help="model name in the URLs (default: the model type, e.g. dlrm)")
    p.add_argument(
        "--batch-window-ms",
        type=float,
        default=1.0,
        help="how long a request may wait for others to be scored with it (default 1.0)",
    )
    p.add_argument("--max-batch-size", type=int, default=8192, help="samples per model call and request (default 8192)")
    p.add_argument("--max-body-mb", type=float, default=64.0, help="largest request body accepted (default 64)")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's choice)")
    p.add_argument(
        "--embedding-store",
        choices=("memory", "mmap"),
        default="memory",
        help="memory (default): tables in RAM; mmap: tables stay in the memory-mapped checkpoint and only "
        "--cache-rows hot rows are kept in memory, so tables larger than RAM can be served (--checkpoint only)",
    )
    p.add_argument(
        "--cache-rows",
        type=int,
        default=1 << 20,
        help="rows of each mmap store cache, one per table collection (default 1048576)",
    )
    p.add_argument(
        "--dtype",
        choices=("fp32", "bf16"),
        default="fp32",
        help="weights of a --checkpoint model: fp32 (default) or bf16 (2-3x fp32 at large batches on the "
        "AVX-512 BF16 cores measured here)",
    )
    p.add_argument(
        "--compile",
        action="store_true",
        help="run a --checkpoint model through torch.compile with weight freezing (about 1.5-2x at large batches "
        "here with --dtype bf16; the first requests of each new shape wait for compilation)",
    )


def _add_bench(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="benchmarks (training, preprocessing, hybrid-parallel scaling)")
    bsub = p.add_subparsers(
        dest="bench", required=True, metavar="{train,preprocess,scale,inference}", help="what to measure"
    )
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
    inf.add_argument("--batch-sizes", default="1,64,4096", help="comma-separated batch sizes (default 1,64,4096)")
    inf.add_argument(
        "--runtimes",
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
    inf.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's choice)")
    inf.add_argument("--output", type=Path, default=None, help="write the results as JSON here")
    sc = bsub.add_parser(
        "scale",
        help="step time per world size on the Merlin synthetic models, scaled down",
        description="The Merlin Distributed-Embeddings synthetic DLRMs (tiny 55 tables 4.2 GiB, small 107 / 26.3, "
        "medium 311 / 206.2, large 612 / 773.8, jumbo 1,022 / 3,109.5 GiB) divided in size by --scale, power-law "
        "table sizes and ids, Adagrad; each world size runs as its own job (torchrun above 1 rank), the cores "
        "split between its ranks. Reports the median step time.",
    )
    sc.add_argument("--models", default="tiny,small", help="comma-separated synthetic models (default tiny,small)")
    sc.add_argument("--scale", type=float, default=1024.0, help="divide every model's size by this (default 1024)")
    sc.add_argument("--world-sizes", default="1,2", help="comma-separated world sizes (default 1,2)")
    sc.add_argument("--embedding-dim", type=int, default=32, help="embedding width (default 32)")
    sc.add_argument("--batch-size", type=int, default=4096, help="global samples per step (default 4096)")
    sc.add_argument("--warmup", type=int, default=3, help="untimed steps (default 3)")
    sc.add_argument("--steps", type=int, default=15, help="timed steps; the median is reported (default 15)")
    sc.add_argument("--sharding", choices=("auto", "table", "column", "row"), default="auto", help="(default auto)")
    sc.add_argument("--seed", type=int, default=0, help="seed of the synthetic batches (default 0)")
    sc.add_argument("--output", type=Path, default=None, help="write the results as JSON here")
    sc.add_argument("--worker-output", type=Path, default=None, help=argparse.SUPPRESS)  # set for each job
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
    pp.add_argument("--seed", type=int, default=0, help="seed of the generated file (default 0)")
    pp.add_argument("--repeats", type=int, default=1, help="runs to take the median time of (default 1)")
    pp.add_argument("--output", type=Path, default=None, help="write the result as JSON here")
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
    t.add_argument("--bottom-mlp", type=_int_list, default=None, help="bottom MLP widths (default: the model's)")
    t.add_argument("--top-mlp", type=_int_list, default=None, help="top MLP widths (default: the model's)")
    t.add_argument("--warmup", type=int, default=10, help="untimed steps first (default 10)")
    t.add_argument("--steps", type=int, default=50, help="timed steps per repeat (default 50)")
    t.add_argument("--repeats", type=int, default=5, help="timed repeats; the median is reported (default 5)")
    t.add_argument("--amp", action="store_true", help="bf16 autocast (CPU) / fp16 (CUDA)")
    t.add_argument(
        "--dense-gradients",
        action="store_true",
        help="dense embedding gradients (the plain-PyTorch baseline) instead of sparse ones",
    )
    t.add_argument(
        "--optimizer", choices=("sgd", "adagrad", "adam"), default=None, help="dense optimizer (default: the model's)"
    )
    t.add_argument(
        "--embedding-optimizer",
        choices=("sgd", "adagrad", "rowwise_adagrad", "adam"),
        default=None,
        help="embedding optimizer (default: the model's)",
    )
    t.add_argument("--compile", action="store_true", help="torch.compile the model (compile time is in the warm-up)")
    t.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's choice)")
    t.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")
    t.add_argument("--seed", type=int, default=0, help="seed (default 0)")
    t.add_argument("--output", type=Path, default=None, help="write the result as JSON here")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ctrkit",
        description="Click-through-rate ranking models (DLRM, DCNv2, Wide & Deep) from raw logs to a served model.",
    )
    parser.add_argument("--version", action="version", version=f"ctrkit {__version__}")
    parser.add_argument("--traceback", action="store_true", help="show the full traceback of errors")
    sub = parser.add_subparsers(
        dest="command",
        required=True,
        metavar="{synth,preprocess,transcode,gen-csv,train,evaluate,predict,export,serve,bench,models}",
        help="what to do",
    )
    _add_synth(sub)
    _add_preprocess(sub)
    _add_transcode(sub)
    _add_train(sub)
    _add_evaluate(sub)
    _add_predict(sub)
    _add_export(sub)
    _add_serve(sub)
    _add_bench(sub)
    sub.add_parser("models", help="list the registered model names")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from ctrkit import commands

    handler = {
        "synth": commands.synth,
        "preprocess": commands.preprocess,
        "transcode": commands.transcode,
        "gen-csv": commands.gen_csv,
        "train": commands.train,
        "evaluate": commands.evaluate,
        "predict": commands.predict,
        "export": commands.export,
        "serve": commands.serve,
        "bench": commands.bench,
        "models": commands.models,
    }[args.command]
    try:
        code = handler(args) or 0
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        code = 130
    except (ValueError, FloatingPointError, FileNotFoundError, NotADirectoryError, PermissionError) as e:
        if args.traceback:
            raise
        print(f"ctrkit {args.command}: error: {e}", file=sys.stderr)
        code = EXIT_USER_ERROR
    _leave_process_group(code)
    return code


def _leave_process_group(code: int) -> None:
    """Ends a hybrid-parallel process without tearing gloo down.

    Letting the interpreter destroy a live gloo process group aborted a rank now and then here
    ("terminate called without an active exception", SIGABRT) after all work was done; so a rank
    that finished waits for its peers (when it succeeded) and leaves with ``os._exit``.
    """
    if "torch.distributed" not in sys.modules:  # never started one (and importing torch costs ~1.3 s)
        return
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    if code == 0:
        dist.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def print_json(obj: object) -> None:
    print(json.dumps(obj, indent=None, sort_keys=True))


if __name__ == "__main__":
    sys.exit(main())
