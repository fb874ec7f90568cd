"""Model commands: train, evaluate, predict, models."""

from __future__ import annotations

import argparse
import json
import sys

from ctrkit.cli.options import add_command, add_config_flags, config_from, config_values
from ctrkit.config import ParallelConfig, RunOptions, TrainConfig
from ctrkit.eval_config import ConvertConfig, EvalConfig, PredictConfig, ReportConfig


def parallel_text(command: str, what: str) -> str:
    """The help of a command's hybrid-parallel flags: how torchrun launches ``command``, and ``what`` the ranks do."""
    return (
        f"Launched by torchrun (torchrun --nproc-per-node N -m ctrkit {command} ...; --nnodes/--node-rank/"
        f"--rdzv-endpoint for several machines), {what}; gloo on CPU, NCCL on CUDA. Without torchrun these flags only "
        "shape --print-sharding-plan."
    )


SHARDED_SCORING = "the checkpoint's embedding tables are sharded over the ranks, which score the samples together"


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "train", train, (RunOptions,))
    add_config_flags(p, TrainConfig, suppress=True)  # flags not given come from --config, then the defaults
    train_text = parallel_text(
        "train", "embedding tables are sharded over the ranks and the dense part is data-parallel"
    )
    add_config_flags(p.add_argument_group("hybrid parallel", train_text), ParallelConfig)
    p = add_command(sub, "evaluate", evaluate, (EvalConfig,), ("out",))
    add_config_flags(
        p.add_argument_group("hybrid parallel", parallel_text("evaluate", SHARDED_SCORING)), ParallelConfig
    )
    p = add_command(sub, "predict", predict, (PredictConfig,))
    text = parallel_text("predict", f"with --dataset, {SHARDED_SCORING} (--input scores in this process)")
    add_config_flags(p.add_argument_group("hybrid parallel", text), ParallelConfig)
    p = add_command(sub, "report", report, (ReportConfig,))
    p.add_argument("checkpoint", metavar="CHECKPOINT", help="checkpoint written by `ctrkit train`")
    add_command(sub, "models", models, ())
    add_command(
        sub, "convert-checkpoint", convert_checkpoint, (ConvertConfig, ParallelConfig),
        exclude=("print_sharding_plan", "dist_timeout"),
    )  # fmt: skip


def train(args: argparse.Namespace) -> int:
    """train a model on a dataset

    Trains a model on the 'train' mapping of a split-binary dataset with the model's optimizers (sparse
    embedding updates). Evaluations during training score the 'validation' mapping (or, without one, a
    held-out tail of 'train'); the run keeps the weights of the best validation AUC, lowers the learning
    rates on a plateau and stops early after a patience, fits a scale of the kept model's logit to the
    validation log loss where that helps (--calibrate), then scores 'test' once with the kept model.
    The LR schedule warms up linearly, holds, then decays polynomially; unset schedule flags are derived
    from the run (warmup over 5% of the first epoch, decay over the last half of --epochs). Settings
    resolve as: flags, then --config, then --recipe (tuned, plain or nvidia), then the model's defaults; the
    resolved run is written beside the checkpoint as YAML, which --config accepts back.
    """
    import torch

    from ctrkit.train.run import Run, resolve_run

    opts: RunOptions = config_from(args, RunOptions)
    if opts.config is not None and not opts.config.exists():
        raise ValueError(f"{opts.config}: --config file not found")
    if opts.config is None and opts.dataset is None:
        raise ValueError("no dataset: pass --dataset DIR (or a --config file naming one)")
    if opts.threads:
        torch.set_num_threads(opts.threads)
    shape = {"embedding_dim": opts.embedding_dim, "bottom_mlp": opts.bottom_mlp, "top_mlp": opts.top_mlp,
             "combiner": opts.combiner, "embedding_sizes": opts.embedding_sizes,
             "numerical_buckets": opts.numerical_buckets}  # fmt: skip
    spec = resolve_run(
        opts.dataset,
        opts.model,
        recipe=opts.recipe,
        config=opts.config,
        model_config={k: v for k, v in shape.items() if v is not None},
        model_config_file=opts.model_config,
        train=config_values(args, TrainConfig),
        parallel=config_from(args, ParallelConfig),
        device=opts.device,
        save_checkpoint=opts.save_checkpoint,
        load_checkpoint=opts.load_checkpoint,
        log_path=opts.log_path,
        progress=not opts.no_progress,
        tensorboard=opts.tensorboard,
        allow_other_vocabulary=opts.allow_other_vocabulary,
        continue_from=opts.continue_from,
    )
    run = Run(spec, dry_run=opts.dry_run)
    if opts.dry_run:
        if run.is_main:
            print(run.plan.text())
        return 0
    if not run.is_main:
        run.fit()
        return 0
    if run.env is not None:
        ranks = f"{run.env.world_size} rank" + ("s" if run.env.world_size > 1 else "")
        print(f"hybrid parallel: {ranks} ({run.env.backend}); rank 0 holds "
              f"{run.num_parameters:,} parameters", file=sys.stderr)  # fmt: skip
    print(run.describe(), file=sys.stderr)
    print(run.plan.text(), file=sys.stderr)
    result = run.fit()
    print(summary_line(result, spec.save_checkpoint))
    return 0


def auc_text(auc: float) -> str:
    """``AUC 0.8012``, or what an undefined AUC means (the data held one class only)."""
    return f"AUC {auc:.4f}" if auc == auc else "AUC undefined (every label is the same)"


def summary_line(result: dict, checkpoint=None) -> str:
    """``train``'s last line: the steps, the kept model and its validation scores beside the first-order
    regression it started from, its calibration where one was kept, the test scores, the checkpoint."""
    members = result.get("members") or []
    several = len({m.get("batch_size") for m in members}) > 1  # --small-batch: members at two batch sizes
    at = f"batch-{result['batch_size']} " if several else ""  # ... and the kept ones are at this one
    chosen = [m for m in members if not several or m.get("batch_size") == result["batch_size"]]
    if members:  # a seed ensemble: each member's steps
        steps = " / ".join(str(m["steps"]) for m in members)
        several_seeds = len({m["seed"] for m in members}) > 1
        flags = ", ".join(f for f, on in (("--seed-ensemble", several_seeds), ("--small-batch", several)) if on)
        parts = [f"done: {len(members)} models ({flags}) of {steps} steps"]
    else:
        parts = [f"done: {result['step']} steps" + (" (stopped early)" if result["stopped_early"] else "")]
    if "validation" in result:
        v = result["validation"]
        seeds = result.get("member_ensemble") or []
        if len(seeds) > 1:
            steps = ", ".join(str(m["best_step"]) for m in chosen)
            kept = f"kept the mean of the {at}models of seeds {', '.join(map(str, seeds))} (their best steps {steps})"
        elif result.get("ensemble"):
            kept = f"kept the ensemble of steps {', '.join(map(str, result['ensemble']))}"
        else:
            whose = f"seed {seeds[0]}'s {at}" if len({m["seed"] for m in members}) > 1 else f"the {at}"
            kept = f"kept step {result['best_step']}" + (f" of {whose}model" if members else "")
        parts.append(f"{kept} (validation {auc_text(v['auc'])}, logloss {v['logloss']:.4f})")
        base = result.get("baseline")
        if base is not None and not result.get("ensemble") and len(seeds) < 2 and result["best_step"] == base["step"]:
            parts[-1] += ": the first-order regression it started from; no trained step beat it on validation"
        elif base is not None:
            parts[-1] += f" against the first-order regression it started from: {auc_text(base['auc'])}"
    count, single = result.get("models_per_request", 1), result.get("single_validation")
    if count > 1 and single and "validation" in result:
        gain = result["validation"]["auc"] - single["auc"]
        parts.append(f"the ensemble gained {gain:+.4f} validation AUC over its best single model, and each request "
                     f"to it runs {count} models")  # fmt: skip
    fit = result.get("calibration") or {}
    if fit.get("applied"):
        parts.append(
            f"its logit scaled by {fit['scale']:.3f} (--calibrate: validation logloss {fit['logloss_before']:.4f} -> "
            f"{fit['logloss_after']:.4f})"
        )
    if "auc" in result:
        parts.append(
            f"test {auc_text(result['auc'])}, logloss {result['logloss']:.4f} on {result['samples']:,} samples"
        )
        if "single" in result and result.get("members"):
            parts[-1] += f" (seed {chosen[0]['seed']}'s {at}model alone: AUC {result['single']['auc']:.4f})"
        elif "single" in result:
            parts[-1] += f" (the best single model: AUC {result['single']['auc']:.4f})"
    if checkpoint:
        parts.append(f"checkpoint {checkpoint}")
    return "; ".join(parts)


def _scoring(args: argparse.Namespace):
    from ctrkit.eval.evaluator import Scoring

    cfg: EvalConfig = config_from(args, EvalConfig)
    parallel = config_from(args, ParallelConfig)
    return cfg, Scoring.load(cfg.checkpoint, cfg.dataset, cfg.mapping, cfg.device, parallel, cfg.allow_other_vocabulary)


def evaluate(args: argparse.Namespace) -> int:
    """AUC and log loss of a checkpoint on a dataset mapping

    Scores every sample of a mapping and reports exact AUC (ties counted half) and log loss.
    """
    cfg, scoring = _scoring(args)
    metrics = scoring.evaluate(cfg.batch_size, cfg.amp, progress=not (cfg.json or cfg.no_progress))
    if not scoring.is_main:
        return 0
    if cfg.json:
        # strict JSON: an undefined AUC (one class only) is null, not NaN
        print(json.dumps({k: None if v != v else v for k, v in metrics.items()}, sort_keys=True))
        return 0
    trained = f" (kept of {metrics['steps_trained']} trained)" if metrics["steps_trained"] != metrics["step"] else ""
    line = (
        f"{metrics['model']} step {metrics['step']}{trained} on {cfg.mapping}: {auc_text(metrics['auc'])}  "
        f"logloss {metrics['logloss']:.4f}  samples {metrics['samples']:,}  CTR {metrics['ctr']:.4f}"
    )
    if "map@12" in metrics:
        line += f"  MAP@12 {metrics['map@12']:.4f} over {metrics['map_groups']:,} groups"
    print(line)
    return 0


def predict(args: argparse.Namespace) -> int:
    """click probabilities of new rows (--input) or of a dataset mapping (--dataset)

    With --input: reads a CSV or Parquet file of raw rows (the training table's columns; the label may be left
    out), applies the preprocessing the checkpoint carries (each value's id, raw-id hashing, numerical fills and
    transforms: unseen values get the id of a missing one, missing numbers training's fill), scores the rows in
    blocks (memory bounded whatever the file's size) and writes a CSV or Parquet table of the --keep columns and
    'probability', one row per input row, in input order. With --dataset: writes one float32 probability per
    sample of --mapping, in dataset order, in NumPy's .npy format to exactly the --out path. Either output
    appears only when complete.
    """
    import numpy as np

    from ctrkit.data.atomic import atomic_file

    cfg: PredictConfig = config_from(args, PredictConfig)
    if cfg.input is not None:
        return _predict_rows(cfg)
    from ctrkit.eval.evaluator import Scoring

    parallel = config_from(args, ParallelConfig)
    scoring = Scoring.load(cfg.checkpoint, cfg.dataset, cfg.mapping, cfg.device, parallel, cfg.allow_other_vocabulary)
    probs = scoring.predict(cfg.batch_size, progress=scoring.env is None and not cfg.no_progress)
    if not scoring.is_main:
        return 0
    with atomic_file(cfg.out, needs=probs.nbytes) as tmp, open(tmp, "wb") as f:
        np.save(f, probs)  # to the file object: the path named, never with .npy added
    print(f"wrote {cfg.out}: {len(probs):,} click probabilities (float32), mean {probs.mean():.4f}")
    return 0


def _predict_rows(cfg: PredictConfig) -> int:
    from ctrkit.preprocess.values import BadValues
    from ctrkit.serve.predictor import Predictor
    from ctrkit.serve.score_file import score_file

    if cfg.device not in ("auto", "cpu"):
        raise ValueError("`device`: predict --input scores on the CPU (the server's model); leave --device unset")
    predictor = Predictor.from_checkpoint(cfg.checkpoint)
    if predictor.transform is None:
        raise ValueError(
            f"{cfg.checkpoint}: carries no preprocessing (its dataset was not made by `ctrkit preprocess table` or "
            "`preprocess criteo` of this version, or was synthetic): score a preprocessed dataset with --dataset"
        )
    bad = BadValues(cfg.bad_values)
    done = score_file(predictor, predictor.transform, cfg.input, cfg.out, cfg.keep, cfg.separator, cfg.batch_size,
                      progress=not cfg.no_progress, missing_columns=cfg.missing_columns, bad=bad)  # fmt: skip
    print(f"wrote {cfg.out}: {done['rows']:,} click probabilities, mean {done['mean']:.4f} "
          f"({done['rows'] / max(done['seconds'], 1e-9):,.0f} rows/s)")  # fmt: skip
    if bad.count:
        print(bad.summary())
    return 0


def report(args: argparse.Namespace) -> int:
    """write an HTML report of a trained model

    One self-contained HTML page: the run's configuration, training loss and learning rate over steps,
    every evaluation's AUC and log loss, the final metrics with the checkpoint's step, a calibration
    diagram and the score histogram of each class on --mapping, and the dataset's summary.
    """
    from pathlib import Path

    from ctrkit.report import build_report

    cfg: ReportConfig = config_from(args, ReportConfig)
    checkpoint = Path(args.checkpoint)
    if not checkpoint.exists():
        raise ValueError(f"{checkpoint}: checkpoint not found")
    data = build_report(checkpoint, cfg.out, cfg.dataset, cfg.mapping, cfg.log_path, cfg.device, not cfg.no_progress)
    final = data["final"]
    step = final.get("best_step", final["checkpoint_step"])  # the kept weights' step
    print(f"wrote {cfg.out}: {data['model']} step {step} on {final['mapping']}: AUC "
          f"{final['auc']:.4f}  logloss {final['logloss']:.4f}  ({final['rows']:,} samples)")  # fmt: skip
    return 0


def models(args: argparse.Namespace) -> int:
    """list the registered models with the shape and training settings a run gets by default

    Each model's config and optimizer settings as `ctrkit train --model NAME` resolves them with the default
    recipe (its model fields over the model's own defaults), before the data decides the rest (--dry-run shows
    that).
    """
    from dataclasses import replace

    from ctrkit.models.registry import config_class, config_to_dict, list_models, train_defaults
    from ctrkit.train.recipes import DEFAULT_RECIPE, recipe

    for name in list_models():
        train_layer, model_layer = recipe(DEFAULT_RECIPE).layers(name)
        example = replace(config_class(name)(num_numerical=13, cardinalities=(1,)), **model_layer)
        shape = {k: v for k, v in config_to_dict(example).items() if k not in ("num_numerical", "cardinalities")}
        trained = {**train_defaults(name), **{k: v for k, v in train_layer.items() if k in train_defaults(name)}}
        print(f"{name}: {shape}; training defaults {trained} (recipe {DEFAULT_RECIPE})")
    return 0


def convert_checkpoint(args: argparse.Namespace) -> int:
    """write a checkpoint as one file, or sharded for N ranks

    A hybrid-parallel run writes its checkpoint sharded (a manifest and one file per rank); by default
    this writes the same checkpoint as one file with whole tables (what a single-process run writes).
    With --world-size N it writes the sharded form instead, tables placed as an N-rank run with the
    given --sharding places them, one rank's part in memory at a time. The optimizer states are
    converted too (the tables' per-row states cut for the new placement), so a run resumes from either
    form at the world size and sharding it was written for. Writes are atomic, the manifest last. Every
    command reads both forms.
    """
    from dataclasses import replace

    from ctrkit.checkpoint import load_checkpoint, save_checkpoint
    from ctrkit.models.registry import create_model, make_config
    from ctrkit.models.storage import DEFERRED
    from ctrkit.train.convert import converted_optimizer_states, write_sharded_checkpoint

    cfg: ConvertConfig = config_from(args, ConvertConfig)
    par: ParallelConfig = config_from(args, ParallelConfig)
    if cfg.out.exists() and not cfg.overwrite:
        raise ValueError(f"{cfg.out}: file exists; set `overwrite` to replace it")
    if cfg.world_size is None:
        ckpt = load_checkpoint(cfg.checkpoint)
        if ckpt.sharding is not None:  # the optimizer states as one process keeps them
            whole = create_model(ckpt.model_name, make_config(ckpt.model_name, ckpt.model_config), DEFERRED)
            states = converted_optimizer_states(ckpt, whole, None)
            if states is not None:
                ckpt = replace(ckpt.resuming(optimizers=states, rank_optimizers=None), sharding=None)
        save_checkpoint(cfg.out, replace(ckpt, shard_files=None, shard_records=None))
        print(f"wrote {cfg.out} (step {ckpt.step}, {len(ckpt.model)} tensors)")
        return 0
    ckpt = load_checkpoint(cfg.checkpoint, mmap=True, assemble=False)
    if ckpt.models_averaged > 1:
        raise ValueError(
            f"{cfg.checkpoint}: holds an ensemble of {ckpt.models_averaged} models; the sharded form holds one "
            "model: retrain with --snapshot-ensemble 1 --seed-ensemble 1 to shard it"
        )
    held = write_sharded_checkpoint(ckpt, cfg.out, cfg.world_size, par)
    mb = ", ".join(f"{b / 2**20:.1f}" for b in held)
    print(f"wrote {cfg.out} (step {ckpt.step}, {cfg.world_size} rank files; MB of table per rank: {mb})")
    return 0
