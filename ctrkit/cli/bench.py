"""Benchmark commands: bench train, preprocess, scale, inference."""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from ctrkit.bench.config import (
    ABLATION_FAMILIES,
    PANEL_FAMILIES,
    AblationBenchConfig,
    AccuracyBenchConfig,
    BenchRunOptions,
    CheckpointBenchConfig,
    EpochBenchConfig,
    InferenceBenchConfig,
    LoaderBenchConfig,
    PreprocessBenchConfig,
    RawRowsBenchConfig,
    RefreshBenchConfig,
    ScaleBenchOptions,
    StreamBenchConfig,
    TableStreamBenchConfig,
    TrainBenchConfig,
)
from ctrkit.cli.options import add_command, config_from, write_result


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bench",
        help="benchmarks: training, loader, preprocessing, scaling, inference, accuracy, ablation, checkpoint digests",
    )
    bsub = p.add_subparsers(
        dest="bench",
        required=True,
        help="what to measure",
    )
    add_command(bsub, "inference", inference, (InferenceBenchConfig, BenchRunOptions), ("device",))
    add_command(bsub, "scale", scale, (ScaleBenchOptions, BenchRunOptions), ("threads", "device"))
    add_command(bsub, "preprocess", preprocess, (PreprocessBenchConfig, BenchRunOptions), ("threads", "device"))
    add_command(bsub, "train", train, (TrainBenchConfig, BenchRunOptions))
    add_command(bsub, "accuracy", accuracy, (AccuracyBenchConfig, BenchRunOptions), ("device", "output"))
    add_command(bsub, "ablation", ablation, (AblationBenchConfig, BenchRunOptions), ("device", "output"))
    add_command(bsub, "checkpoint", checkpoint, (CheckpointBenchConfig, BenchRunOptions), ("device",))
    add_command(bsub, "loader", loader, (LoaderBenchConfig, BenchRunOptions))
    add_command(bsub, "epoch", epoch, (EpochBenchConfig, BenchRunOptions), ("device", "threads"))
    add_command(bsub, "stream", stream, (StreamBenchConfig, BenchRunOptions), ("device",))
    add_command(bsub, "table-stream", table_stream, (TableStreamBenchConfig, BenchRunOptions), ("device",))
    add_command(bsub, "raw-rows", raw_rows, (RawRowsBenchConfig, BenchRunOptions), ("device", "threads"))
    add_command(bsub, "refresh", refresh, (RefreshBenchConfig, BenchRunOptions), ("device",))


def _check_methods(asked, known) -> None:
    unknown = [m for m in asked if m not in known]
    if unknown:
        raise ValueError(f"--methods: unknown '{unknown[0]}'; expected some of {', '.join(known)}")


def _threads(run: BenchRunOptions) -> None:
    if run.threads:
        import torch

        torch.set_num_threads(run.threads)


def inference(args: argparse.Namespace) -> int:
    """inference samples/s and latency per batch size, in process per runtime or through a server

    In process: scores pre-built batches with each of --runtimes for about --seconds per batch size, the
    runtimes taking turns for --repeats rounds (samples/s is the median over rounds, with the ratio to torch
    fp32 of the same round). With --server: sends --requests binary-tensor requests per batch size from
    --concurrency tritonclient clients to a running `ctrkit serve`. Reports samples/s and latency
    p50/p90/p99, and the machine's load average before and after (other work competing for the cores).
    """
    from ctrkit.bench.inference_bench import (
        check_in_process_args,
        environment,
        kaggle_checkpoint,
        run_in_process,
        run_through_server,
    )
    from ctrkit.bench.peak import where_it_ran

    cfg: InferenceBenchConfig = config_from(args, InferenceBenchConfig)
    run: BenchRunOptions = config_from(args, BenchRunOptions)
    _threads(run)
    before = environment()
    if min(cfg.batch_sizes) < 1:
        raise ValueError(f"--batch-sizes: expected positive integers, got {list(cfg.batch_sizes)}")
    if cfg.server is not None:
        if cfg.requests < 1 or cfg.concurrency < 1:
            raise ValueError("--requests and --concurrency must be >= 1")
        results = run_through_server(cfg.server, cfg.model, list(cfg.batch_sizes), cfg.requests, cfg.concurrency)
    else:
        check_in_process_args(cfg.runtimes, cfg.repeats)  # before building a Kaggle-shape checkpoint
        with tempfile.TemporaryDirectory(prefix="ctrkit-kaggle-") as tmp:
            ckpt = cfg.checkpoint or kaggle_checkpoint(Path(tmp) / "dlrm_kaggle.pt")
            results = run_in_process(ckpt, list(cfg.batch_sizes), list(cfg.runtimes), cfg.seconds,
                                     repeats=cfg.repeats)  # fmt: skip
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
    write_result({"results": results, "environment": env, **where_it_ran()}, run.output)
    return 0


def scale(args: argparse.Namespace) -> int:
    """step time per world size on the Merlin synthetic models, scaled down

    The Merlin Distributed-Embeddings synthetic DLRMs (tiny 55 tables 4.2 GiB, small 107 / 26.3, medium
    311 / 206.2, large 612 / 773.8, jumbo 1,022 / 3,109.5 GiB) divided in size by --scale, power-law table
    sizes and ids, Adagrad; each world size runs as its own job (torchrun above 1 rank), the cores split
    between its ranks. Reports the median step time.
    """
    from ctrkit.bench.scale_bench import ScaleBenchConfig, run_scale_bench, run_worker
    from ctrkit.distributed.env import init_distributed, launched_by_torchrun

    opts: ScaleBenchOptions = config_from(args, ScaleBenchOptions)

    def config(model: str) -> ScaleBenchConfig:
        return ScaleBenchConfig(model, opts.scale, opts.embedding_dim, opts.batch_size, opts.warmup, opts.steps,
                                opts.sharding, opts.seed)  # fmt: skip

    if opts.worker_output is not None:  # one job of the benchmark (every rank of it)
        env = init_distributed("cpu") if launched_by_torchrun() else None
        result = run_worker(config(opts.models[0]), env)
        if env is None or env.is_main:
            opts.worker_output.write_text(json.dumps(result))
        return 0
    results = []
    for model in opts.models:
        for r in run_scale_bench(config(model), list(opts.world_sizes)):
            results.append(r)
            print(
                f"{model} ({r['tables']} tables, {r['embedding_mib']:.1f} MiB at 1/{opts.scale:g}), world size "
                f"{r['world_size']}: {r['ms_per_step']:.1f} ms/step, {r['samples_per_s']:,.0f} samples/s, largest "
                f"rank's peak resident memory {r['largest_rank_peak_rss_mib']:,.0f} MiB"
            )
    write_result(results, config_from(args, BenchRunOptions).output)
    return 0


def preprocess(args: argparse.Namespace) -> int:
    """preprocessing rows/s and peak RSS

    Runs `ctrkit preprocess criteo` as a child process on a generated raw Criteo file (or --input) and
    reports end-to-end rows/s and the child's peak RSS.
    """
    from ctrkit.bench.peak import where_it_ran
    from ctrkit.bench.preprocess_bench import run_preprocess_bench

    cfg: PreprocessBenchConfig = config_from(args, PreprocessBenchConfig)
    result = run_preprocess_bench(cfg.rows, cfg.input, cfg.engine, cfg.seed, cfg.spark_master, cfg.repeats)
    print(
        f"preprocess criteo ({result['engine']}): {result['rows']:,} rows in {result['seconds']:.1f} s "
        f"(median of {result['repeats']}) = {result['rows_per_s']:,.0f} rows/s, "
        f"peak RSS {result['peak_rss_mb']:,.0f} MB"
    )
    write_result({**result, **where_it_ran()}, config_from(args, BenchRunOptions).output)
    return 0


def train(args: argparse.Namespace) -> int:
    """training throughput on synthetic in-memory batches

    Times full training steps (forward, backward, the optimizers' updates, sparse on the tables) on
    synthetic in-memory batches, with the model's own optimizers unless --optimizer and --embedding-optimizer
    name others. Default: the Criteo-Kaggle DLRM shape (26 tables x 100,000 rows, dim 16, bottom
    13-512-256-64-16, top 512-256-1, batch 2048), 10 warm-up steps, then the median of 5 repeats of 50 steps;
    the JSON records the machine and the matmul peak measured in the same run.
    """
    from ctrkit.bench.train_bench import run_train_bench
    from ctrkit.device import resolve_device

    cfg: TrainBenchConfig = config_from(args, TrainBenchConfig)
    run: BenchRunOptions = config_from(args, BenchRunOptions)
    _threads(run)
    result = run_train_bench(cfg, resolve_device(run.device))
    precision = f"amp {result['amp_dtype']}" if result["amp_dtype"] else "fp32" + (
        " (--amp: autocast does not run here, as `train --amp` would not)" if cfg.amp else "")  # fmt: skip
    print(
        f"{cfg.model} train, batch {cfg.batch_size}, {precision}, "
        f"optimizers {result['optimizers']['dense']}/{result['optimizers']['embedding']}, "
        f"{result['machine']['threads']} threads"
        + (f" (the batch split over {result['split_threads']})" if result["split_threads"] > 1 else "")
        + f": {result['samples_per_s']:,.0f} samples/s (median of {cfg.repeats}), "
        f"{result['ms_per_step']:.2f} ms/step"
    )
    peak_kind = "bf16" if result["amp_dtype"] else "fp32"
    fraction = result["fraction_of_peak"]
    print(
        f"  matrix multiplies: {result['flops_per_sample']['train_step'] / 1e6:.2f} MFLOP per sample per step "
        f"(forward {result['flops_per_sample']['forward'] / 1e6:.2f}), {result['achieved_gflops']:,.1f} GFLOP/s"
        + (f" = {fraction:.0%} of the {peak_kind} matmul peak measured now "
           f"({result['matmul_peak_gflops'][peak_kind]:,.0f} GFLOP/s)" if fraction is not None else "")
    )  # fmt: skip
    each = ", ".join(f"{f:.0%}" for f in result["fraction_of_peak_per_repeat"])
    paired = result["fraction_of_peak_paired"]
    print(f"  each repeat against the peak read right after it: median {paired:.0%} ({each})")
    if result["breakdown"] is not None:
        b = result["breakdown"]
        print(f"  step time by part (ms per step, medians of {cfg.steps} steps, total {b['total_ms']:.2f}):")
        for part, ms in b["ms"].items():
            print(f"    {part:<50} {ms:8.2f}  {ms / b['total_ms']:5.1%}")
        if b["matmul_ms"] is not None:
            print(f"    of which matrix multiplies (profiler self time)   {b['matmul_ms']:8.2f}  "
                  f"{b['matmul_ms'] / b['total_ms']:5.1%}")  # fmt: skip
        else:
            print("    (no matrix multiplies' time: torch's profiler does not record the worker threads)")
        for label, ms in b.get("optimizer_ms", {}).items():
            print(f"    {label + ' (one thread)':<50} {ms:8.2f}")
    write_result(result, run.output)
    return 0


def accuracy(args: argparse.Namespace) -> int:
    """test AUC of every model with its defaults against logistic regression and LightGBM, on a panel

    Builds each data set of the panel (the real samples, three families of planted synthetic data with a
    known Bayes-optimal AUC, synthetic raw Outbrain files through `preprocess outbrain`, twenty-eight independent
    real tables through `preprocess table`, and any --datasets), fits the baselines on exactly the split the
    trainer uses (the validation mapping or the held-out tail of train) and trains each model with nothing but the
    dataset given, then writes one table: test AUC (log loss) per data set and method, the best step of
    each model, wall time.
    """
    from ctrkit.bench.accuracy import LABELS, columns, run_entry, targets, write_results
    from ctrkit.bench.panel import PanelEntry, build_panel
    from ctrkit.config import PRECISIONS

    cfg: AccuracyBenchConfig = config_from(args, AccuracyBenchConfig)
    _threads(config_from(args, BenchRunOptions))
    unknown = (
        set(cfg.panel) - {*PANEL_FAMILIES, "none"} | set(cfg.models) - set(LABELS) | set(cfg.baselines) - set(LABELS)
    )
    if unknown:
        raise ValueError(f"unknown panel entries, models or baselines: {sorted(unknown)}")
    if cfg.epochs is not None and min(cfg.epochs) < 1:
        raise ValueError(f"--epochs: expected maxima >= 1, got {','.join(map(str, cfg.epochs))}")
    if set(cfg.precisions or ()) - set(PRECISIONS):
        raise ValueError(f"--precisions: expected names among {', '.join(PRECISIONS)}, got {','.join(cfg.precisions)}")
    shared = cfg.shared_data or Path("..") / "shared" / "data"
    rows = {"planted": cfg.planted_rows, "tabular": cfg.tabular_rows, "amounts": cfg.amounts_rows,
            "outbrain": cfg.outbrain_rows, "shop": cfg.shop_rows}  # fmt: skip
    entries = build_panel(cfg.work, shared, cfg.panel, rows, cfg.seeds)
    if "independent" in cfg.panel:
        from ctrkit.bench.independent import TABLES, build_independent, fetch_tables, missing_tables

        try:
            source = cfg.independent_data or fetch_tables(cfg.work / ".independent")
        except OSError as e:
            print(f"independent: skipped ({e}); --independent-data names a local copy", flush=True)
        else:
            missing = missing_tables(source)
            if missing:
                print(f"independent: {', '.join(missing)} skipped (their files are not under {source})", flush=True)
            entries += build_independent(cfg.work, source, tuple(n for n in TABLES if n not in missing))
    entries += [PanelEntry(Path(d).name, Path(d), f"user dataset {d}") for d in cfg.datasets or ()]
    if not entries:
        raise ValueError(f"the panel is empty: no real samples under {shared} and no planted or user data sets")
    trained = columns(cfg.models, cfg.epochs, cfg.precisions)
    headings = {**{b: LABELS[b] for b in cfg.baselines}, **{c.key: c.heading for c in trained}}
    methods = [*cfg.baselines, *(c.key for c in trained)]
    rows: list[dict] = []

    def write(row: dict) -> None:  # after each run: a panel stopped part way keeps every run it finished
        if cfg.out is not None:
            write_results([*rows, row], methods, headings, cfg.out, {"config": repr(cfg)})

    for entry in entries:
        rows.append(run_entry(entry, trained, cfg.baselines, done=write))
        res = rows[-1]["results"]
        print(f"{entry.name}: " + ", ".join(f"{headings[m]} {r['auc']:.4f}" for m, r in res.items()), flush=True)
    for line in targets(rows):
        print(line)
    if cfg.out is not None:
        print(f"wrote {cfg.out / 'results.md'}")
    return 0


def ablation(args: argparse.Namespace) -> int:
    """what each mechanism of a recipe earns: the recipe's run and the run with one mechanism switched

    Trains the model once per data set and training seed with the recipe (default: tuned), then once more with
    each mechanism switched alone (off; one the recipe leaves out, on) and with each lower maximum of epochs.
    A mechanism the recipe's run never used (no redraw, no plateau, one batch) is not run again, and
    calibration is read from the run itself (it scores the uncalibrated logits too). Writes results.json as
    each run ends (an interrupted ablation resumes where it stopped) and results.md: per mechanism and data set
    the test AUC and log loss it earns on the mean over seeds, the seed spread, and the verdict (kept where it
    gains on the mean somewhere and loses nowhere by more than the seed spread).
    """
    from ctrkit.bench.ablation import markdown, run_ablation, summarize
    from ctrkit.bench.panel import PanelEntry, build_panel
    from ctrkit.train.mechanisms import MECHANISMS
    from ctrkit.train.recipes import recipe

    cfg: AblationBenchConfig = config_from(args, AblationBenchConfig)
    _threads(config_from(args, BenchRunOptions))
    recipe(cfg.recipe)  # an unknown name: the one-line error
    mechanisms = cfg.mechanisms or tuple(MECHANISMS)
    unknown = set(mechanisms) - set(MECHANISMS) | set(cfg.panel) - {*ABLATION_FAMILIES, "none"}
    if unknown:
        raise ValueError(f"unknown mechanisms or panel entries: {sorted(unknown)}; mechanisms: {', '.join(MECHANISMS)}")
    shared = cfg.shared_data or Path("..") / "shared" / "data"
    rows = {"planted": cfg.planted_rows, "tabular": cfg.tabular_rows, "shop": cfg.shop_rows}
    entries = build_panel(cfg.work, shared, cfg.panel, rows, cfg.data_seeds)
    entries += [PanelEntry(Path(d).name, Path(d), f"user dataset {d}") for d in cfg.datasets or ()]
    if not entries:
        raise ValueError(f"no data sets: no real samples under {shared} and no planted or user data sets")
    settings = {f"epochs_{e}": {"epochs": e} for e in cfg.max_epochs}
    records = run_ablation(entries, cfg.model, mechanisms, cfg.train_seeds, cfg.out, cfg.recipe, settings,
                           echo=lambda line: print(line, flush=True))  # fmt: skip
    table = markdown(summarize(records))
    (cfg.out / "results.md").write_text(table)
    print(table)
    print(f"wrote {cfg.out / 'results.md'}")
    return 0


def loader(args: argparse.Namespace) -> int:
    """the input pipeline alone: batches read, and read and copied to the device

    Reads --batches batches of --batch-size from the training mapping of --dataset (or a synthetic dataset of the
    seeds' FL15 tables made once in --work) as training reads them, with no model step, then the same with each
    batch fed to --device as training feeds it (on a GPU: read in the files' dtypes into pinned memory, copied
    one batch ahead on a side stream and widened there) and, on a GPU, with the wide batches copied from pageable
    memory, taking turns for --rounds rounds; prints the median samples a second of each.
    """
    from ctrkit.bench.loader_bench import run_loader_bench
    from ctrkit.bench.peak import machine
    from ctrkit.device import resolve_device

    cfg: LoaderBenchConfig = config_from(args, LoaderBenchConfig)
    run = config_from(args, BenchRunOptions)
    _threads(run)
    device = resolve_device(run.device)
    result = {**run_loader_bench(cfg, device), "machine": machine()}
    m = result["median_samples_per_s"]
    print(
        f"loader, {result['batches']} batches of {cfg.batch_size:,}, medians of {cfg.rounds} rounds: "
        f"{m['loader']:,.0f} samples/s alone, {m['loader_and_copy']:,.0f} samples/s with the copy to {device}"
        + (f" ({m['wide_pageable_copy']:,.0f} copied wide from pageable memory)" if "wide_pageable_copy" in m else "")
    )
    write_result(result, run.output)
    return 0


def checkpoint(args: argparse.Namespace) -> int:
    """what the digest of a checkpoint's tensors costs its save and load

    Writes a checkpoint of --size-mb of tensor data with the digest and without it, and reads each back
    (verifying the first), the two taking turns for --rounds rounds; prints the median seconds of each and the
    digest's share of the save and of the load.
    """
    from ctrkit.bench.checkpoint_bench import run_checkpoint_bench
    from ctrkit.bench.peak import machine

    cfg: CheckpointBenchConfig = config_from(args, CheckpointBenchConfig)
    run = config_from(args, BenchRunOptions)
    _threads(run)
    result = {**run_checkpoint_bench(cfg), "machine": machine()}
    m = result["median_seconds"]
    print(f"checkpoint of {cfg.size_mb} MiB, medians of {cfg.rounds} rounds: save {m['save']:.3f} s, with digest "
          f"{m['save_digest']:.3f} s ({result['save_overhead']:+.1%}); load {m['load']:.3f} s, verified "
          f"{m['load_digest']:.3f} s ({result['load_overhead']:+.1%}); the digest alone "
          f"{m['digest']:.3f} s")  # fmt: skip
    write_result(result, run.output)
    return 0


def epoch(args: argparse.Namespace) -> int:
    """one training epoch at scale: samples/s per 5% of the epoch, memory over time, the time of every phase

    Makes a Criteo-1TB-shaped dataset with `ctrkit synth` (--rows, --tables; kept in --work for the next run)
    unless --dataset names one, trains DLRM on it for one epoch in a child `ctrkit train` process (validation
    4 times an epoch, a checkpoint at each, the test split at the end) while sampling its resident memory each
    second, and reads its log back: samples/s and memory in each 5% of the epoch's steps, and the seconds of
    start-up, warm start, steps, validation, checkpoints and test. Prints the one-epoch time and, at the measured
    rate, what an epoch of Criteo 1TB's 4.2 billion rows would take.
    """
    from ctrkit.bench.epoch_bench import run_epoch, summarize
    from ctrkit.bench.peak import machine
    from ctrkit.data.synthetic import CRITEO_1TB_FL15_CARDINALITIES, generate_dataset

    cfg: EpochBenchConfig = config_from(args, EpochBenchConfig)
    run = config_from(args, BenchRunOptions)
    dataset = cfg.dataset
    if dataset is None:
        dataset = cfg.work / f"data-{cfg.rows}"
        if not (dataset / "feature_spec.yaml").exists():
            generate_dataset(dataset, cfg.rows, cfg.tables or CRITEO_1TB_FL15_CARDINALITIES, 13, 0.01, 0,
                             overwrite=True)  # fmt: skip
    extra = []
    for flag, value in (("--embedding-dim", cfg.embedding_dim), ("--embedding-optimizer", cfg.embedding_optimizer),
                        ("--batch-size", cfg.batch_size), ("--eval-dtype", cfg.eval_dtype)):  # fmt: skip
        if value is not None:
            extra += [flag, str(value)]
    from ctrkit.data.dataset import SplitBinaryDataset

    rows = len(SplitBinaryDataset(dataset, "train", check_ids=False))
    steps = -(-int(rows * 0.9) // (cfg.batch_size or 1024))
    extra += ["--print-freq", str(max(1, steps // 200))]
    measured = run_epoch(dataset, cfg.work, extra)
    result = {**summarize(measured), "machine": machine(), "dataset": str(dataset), "train_args": extra,
              "summary": measured["summary"]}  # fmt: skip
    rate = result["samples_per_s_median"] or 0
    trainer = result["phases_seconds"]["trainer in all"]
    print(f"one epoch of {result['rows']:,} rows: {trainer:,.0f} s in the trainer, {rate:,.0f} samples/s "
          f"(median of 5% parts); a Criteo 1TB epoch (4.2 billion rows) at that rate: "
          f"{4.2e9 / rate / 3600:,.1f} h" if rate else "no training records")  # fmt: skip
    write_result(result, run.output)
    return 0


def stream(args: argparse.Namespace) -> int:
    """day by day on a drifting stream: a fixed vocabulary, retraining on all days, dynamic tables continued

    Writes `ctrkit synth stream` (--days, --rows, --capacity) in --work, then for each test day k+1 (2..N):
    fixed: the vocabulary of day 1 and a model trained once on day 1; retrain: a new vocabulary of days 1..k and
    a model trained from scratch on all of them; dynamic: raw ids in dynamic tables, trained on day 1 and
    continued (`train --continue-from`) on each later day alone. Each trains with train's defaults (--model)
    and is scored on day k+1's test rows: test AUC and log loss, training seconds and table rows per day, and
    their means over the test days.
    """
    from ctrkit.bench.stream_bench import METHODS, run_stream, summary
    from ctrkit.data.synthetic_stream import write_stream

    cfg: StreamBenchConfig = config_from(args, StreamBenchConfig)
    run = config_from(args, BenchRunOptions)
    _threads(run)
    _check_methods(cfg.methods, METHODS)
    days = write_stream(cfg.work / "stream", cfg.days, cfg.rows, capacity=cfg.capacity, seed=cfg.seed,
                        overwrite=True)  # fmt: skip
    options = {"model": cfg.model}
    for name in ("admit_after", "count_half_life", "max_steps"):
        if getattr(cfg, name) is not None:
            options[name] = getattr(cfg, name)
    records = run_stream(days, cfg.work / "runs", options, cfg.methods)
    write_result(_days_result(cfg, records, summary(records, cfg.methods), "test AUC"), run.output)
    return 0


def _days_result(cfg, records: list, means: dict, what: str) -> dict:
    """A day-by-day benchmark's result (the machine, the config, each test day, the means), its means printed."""
    from ctrkit.bench.peak import machine

    for method, s in means.items():
        print(f"{method}: mean {what} {s['mean_auc']:.4f}, log loss {s['mean_logloss']:.4f}, "
              f"{s['train_seconds']:,.0f} s of training, tables of at most {s['most_table_rows']:,} rows")  # fmt: skip
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(cfg).items()}
    return {"machine": machine(), "config": config, "days": records, "summary": means}


def table_stream(args: argparse.Namespace) -> int:
    """day by day on a drifting table of text columns: --like continued, raw ids continued, retraining on all days

    Writes --days CSV files of --rows rows (text columns of ids born and fading every day, numbers, a click) in
    --work, then for each test day k+1 (2..N): like: day k preprocessed `--like` day k-1's model and trained
    `--continue-from` it (day 1 preprocessed and trained alone); raw_ids: every text column as raw ids in dynamic
    tables, continued likewise; retrain: days 1..k preprocessed together and trained from scratch; regression (asked
    for by name): a logistic regression on days 1..k preprocessed together, C chosen on their validation rows. Each
    is scored
    on day k+1's raw test rows as `predict --input` scores them: next-day AUC and log loss, seconds (preprocessing
    included) and table rows per day, and their means over the test days.
    """
    from ctrkit.bench.stream_bench import summary
    from ctrkit.bench.table_stream import METHODS, run_table_stream, write_text_days

    cfg: TableStreamBenchConfig = config_from(args, TableStreamBenchConfig)
    run = config_from(args, BenchRunOptions)
    _threads(run)
    _check_methods(cfg.methods, METHODS)
    if cfg.days < 2 or cfg.rows < 100:
        raise ValueError(f"a table stream needs at least 2 days of 100 rows, got {cfg.days} days of {cfg.rows}")
    days = write_text_days(cfg.work / "days", cfg.days, cfg.rows, cfg.vocabularies, cfg.seed)
    options = {"model": cfg.model, **({"max_steps": cfg.max_steps} if cfg.max_steps is not None else {})}
    records = run_table_stream(days, cfg.work / "runs", options, cfg.methods)
    write_result(_days_result(cfg, records, summary(records, cfg.methods), "next-day AUC"), run.output)
    return 0


def raw_rows(args: argparse.Namespace) -> int:
    """raw rows in, clicks out: predict --input throughput and memory, one-row raw-value request latency

    Writes a click log (`ctrkit.data.synthetic_clicks`: --train-rows training rows, and --rows and twice as many
    new rows without the click), preprocesses it (`preprocess table`), trains DLRM with its default shape for
    --steps steps, then times `ctrkit predict --input` of each new file to a CSV in child processes (wall time, rows/s
    and peak resident memory; interleaved --rounds), and sends one-row requests to a real `ctrkit serve` on
    loopback, raw values and ids taking turns (latency p50 and p99).
    """
    from ctrkit.bench.peak import machine
    from ctrkit.bench.raw_rows_bench import run_raw_rows

    cfg: RawRowsBenchConfig = config_from(args, RawRowsBenchConfig)
    run = config_from(args, BenchRunOptions)
    measured = run_raw_rows(cfg.work, cfg.rows, cfg.rounds, cfg.requests, cfg.port, cfg.train_rows, cfg.steps,
                            cfg.warm_up_seconds)  # fmt: skip
    result = {"machine": machine(), **measured}
    for m in result["predict_median"].values():
        rate, peak = f"{m['rows_per_s']:,.0f}", f"{m['peak_rss_mib']:,.0f}"
        print(f"predict --input {m['rows']:,} rows: {rate} rows/s end to end, peak {peak} MiB")
    for name, m in result["requests"].items():
        print(f"one-row {name} requests: p50 {m['p50_ms']:.2f} ms, p99 {m['p99_ms']:.2f} ms over {m['requests']:,}")
    write_result(result, run.output)
    return 0


def refresh(args: argparse.Namespace) -> int:
    """`ctrkit refresh` day by day: false refusals on clean streams, catches on broken days

    Writes --days CSV files of --rows rows per stream (text columns of ids born and fading every day, numbers, a
    click) in --work: one stream per --clean-seeds and one (--broken-seed) whose days 4, 5 and 6 have shuffled
    labels, a renamed column and a numerical column all missing. Each stream is refreshed day by day into its own
    repository with refresh's defaults. Reports each day's verdict, the served model's AUC on the day before
    training on it and the seconds; the summary counts the refusals of clean days and the broken days refused. The
    clean days also get a model retrained from scratch on all days so far and a tuned logistic regression, scored on
    the same day, and the seconds of the day's steps run by hand (--fresh-rows: refresh's; 0: the continued
    candidate alone). Then the first clean stream's versions are placed
    one by one in a repository that `ctrkit serve --poll-s` and real Triton in POLL mode (where `make triton`
    installed it) serve to 4 clients: failed requests and latency p99 around the swaps against the steady state.
    """
    from ctrkit.bench.peak import machine
    from ctrkit.bench.refresh_bench import SHOP, run_refresh_bench, stream_family

    cfg: RefreshBenchConfig = config_from(args, RefreshBenchConfig)
    run = config_from(args, BenchRunOptions)
    _threads(run)
    options = {"max_steps": cfg.max_steps} if cfg.max_steps is not None else {}
    family = SHOP if cfg.family == "shop" else stream_family(cfg.vocabularies)
    settings = {"fresh_rows": cfg.fresh_rows} if cfg.fresh_rows is not None else {}
    result = run_refresh_bench(cfg.work, family, cfg.days, cfg.rows, cfg.clean_seeds, cfg.broken_seed, options,
                               serve_swaps=not cfg.no_swaps, settings=settings)  # fmt: skip
    s = result["summary"]
    print(
        f"clean days: {s['clean_days']}, refused {s['false_refusals']}, kept by the gate {s['clean_kept']}; broken "
        f"days: {s['broken_days']}, refused {s['broken_refused']}, published {s['broken_published']}; mean "
        f"progressive AUC on clean days {s['mean_progressive_auc_clean']} (retraining on all days so far "
        f"{s['mean_retrain_auc']}, logistic regression {s['mean_logistic_auc']}), {s['mean_day_seconds']} s a day "
        f"({s['median_time_ratio']}x its steps by hand); the fresh candidate taken on {s['fresh_taken']} clean days"
    )
    write_result({"machine": machine(), "config": {k: str(v) if isinstance(v, Path) else v
                                                   for k, v in vars(cfg).items()}, **result}, run.output)  # fmt: skip
    return 0
