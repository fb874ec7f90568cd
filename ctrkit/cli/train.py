"""Model commands: train, evaluate, predict, models."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ctrkit.cli.options import (
    add_checkpoint_dataset,
    add_config_flags,
    add_device,
    add_no_progress,
    add_threads,
    config_values,
    int_list,
)
from ctrkit.config import EvalConfig, ParallelConfig, TrainConfig


def register(sub: argparse._SubParsersAction) -> None:
    _train(sub)
    _evaluate(sub)
    _predict(sub)
    p = sub.add_parser("models", help="list the registered model names")
    p.set_defaults(handler=models)


def _parallel(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "hybrid parallel",
        "Launched by torchrun (torchrun --nproc-per-node N -m ctrkit train ...; --nnodes/--node-rank/"
        "--rdzv-endpoint for several machines), embedding tables are sharded over the ranks and the dense "
        "part is data-parallel; gloo on CPU, NCCL on CUDA. Without torchrun these flags only shape "
        "--print-sharding-plan.",
    )
    add_config_flags(g, ParallelConfig)


def _train(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "train",
        help="train a model on a dataset",
        description="Trains a model on the 'train' mapping of a split-binary dataset with the model's optimizers "
        "(sparse embedding updates), evaluating on 'test'. The LR schedule warms up linearly, holds, then decays "
        "polynomially; unset schedule flags are derived from the run length (5% warmup, decay over the last "
        "half). Settings resolve as: flags, then --config, then the model's defaults; the resolved run is "
        "written beside the checkpoint as YAML, which --config accepts back.",
    )
    S = argparse.SUPPRESS  # run options absent from the command line come from --config, then defaults
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
        type=int_list,
        default=None,
        help="bottom MLP widths, last = embedding dim (default 512,256,64,16)",
    )
    p.add_argument("--top-mlp", type=int_list, default=None, help="top MLP widths, last = 1 (default 512,256,1)")
    add_config_flags(p, TrainConfig, suppress=True)
    p.add_argument(
        "--save-checkpoint",
        type=Path,
        default=None,
        help="checkpoint file, written atomically at each evaluation and at the end",
    )
    p.add_argument(
        "--load-checkpoint",
        type=Path,
        default=None,
        help="resume from this checkpoint (weights, optimizer, step, RNG; same data and batch size)",
    )
    p.add_argument("--log-path", type=Path, default=None, help="append JSON-lines records (loss, lr, samples/s, eval)")
    add_device(p)
    add_threads(p)
    add_no_progress(p)
    _parallel(p)
    p.set_defaults(handler=train)


def train(args: argparse.Namespace) -> int:
    import torch

    from ctrkit.train.run import Run, resolve_run

    if args.config is not None and not args.config.exists():
        raise ValueError(f"{args.config}: --config file not found")
    if args.config is None and not hasattr(args, "dataset"):
        raise ValueError("no dataset: pass --dataset DIR (or a --config file naming one)")
    if args.threads:
        torch.set_num_threads(args.threads)
    model_flags = {"embedding_dim": args.embedding_dim, "bottom_mlp": args.bottom_mlp, "top_mlp": args.top_mlp}
    spec = resolve_run(
        getattr(args, "dataset", None),
        getattr(args, "model", None),
        config=args.config,
        model_config={k: v for k, v in model_flags.items() if v is not None},
        model_config_file=args.model_config,
        train=config_values(args, TrainConfig),
        parallel=ParallelConfig(**config_values(args, ParallelConfig)),
        device=args.device,
        save_checkpoint=args.save_checkpoint,
        load_checkpoint=args.load_checkpoint,
        log_path=args.log_path,
        progress=not args.no_progress,
    )
    run = Run(spec)
    if not run.is_main:
        run.fit()
        return 0
    if run.env is not None:
        print(
            f"hybrid parallel: {run.env.world_size} ranks ({run.env.backend}); rank 0 holds "
            f"{run.num_parameters:,} parameters",
            file=sys.stderr,
        )
    print(run.describe(), file=sys.stderr)
    result = run.fit()
    saved = f"; checkpoint {spec.save_checkpoint}" if spec.save_checkpoint else ""
    if "auc" in result:
        print(
            f"done: {run.trainer.step} steps, test AUC {result['auc']:.4f}, logloss {result['logloss']:.4f} "
            f"on {result['samples']:,} samples{saved}"
        )
    else:
        print(f"done: {run.trainer.step} steps{saved}")
    return 0


def _scoring(p: argparse.ArgumentParser, exclude: tuple[str, ...] = ()) -> None:
    add_checkpoint_dataset(p)
    add_config_flags(p, EvalConfig, exclude)
    add_device(p)


def _evaluate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "evaluate",
        help="AUC and log loss of a checkpoint on a dataset mapping",
        description="Scores every sample of a mapping and reports exact AUC (ties counted half) and log loss.",
    )
    _scoring(p)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a text line")
    _parallel(p)
    p.set_defaults(handler=evaluate)


def _load_scoring(args: argparse.Namespace):
    from ctrkit.eval.evaluator import Scoring

    cfg = EvalConfig(**config_values(args, EvalConfig))
    cfg.validate()
    parallel = ParallelConfig(**config_values(args, ParallelConfig))
    return cfg, Scoring.load(args.checkpoint, args.dataset, cfg.mapping, args.device, parallel)


def evaluate(args: argparse.Namespace) -> int:
    cfg, scoring = _load_scoring(args)
    metrics = scoring.evaluate(cfg.batch_size, cfg.amp, progress=not args.json)
    if not scoring.is_main:
        return 0
    if args.json:
        # strict JSON: an undefined AUC (one class only) is null, not NaN
        print(json.dumps({k: None if v != v else v for k, v in metrics.items()}, sort_keys=True))
        return 0
    line = (
        f"{metrics['model']} step {metrics['step']} on {cfg.mapping}: AUC {metrics['auc']:.4f}  "
        f"logloss {metrics['logloss']:.4f}  samples {metrics['samples']:,}  CTR {metrics['ctr']:.4f}"
    )
    if "map@12" in metrics:
        line += f"  MAP@12 {metrics['map@12']:.4f} over {metrics['map_groups']:,} groups"
    print(line)
    return 0


def _predict(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "predict",
        help="write click probabilities of a dataset mapping to a .npy file",
        description="Writes one float32 click probability per sample, in dataset order.",
    )
    _scoring(p, exclude=("amp",))
    p.add_argument("--out", required=True, type=Path, help="output .npy file")
    _parallel(p)
    p.set_defaults(handler=predict)


def predict(args: argparse.Namespace) -> int:
    import numpy as np

    cfg, scoring = _load_scoring(args)
    probs = scoring.predict(cfg.batch_size, progress=scoring.env is None)
    if not scoring.is_main:
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.save(args.out, probs)
    print(f"wrote {args.out}: {len(probs):,} click probabilities (float32), mean {probs.mean():.4f}")
    return 0


def models(args: argparse.Namespace) -> int:
    from ctrkit.models.registry import config_class, config_to_dict, list_models, train_defaults

    for name in list_models():
        example = config_class(name)(num_numerical=13, cardinalities=(1,))
        shape = {k: v for k, v in config_to_dict(example).items() if k not in ("num_numerical", "cardinalities")}
        print(f"{name}: {shape}; training defaults {train_defaults(name)}")
    return 0
