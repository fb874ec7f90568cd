"""What each ``ctrkit`` subcommand does with its parsed arguments (parsing itself lives in cli.py)."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ctrkit.data.feature_spec import FeatureSpec

# heavy modules (torch above all, ~1.2 s) are imported by the commands that use them, so that
# `ctrkit preprocess` and `ctrkit --help` start quickly


def synth(args: argparse.Namespace) -> int:
    import numpy as np

    from ctrkit.data.dataset import SplitBinaryDataset

    if args.kind == "criteo":
        from ctrkit.data.synthetic import CRITEO_LIKE_CARDINALITIES, write_criteo_tsv

        tables = args.tables or CRITEO_LIKE_CARDINALITIES
        out = write_criteo_tsv(args.out, args.rows, tables, args.num_numerical, args.seed, overwrite=args.overwrite)
        print(f"wrote {out}: {args.rows} raw rows (label, {args.num_numerical} integer, {len(tables)} hashed columns)")
        return 0
    if args.kind == "outbrain":
        from ctrkit.data.synthetic_outbrain import generate_outbrain

        if args.tables is not None or args.num_numerical != 13:
            raise ValueError("--tables and --num-numerical apply to the criteo-like dataset only")
        spec = generate_outbrain(args.out, args.rows, args.test_fraction, args.seed, overwrite=args.overwrite)
        test = SplitBinaryDataset(spec, "test", check_ids=False)
        n_train = len(SplitBinaryDataset(spec, "train", check_ids=False))
        print(
            f"wrote {args.out}: {n_train} train + {len(test)} test rows, {len(np.unique(test.groups()))} test "
            f"displays; {len(spec.onehot_features)} one-hot + {len(spec.multihot_features)} multi-hot categorical, "
            f"{len(spec.numerical_features)} numerical features"
        )
        return 0
    from ctrkit.data.synthetic import CRITEO_LIKE_CARDINALITIES, generate_dataset

    tables = args.tables or CRITEO_LIKE_CARDINALITIES
    spec = generate_dataset(
        args.out, args.rows, tables, args.num_numerical, args.test_fraction, args.seed, overwrite=args.overwrite
    )
    n_train = len(SplitBinaryDataset(spec, "train", check_ids=False))
    n_test = len(SplitBinaryDataset(spec, "test", check_ids=False))
    print(
        f"wrote {args.out}: {n_train} train + {n_test} test samples, {len(tables)} categorical "
        f"(cardinalities {min(tables)}..{max(tables)}), {args.num_numerical} numerical features"
    )
    return 0


def preprocess(args: argparse.Namespace) -> int:
    from ctrkit.preprocess.criteo import CriteoRecipe

    test_fraction = args.test_fraction if args.test_fraction is not None else 0.1
    kwargs = dict(
        test_files=args.test_files,
        test_fraction=None if args.test_files is not None else test_fraction,
        bad_rows=args.bad_rows,
        overwrite=args.overwrite,
        progress=not args.no_progress,
    )
    recipe = CriteoRecipe(frequency_threshold=args.frequency_threshold)
    if args.engine == "spark":
        from ctrkit.preprocess.spark_engine import preprocess_criteo_spark

        summary = preprocess_criteo_spark(args.raw, args.out, recipe, master=args.spark_master, **kwargs)
    else:
        from ctrkit.preprocess.polars_engine import preprocess_criteo

        summary = preprocess_criteo(args.raw, args.out, recipe, **kwargs)
    cards = list(summary["cardinalities"].values())
    print(
        f"wrote {args.out}: {summary['train_rows']:,} train + {summary['test_rows']:,} test rows, "
        f"{summary['bad_rows']:,} bad rows dropped, cardinalities {min(cards)}..{max(cards)}, "
        f"{summary['seconds']:.1f} s"
    )
    return 0


def transcode(args: argparse.Namespace) -> int:
    from ctrkit.data.dataset import SplitBinaryDataset
    from ctrkit.data.transcode import transcode as run_transcode

    spec = run_transcode(args.input, args.output, overwrite=args.overwrite, chunk_size=args.chunk_size)
    sizes = {m: len(SplitBinaryDataset(spec, m, check_ids=False)) for m in spec.source_spec}
    print(
        f"wrote {args.output}: " + ", ".join(f"{n:,} {m}" for m, n in sizes.items()) + f" rows; cardinalities "
        f"{dict(zip(spec.categorical_features, spec.cardinalities))}"
    )
    return 0


def gen_csv(args: argparse.Namespace) -> int:
    from ctrkit.data.transcode import generate_csv

    out = generate_csv(args.feature_spec, args.out, args.rows, args.seed)
    print(f"wrote {out}: {args.rows} rows per mapping as CSV, and feature_spec.yaml")
    return 0


def _load_run_file(path: Path | None) -> dict:
    """The run YAML given with --config (the format written beside checkpoints), or an empty dict."""
    import yaml

    if path is None:
        return {}
    if not path.exists():
        raise ValueError(f"{path}: --config file not found")
    with open(path) as f:
        run = yaml.safe_load(f) or {}
    known = {"model", "model_config", "train_config", "dataset"}
    if not isinstance(run, dict) or set(run) - known:
        raise ValueError(f"{path}: expected a mapping with keys among {sorted(known)}")
    for key in ("model_config", "train_config"):
        if not isinstance(run.get(key, {}), dict):
            raise ValueError(f"{path}: '{key}' must be a mapping of fields")
    return run


def _model_config(args: argparse.Namespace, model: str, run: dict, spec: FeatureSpec):
    """Model config: dataset shape, then --config, then --model-config YAML, then explicit flags."""
    import yaml

    from ctrkit.models.registry import config_class, make_config

    cfg_cls = config_class(model)
    values: dict = dict(run.get("model_config", {}))
    if args.model_config is not None:
        with open(args.model_config) as f:
            loaded = yaml.safe_load(f) or {}
        if not isinstance(loaded, dict):
            raise ValueError(f"{args.model_config}: expected a mapping of model config fields")
        values.update(loaded)
    values.update({"num_numerical": len(spec.numerical_features), "cardinalities": spec.cardinalities})
    if spec.multihot_features:
        values.update(multihot_cardinalities=spec.multihot_cardinalities, multihot_combiners=spec.multihot_combiners)
    flags = {"embedding_dim": args.embedding_dim, "bottom_mlp": args.bottom_mlp, "top_mlp": args.top_mlp}
    given = {k: v for k, v in flags.items() if v is not None}
    values.update(given)
    has_bottom = "bottom_mlp" in cfg_cls.__dataclass_fields__
    if "embedding_dim" in given and "bottom_mlp" not in given and values["num_numerical"] and has_bottom:
        # keep the bottom MLP but end it in the requested width
        bottom = values.get("bottom_mlp", cfg_cls.__dataclass_fields__["bottom_mlp"].default)
        values["bottom_mlp"] = tuple(bottom[:-1]) + (values["embedding_dim"],)
    return make_config(model, values)


def train(args: argparse.Namespace) -> int:
    import torch
    import yaml

    from ctrkit.config import TrainConfig
    from ctrkit.data.dataset import SplitBinaryDataset
    from ctrkit.data.feature_spec import FeatureSpec
    from ctrkit.device import amp_dtype_for, resolve_device
    from ctrkit.models.registry import config_to_dict, create_model, make_config, train_defaults
    from ctrkit.train.checkpoint import check_spec_matches, load_checkpoint
    from ctrkit.train.trainer import RunInfo, Trainer

    if args.threads:
        torch.set_num_threads(args.threads)
    run = _load_run_file(args.config)
    # training options: defaults, then --config, then the flags actually given
    values = dict(run.get("train_config", {}))
    values.update({f.name: getattr(args, f.name) for f in fields(TrainConfig) if hasattr(args, f.name)})
    model_name = getattr(args, "model", None) or run.get("model") or "dlrm"
    cfg = TrainConfig.from_dict(values).with_model_defaults(train_defaults(model_name))
    dataset_dir = getattr(args, "dataset", None) or run.get("dataset")
    if dataset_dir is None:
        raise ValueError("no dataset: pass --dataset DIR (or a --config file naming one)")
    env = _distributed_env(args)
    device = env.device if env is not None else resolve_device(args.device)
    amp_dtype = amp_dtype_for(device, cfg.amp, cfg.amp_dtype)
    if env is not None and amp_dtype == torch.float16:
        raise ValueError("hybrid-parallel training supports --amp with bf16 only (--amp-dtype bf16)")
    spec = FeatureSpec.from_yaml(Path(dataset_dir))
    train_set = SplitBinaryDataset(spec, "train")
    test_set = SplitBinaryDataset(spec, "test") if "test" in spec.source_spec else None

    ckpt = None
    if args.load_checkpoint is not None:
        ckpt = load_checkpoint(args.load_checkpoint)
        check_spec_matches(ckpt, spec.summary(), str(spec.base_dir))
        if ckpt["model_name"] != model_name:
            raise ValueError(
                f"{args.load_checkpoint}: checkpoint holds a '{ckpt['model_name']}' model, not '{model_name}'"
            )
        model_config = make_config(ckpt["model_name"], ckpt["model_config"])
    else:
        model_config = _model_config(args, model_name, run, spec)

    torch.manual_seed(cfg.seed)
    model = create_model(model_name, model_config).to(device)
    if env is not None or args.print_sharding_plan:
        model = _shard(model, args, env, ckpt)
    main = env is None or env.is_main
    if args.save_checkpoint is not None and main:
        # the resolved configuration, beside the run, so every result says how it was made
        run_yaml = args.save_checkpoint.with_suffix(".yaml")
        run_yaml.parent.mkdir(parents=True, exist_ok=True)
        with open(run_yaml, "w") as f:
            yaml.safe_dump(
                {
                    "model": model_name,
                    "model_config": config_to_dict(model_config),
                    "train_config": cfg.to_dict(),
                    "dataset": str(dataset_dir),
                },
                f,
                sort_keys=False,
            )
    trainer = Trainer(
        model,
        RunInfo(model_name, model_config, spec.summary()),
        train_set,
        test_set,
        cfg,
        device,
        amp_dtype,
        args.save_checkpoint,
        args.log_path,
        progress=not args.no_progress,
        env=env,
    )
    if ckpt is not None:
        trainer.restore(ckpt)
    n_params = sum(p.numel() for p in model.parameters())
    if not main:
        trainer.fit()
        return 0
    if env is not None:
        print(
            f"hybrid parallel: {env.world_size} ranks ({env.backend}); rank 0 holds {n_params:,} parameters",
            file=sys.stderr,
        )
    print(
        f"training {model_name} ({n_params:,} parameters) on {len(train_set):,} samples, "
        f"{trainer.total_steps} steps of {cfg.batch_size} on {device}"
        f"{' with ' + str(amp_dtype).replace('torch.', '') + ' autocast' if amp_dtype else ''}",
        file=sys.stderr,
    )
    result = trainer.fit()
    if "auc" in result:
        print(
            f"done: {trainer.step} steps, test AUC {result['auc']:.4f}, logloss {result['logloss']:.4f} "
            f"on {result['samples']:,} samples"
            + (f"; checkpoint {args.save_checkpoint}" if args.save_checkpoint else "")
        )
    else:
        print(f"done: {trainer.step} steps" + (f"; checkpoint {args.save_checkpoint}" if args.save_checkpoint else ""))
    return 0


def _distributed_env(args: argparse.Namespace):
    """This rank's DistEnv when torchrun launched several processes, else None."""
    from ctrkit.distributed.env import init_distributed, launched_by_torchrun

    if not launched_by_torchrun():
        return None
    return init_distributed(args.device, args.dist_timeout)


def _shard(model, args: argparse.Namespace, env, ckpt: dict | None):
    """``model`` with its one-hot tables sharded over the job's ranks (checkpoint weights loaded first)."""
    from ctrkit.distributed.hybrid import HybridModel, describe_plans, plan_model

    world = env.world_size if env is not None else 1
    budget = None if args.row_budget_mb is None else int(args.row_budget_mb * 2**20)
    plans = plan_model(model, world, args.sharding, args.column_split_dim, budget)
    if args.print_sharding_plan and (env is None or env.is_main):
        print(describe_plans(plans), file=sys.stderr)
    if env is None:
        return model
    if ckpt is not None:
        model.load_state_dict(ckpt["model"])  # whole tables, before they are split
    return HybridModel(model, plans, env.rank)


def _load_for_inference(args: argparse.Namespace):
    from ctrkit.data.dataset import SplitBinaryDataset
    from ctrkit.data.feature_spec import FeatureSpec
    from ctrkit.device import resolve_device
    from ctrkit.train.checkpoint import check_spec_matches, load_checkpoint, model_from_checkpoint

    ckpt = load_checkpoint(args.checkpoint)
    spec = FeatureSpec.from_yaml(args.dataset)
    check_spec_matches(ckpt, spec.summary(), str(spec.base_dir))
    dataset = SplitBinaryDataset(spec, args.mapping)
    env = _distributed_env(args)
    device = env.device if env is not None else resolve_device(args.device)
    model = model_from_checkpoint(ckpt).to(device)
    if env is not None or args.print_sharding_plan:
        model = _shard(model, args, env, None)  # the checkpoint's whole tables are already in the model
    return ckpt, dataset, model, device, env


def evaluate(args: argparse.Namespace) -> int:
    from ctrkit.device import amp_dtype_for
    from ctrkit.eval.evaluator import evaluate as run_evaluate

    ckpt, dataset, model, device, env = _load_for_inference(args)
    metrics = run_evaluate(
        model, dataset, device, args.batch_size, amp_dtype_for(device, args.amp, None), not args.json, env
    )
    if env is not None and not env.is_main:
        return 0
    metrics = {**metrics, "mapping": args.mapping, "model": ckpt["model_name"], "step": int(ckpt["step"])}
    if args.json:
        # strict JSON: an undefined AUC (one class only) is null, not NaN
        print(json.dumps({k: None if v != v else v for k, v in metrics.items()}, sort_keys=True))
    else:
        line = (
            f"{ckpt['model_name']} step {metrics['step']} on {args.mapping}: AUC {metrics['auc']:.4f}  "
            f"logloss {metrics['logloss']:.4f}  samples {metrics['samples']:,}  CTR {metrics['ctr']:.4f}"
        )
        if "map@12" in metrics:
            line += f"  MAP@12 {metrics['map@12']:.4f} over {metrics['map_groups']:,} groups"
        print(line)
    return 0


def predict(args: argparse.Namespace) -> int:
    import numpy as np

    from ctrkit.eval.evaluator import predict_logits
    from ctrkit.eval.metrics import sigmoid

    _, dataset, model, device, env = _load_for_inference(args)
    logits = predict_logits(model, dataset, device, args.batch_size, progress=env is None, env=env)
    if env is not None and not env.is_main:
        return 0
    probs = sigmoid(logits).astype(np.float32)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.save(args.out, probs)
    print(f"wrote {args.out}: {len(probs):,} click probabilities (float32), mean {probs.mean():.4f}")
    return 0


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


def serve(args: argparse.Namespace) -> int:
    import torch

    from ctrkit.serve.predictor import load_predictor
    from ctrkit.serve.server import serve as run_server

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.max_batch_size < 1 or args.batch_window_ms < 0:
        raise ValueError("--max-batch-size must be >= 1 and --batch-window-ms >= 0")
    predictor = load_predictor(
        args.checkpoint, args.model_dir, args.embedding_store, args.cache_rows, args.dtype, args.compile
    )
    name = args.name or predictor.meta["model_name"]
    print(
        f"serving {name} ({predictor.backend}) on http://{args.host}:{args.port}/v2/models/{name}/infer",
        file=sys.stderr,
        flush=True,
    )
    run_server(predictor, name, args.host, args.port, args.batch_window_ms, args.max_batch_size,
               int(args.max_body_mb * 2**20))  # fmt: skip
    return 0


def bench(args: argparse.Namespace) -> int:
    import torch

    from ctrkit.device import resolve_device

    if args.bench == "preprocess":
        return _bench_preprocess(args)
    if args.bench == "scale":
        return _bench_scale(args)
    if args.bench == "inference":
        return _bench_inference(args)
    from ctrkit.bench.train_bench import TrainBenchConfig, run_train_bench

    if args.threads:
        torch.set_num_threads(args.threads)
    values = {f.name: getattr(args, f.name) for f in fields(TrainBenchConfig) if hasattr(args, f.name)}
    cfg = TrainBenchConfig(**values)
    result = run_train_bench(cfg, resolve_device(args.device))
    print(
        f"{cfg.model} train, batch {cfg.batch_size}, {'amp ' + result['amp_dtype'] if cfg.amp else 'fp32'}, "
        f"optimizers {result['optimizers']['dense']}/{result['optimizers']['embedding']}, "
        f"{result['threads']} threads: {result['samples_per_s']:,.0f} samples/s (median of {cfg.repeats}), "
        f"{result['ms_per_step']:.2f} ms/step"
    )
    _write_result(result, args.output)
    return 0


def _write_result(result: dict | list, path: Path | None) -> None:
    """Writes a benchmark result as JSON when ``--output`` was given."""
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
        print(f"wrote {path}")


def _bench_scale(args: argparse.Namespace) -> int:
    from ctrkit.bench.scale_bench import ScaleBenchConfig, run_scale_bench, run_worker
    from ctrkit.distributed.env import init_distributed, launched_by_torchrun

    def config(model: str) -> ScaleBenchConfig:
        return ScaleBenchConfig(
            model, args.scale, args.embedding_dim, args.batch_size, args.warmup, args.steps, args.sharding, args.seed
        )

    if args.worker_output is not None:  # one job of the benchmark (every rank of it)
        env = init_distributed("cpu") if launched_by_torchrun() else None
        result = run_worker(config(args.models), env)
        if env is None or env.is_main:
            args.worker_output.write_text(json.dumps(result))
        return 0
    world_sizes = _int_list(args.world_sizes, "--world-sizes")
    results = []
    for model in [m.strip() for m in args.models.split(",") if m.strip()]:
        for r in run_scale_bench(config(model), world_sizes):
            results.append(r)
            print(
                f"{model} ({r['tables']} tables, {r['embedding_mib']:.1f} MiB at 1/{args.scale:g}), world size "
                f"{r['world_size']}: {r['ms_per_step']:.1f} ms/step, {r['samples_per_s']:,.0f} samples/s"
            )
    _write_result(results, args.output)
    return 0


def _bench_inference(args: argparse.Namespace) -> int:
    import tempfile

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
    batch_sizes = _int_list(args.batch_sizes, "--batch-sizes")
    if not batch_sizes or min(batch_sizes) < 1:
        raise ValueError(f"--batch-sizes: expected positive integers, got '{args.batch_sizes}'")
    if args.server is not None:
        if args.requests < 1 or args.concurrency < 1:
            raise ValueError("--requests and --concurrency must be >= 1")
        results = run_through_server(args.server, args.model, batch_sizes, args.requests, args.concurrency)
    else:
        runtimes = [r.strip() for r in args.runtimes.split(",") if r.strip()]
        check_in_process_args(runtimes, args.repeats)  # before building a Kaggle-shape checkpoint
        with tempfile.TemporaryDirectory(prefix="ctrkit-kaggle-") as tmp:
            ckpt = args.checkpoint or kaggle_checkpoint(Path(tmp) / "dlrm_kaggle.pt")
            results = run_in_process(ckpt, batch_sizes, runtimes, args.seconds, repeats=args.repeats)
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
    _write_result({"results": results, "environment": env}, args.output)
    return 0


def _int_list(text: str, flag: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{flag}: expected comma-separated integers, got '{text}'") from None


def _bench_preprocess(args: argparse.Namespace) -> int:
    from ctrkit.bench.preprocess_bench import run_preprocess_bench

    result = run_preprocess_bench(args.rows, args.input, args.engine, args.seed, args.spark_master, args.repeats)
    print(
        f"preprocess criteo ({result['engine']}): {result['rows']:,} rows in {result['seconds']:.1f} s "
        f"(median of {result['repeats']}) = "
        f"{result['rows_per_s']:,.0f} rows/s, peak RSS {result['peak_rss_mb']:,.0f} MB"
    )
    _write_result(result, args.output)
    return 0


def models(args: argparse.Namespace) -> int:
    from ctrkit.models.registry import config_to_dict, list_models, train_defaults

    for name in list_models():
        shape = {
            k: v
            for k, v in config_to_dict(_example_config(name)).items()
            if k not in ("num_numerical", "cardinalities")
        }
        print(f"{name}: {shape}; training defaults {train_defaults(name)}")
    return 0


def _example_config(name: str):
    from ctrkit.models.registry import config_class

    return config_class(name)(num_numerical=13, cardinalities=(1,))
