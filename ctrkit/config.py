"""Typed, frozen configuration of the components (model configs live beside their models).

Each field carries its help text in its metadata: the command line's flags are generated from these
dataclasses (``cli/options.py``), so every default has one source, this file.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

DENSE_OPTIMIZERS = ("sgd", "adagrad", "adam", "rmsprop")
TABLE_OPTIMIZERS = ("sgd", "adagrad", "rowwise_adagrad", "adam", "ftrl")
EXPORT_FORMATS = ("onnx", "torchscript", "triton")
QUANTIZATIONS = ("none", "int8")
RECIPES = ("tuned", "plain", "nvidia")  # defined in train/recipes.py


def option(default: Any, help: str, choices: tuple | None = None, unset: str | None = None, **command_line: Any) -> Any:
    """A config field with its command-line description.

    Args:
        default: the field's default.
        help: what the setting does.
        choices: the values it may take.
        unset: what a default of None means (e.g. "the model's").
        command_line: how the flag is spelled beyond the defaults: ``parse`` ("int_list", "name_list"),
            ``required``, ``positional``, ``nargs``, ``exclusive`` (a group name: at most one of the group,
            exactly one if a member is ``required``), ``hidden``, ``shown`` (the default as the help says
            it), ``suppress`` (absent from the parsed arguments unless given).
    """
    return field(default=default, metadata={"help": help, "choices": choices, "unset": unset, **command_line})


@dataclass(frozen=True)
class TrainConfig:
    """How to train (each field's metadata holds its description).

    Fields a model chooses for itself (optimizers, rates, batch size) are None until ``resolve`` fills them in;
    those that depend on the data (the most epochs, the patience, the schedule's steps, the small batch) stay None
    until the run's plan sets them (``train/plan.py``; ``ctrkit train --dry-run`` prints it).
    """

    epochs: int | None = option(
        None, "the most passes over the training data (training stops earlier on a plateau)",
        unset="the plan's: 10, more on data of a few batches an epoch",
    )  # fmt: skip
    max_steps: int | None = option(None, "stop after this many steps in total", unset="all epochs")
    batch_size: int | None = option(None, "samples per step", unset="the model's")
    eval_batch_size: int = option(16384, "samples per forward pass in evaluation")
    lr: float | None = option(None, "peak learning rate of the dense part", unset="the model's")
    optimizer: str | None = option(None, "optimizer of the dense part", DENSE_OPTIMIZERS, "the model's")
    embedding_optimizer: str | None = option(
        None, "optimizer of the embedding tables, always with sparse row updates", TABLE_OPTIMIZERS, "the model's"
    )
    embedding_lr: float | None = option(
        None, "peak learning rate of the embeddings", unset="the model's, else the dense part's"
    )
    wide_optimizer: str | None = option(
        None, "optimizer of a model's wide (linear) part, e.g. wide_deep's", TABLE_OPTIMIZERS, "the model's"
    )
    wide_lr: float | None = option(None, "peak learning rate of the wide part", unset="the model's")
    embedding_l2: float = option(
        0.0,
        "L2 penalty on the embedding vectors each sample looks up (only those rows get its gradient, as sparse "
        "updates), added to the mean loss",
    )
    weight_decay: float = option(0.0, "L2 penalty on the dense part's weights, added to the mean loss")
    warmup_steps: int | None = option(None, "linear warmup steps", unset="the plan's: 5% of the first epoch")
    decay_start_step: int | None = option(
        None, "step where polynomial decay begins", unset="the plan's: where the decay ends with the planned steps"
    )
    decay_steps: int | None = option(None, "length of the decay (0: none)", unset="the plan's: the last half of the "
                                     "planned steps (epochs x batches an epoch)")  # fmt: skip
    decay_power: float = option(2.0, "power of the polynomial decay")
    end_lr: float = option(0.0, "learning rate after the decay")
    lr_schedule: str = option(
        "poly",
        "after the warmup: poly holds the peak lr, then decays it polynomially (the DLRM seed's); step runs at a "
        "quarter of the peak for the first half of the remaining steps and an eighth after (the Wide & Deep seed's)",
        ("poly", "step"),
    )
    schedule_wide: bool = option(
        True,
        "the warmup and decay also apply to a wide (first-order) part; off: it keeps its lr throughout, as the "
        "Wide & Deep seed's linear model",
    )
    seed: int = option(0, "seed of weights, batch order and every torch random source")
    evals_per_epoch: int = option(4, "validation evaluations per epoch, 0 for only at the end")
    validation_fraction: float = option(
        0.1,
        "when the dataset has no 'validation' mapping, hold out this last fraction of 'train' (the most recent "
        "rows of a time-ordered log) for validation; 0 for none (no model selection)",
    )
    linear_warm_start: bool = option(
        True,
        "before training, fit the model's first-order term as an L2-regularised logistic regression (C chosen on "
        "validation, at most the last million training rows) and zero the deep output, so training starts from "
        "that regression and model selection keeps it unless validation improves; needs validation data and a "
        "first-order term",
    )
    warm_start_z: float = option(
        0.0,
        "after the linear warm start, a trained model replaces the fitted regression as the selected model only "
        "when its validation AUC is higher by at least this many standard errors of the paired difference "
        "(DeLong); 0: any gain",
    )
    warm_start_logloss: bool = option(
        True,
        "after the linear warm start, a trained model is selected (in the fitted regression's place or a trained "
        "model's) only when its validation log loss is lower than the regression's, besides its AUC being higher "
        "than the selected model's by min_delta",
    )
    reinit_embeddings: str = option(
        "auto",
        "redraw the deep embedding tables (a new draw each epoch, their optimizer state cleared; every other weight "
        "kept) at the start of every epoch after the first (MEDA, Fan et al. 2023): embedding models can overfit "
        "from their second pass over the same rows, and fresh tables let later epochs improve the model instead. "
        "on: always; auto: once an evaluation after the first epoch falls more than reinit_drop below the best "
        "validation AUC (that overfitting), the best weights are restored, the tables redrawn, and from then on "
        "redrawn at each epoch; off: never",
        ("auto", "on", "off"),
    )
    reinit_drop: float = option(0.01, "the validation AUC fall below the best that turns auto reinit_embeddings on")
    snapshot_ensemble: int = option(
        1,
        "keep the best evaluation of each of the N epochs with the best validation AUC (N copies of the weights, "
        "in memory and in checkpoints); at the end, the mean of the logits of the best 2..N of them replaces the "
        "selected model when its validation AUC is higher by min_delta and it passes the warm-start rules: the "
        "kept model is then that ensemble, whose every member is run on each request. 1: one model. "
        "Single-process runs only",
    )
    seed_ensemble: int = option(
        1,
        "train N models one after another, with seeds seed, seed+1, ..., each selected on validation as a run of "
        "its own (test scored once, at the end); the mean of their logits replaces the best of them when its "
        "validation AUC is higher by min_delta and its log loss lower than the warm start's: the kept model is "
        "then that ensemble, whose every member is run on each request. 1: one model. Single-process runs with "
        "validation data only",
    )
    small_batch: int | None = option(
        None,
        "also train the run (each member of its seed ensemble) at this smaller batch size, with the patience of "
        "the run's batch, and keep the batch whose kept model has the higher validation AUC (the run's on a tie). "
        "0: only the run's batch. Single-process runs with validation data only",
        unset="the plan's: on data of fewer than 10 batches an epoch, the largest power of two at most the training "
        "rows / 32, at least 32; else 0",
    )
    calibrate: str = option(
        "auto",
        "at the end of training, fit one scale of the kept model's logit (temperature scaling: rankings, so AUC, "
        "unchanged) to the validation data's log loss; auto: keep it where a likelihood-ratio test against no "
        "scale passes at 99% (the kept model was over- or underconfident on validation), on: always, off: never. "
        "Checkpoints store it; evaluate, predict, export and serve apply it",
        ("auto", "on", "off"),
    )
    early_stopping_patience: int | None = option(
        None,
        "stop after this many validation evaluations without improvement (0: never stop early)",
        unset="the plan's: 8, or 20 on data of fewer than 10 batches an epoch",
    )
    plateau_patience: int | None = option(
        None,
        "multiply the learning rates by plateau_factor after this many evaluations without improvement (0: never)",
        unset="the plan's: 4, or 10 on data of fewer than 10 batches an epoch",
    )
    plateau_factor: float = option(0.5, "the learning-rate multiplier on a validation plateau")
    min_delta: float = option(1e-4, "the validation AUC gain that counts as an improvement")
    print_freq: int = option(50, "steps between log records")
    amp: bool = option(
        False,
        "mixed precision: bf16 autocast on a CPU with native bf16 (fp32 elsewhere) and on GPUs with bf16 tensor cores, "
        "else fp16 with loss scaling; on CUDA only from 16,384 samples a step per process (fp32 below, where autocast "
        "runs slower; --amp-dtype takes it at any batch)",
    )
    amp_dtype: str | None = option(
        None, "the mixed-precision dtype, taken at any batch (with --amp)", ("bf16", "fp16"), "the --amp rule"
    )
    compile: bool = option(
        False, "torch.compile the model (the seeds' XLA flag); falls back to eager with a message if compiling fails"
    )
    split_batch: str = option(
        "auto",
        "split each step's batch over the CPU's threads: a worker thread per intra-op thread runs its slice's "
        "forward and backward on one thread, then the workers step the optimizers (the same step to float "
        "rounding). auto: on the CPU with 2 or more threads and at least 64 samples a thread, without --compile, "
        "fp16 or torchrun; on: any batch there; off: every operation spread over the threads",
        ("auto", "on", "off"),
    )
    checkpoint_every: int | None = option(None, "also checkpoint every N steps", unset="at evaluations and the end")

    def validate(self) -> None:
        def positive(name: str, allow_none: bool = False, allow_zero: bool = False) -> None:
            v = getattr(self, name)
            if v is None and allow_none:
                return
            if not isinstance(v, int) or isinstance(v, bool) or v < (0 if allow_zero else 1):
                bound = ">= 0" if allow_zero else ">= 1"
                raise ValueError(f"`{name}`: expected an integer {bound}, got {v!r}")

        positive("epochs", allow_none=True)
        positive("max_steps", allow_none=True)
        positive("batch_size", allow_none=True)
        positive("eval_batch_size")
        positive("warmup_steps", allow_none=True, allow_zero=True)
        positive("decay_start_step", allow_none=True, allow_zero=True)
        positive("decay_steps", allow_none=True, allow_zero=True)
        positive("evals_per_epoch", allow_zero=True)
        positive("print_freq")
        positive("checkpoint_every", allow_none=True)
        positive("snapshot_ensemble")
        positive("seed_ensemble")
        positive("small_batch", allow_none=True, allow_zero=True)
        for name in ("lr", "embedding_lr", "wide_lr"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"`{name}`: expected a positive learning rate, got {value}")
        if self.end_lr < 0 or (self.lr is not None and self.end_lr > self.lr):
            raise ValueError(f"`end_lr`: expected 0 <= end_lr <= lr ({self.lr}), got {self.end_lr}")
        for name, allowed in (
            ("optimizer", DENSE_OPTIMIZERS),
            ("embedding_optimizer", TABLE_OPTIMIZERS),
            ("wide_optimizer", TABLE_OPTIMIZERS),
            ("reinit_embeddings", ("auto", "on", "off")),
            ("calibrate", ("auto", "on", "off")),
        ):
            value = getattr(self, name)
            if value is not None and value not in allowed:
                raise ValueError(f"`{name}`: expected one of {', '.join(allowed)}, got {value!r}")
        positive("early_stopping_patience", allow_none=True, allow_zero=True)
        positive("plateau_patience", allow_none=True, allow_zero=True)
        if not 0.0 <= self.validation_fraction < 1.0:
            raise ValueError(f"`validation_fraction`: expected a fraction in [0, 1), got {self.validation_fraction}")
        if not self.reinit_drop >= 0:
            raise ValueError(f"`reinit_drop`: expected an AUC difference >= 0, got {self.reinit_drop}")
        if not 0.0 < self.plateau_factor <= 1.0:
            raise ValueError(f"`plateau_factor`: expected a multiplier in (0, 1], got {self.plateau_factor}")
        if self.embedding_l2 < 0 or self.weight_decay < 0:
            raise ValueError(
                f"`embedding_l2` and `weight_decay` must be >= 0, got {self.embedding_l2}, {self.weight_decay}"
            )
        if self.min_delta < 0:
            raise ValueError(f"`min_delta`: expected a number >= 0, got {self.min_delta}")
        if not self.warm_start_z >= 0:
            raise ValueError(f"`warm_start_z`: expected a number >= 0, got {self.warm_start_z}")
        if self.decay_power <= 0:
            raise ValueError(f"`decay_power`: expected a positive power, got {self.decay_power}")
        if self.amp_dtype not in (None, "bf16", "fp16"):
            raise ValueError(f"`amp_dtype`: expected 'bf16' or 'fp16', got {self.amp_dtype!r}")

    def resolve(self, model_name: str) -> TrainConfig:
        """This config with unset (None) fields taken from model ``model_name``'s training defaults (the
        one place defaults are applied; a resolved config comes back unchanged). ``embedding_lr``
        falls back to the model's default, then to ``lr``."""
        from ctrkit.models.registry import train_defaults

        values = self.to_dict()
        for key, default in train_defaults(model_name).items():
            if key not in values:
                raise ValueError(f"model training default '{key}' is not a TrainConfig field")
            if values[key] is None:
                values[key] = default
        if values["embedding_lr"] is None:
            values["embedding_lr"] = values["lr"]
        return TrainConfig.from_dict(values)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TrainConfig:
        known = {f.name for f in fields(cls)}
        unknown = set(values) - known
        if unknown:
            raise ValueError(f"unknown training option(s) {sorted(unknown)}; known: {sorted(known)}")
        # run files written when an unset ensemble size was chosen by data size: one model now
        values = {**values, **{k: 1 for k in ("snapshot_ensemble", "seed_ensemble") if values.get(k, 1) is None}}
        cfg = cls(**values)
        cfg.validate()
        return cfg


@dataclass(frozen=True)
class ParallelConfig:
    """How a hybrid-parallel job shards its embedding tables (see ``distributed/planner.py``)."""

    sharding: str = option(
        "auto",
        "auto: small one-hot tables replicated (replicate_below_kb), the others whole and balanced over ranks, "
        "split by columns above column_split_dim and by rows above row_budget_mb; table, column or row force one "
        "strategy for every table",
        ("auto", "table", "column", "row"),
    )
    column_split_dim: int | None = option(
        None, "under auto, split tables wider than this into column blocks this wide", unset="never"
    )
    row_budget_mb: float | None = option(
        None,
        "under auto, split a table larger than this many MB (fp32) by rows over every rank, so a table larger than "
        "one worker's memory still trains",
        unset="a quarter of the memory a rank has: host memory shared by the node's ranks on CPU, the GPU's on CUDA",
    )
    replicate_below_kb: float = option(
        256.0,
        "under auto, keep every one-hot table of at most this many KiB (fp32) whole on every rank and train it "
        "data-parallel (its gradient summed over ranks each step) instead of sending its ids and vectors between "
        "ranks; 0: never",
    )
    print_sharding_plan: bool = option(False, "print where every table lives (rank 0)")
    dist_timeout: float = option(
        120.0, "seconds a rank waits in a collective before failing (a dead peer ends the job, not hangs it)"
    )

    def validate(self) -> None:
        if self.column_split_dim is not None and self.column_split_dim < 1:
            raise ValueError(f"`column_split_dim`: expected an integer >= 1, got {self.column_split_dim}")
        if self.row_budget_mb is not None and not self.row_budget_mb > 0:
            raise ValueError(f"`row_budget_mb`: expected a positive size, got {self.row_budget_mb}")
        if not self.replicate_below_kb >= 0:
            raise ValueError(f"`replicate_below_kb`: expected a size >= 0, got {self.replicate_below_kb}")
        if not self.dist_timeout > 0:
            raise ValueError(f"`dist_timeout`: expected a positive number of seconds, got {self.dist_timeout}")

    @property
    def row_budget_bytes(self) -> int | None:
        return None if self.row_budget_mb is None else int(self.row_budget_mb * 2**20)

    @property
    def replicate_below_bytes(self) -> int:
        return int(self.replicate_below_kb * 2**10)


@dataclass(frozen=True)
class EvalConfig:
    """How a checkpoint is scored on a dataset mapping (``json`` is evaluate's, ``out`` predict's)."""

    checkpoint: Path | None = option(None, "checkpoint written by `ctrkit train`", required=True)
    dataset: Path | None = option(None, "dataset directory holding feature_spec.yaml", required=True)
    out: Path | None = option(None, "output .npy file", required=True)
    json: bool = option(False, "print one JSON object instead of a text line")
    device: str = option("auto", "auto, cpu, cuda, cuda:N")
    mapping: str = option("test", "source_spec mapping to score")
    batch_size: int = option(16384, "samples per forward pass")
    amp: bool = option(
        False,
        "score under autocast: bf16 (CPU with native bf16; CUDA with bf16 tensor cores) or fp16 (older GPUs); on CUDA "
        "only from 32,768 samples per process a batch (fp32 below, where autocast runs slower)",
    )

    def validate(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"`batch_size`: expected an integer >= 1, got {self.batch_size}")


@dataclass(frozen=True)
class ReportConfig:
    """``ctrkit report``: what the page is about and where it goes (the checkpoint is positional)."""

    out: Path = option(Path("report.html"), "the HTML file to write (self-contained: images embedded)")
    dataset: Path | None = option(None, "dataset directory", unset="the run's, from the YAML beside the checkpoint")
    mapping: str = option("test", "source_spec mapping to score for the final metrics and the calibration")
    log_path: Path | None = option(None, "the run's JSON-lines log", unset="the run's --log-path, if it had one")
    device: str = option("auto", "auto, cpu, cuda, cuda:N")


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
    host: str = option("127.0.0.1", "address to bind (127.0.0.1: this machine only)")
    port: int = option(8000, "port")
    name: str | None = option(None, "model name in the URLs", unset="the model type, e.g. dlrm")
    batch_window_ms: float = option(1.0, "how long a request may wait for others to be scored with it")
    max_batch_size: int = option(8192, "samples per model call and request")
    max_body_mb: float = option(64.0, "largest request body accepted, in MB")
    embedding_store: str = option(
        "memory",
        "memory: tables in RAM; mmap: tables stay in the memory-mapped checkpoint and only cache_rows hot rows are "
        "kept in memory, so tables larger than RAM can be served (checkpoints only)",
        ("memory", "mmap"),
    )
    cache_rows: int = option(1 << 20, "rows of each mmap store cache, one per table collection")
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
    threads: int | None = option(None, "torch intra-op threads", unset="torch's choice")

    def validate(self) -> None:
        if self.max_batch_size < 1:
            raise ValueError(f"`max_batch_size`: expected an integer >= 1, got {self.max_batch_size}")
        if self.batch_window_ms < 0:
            raise ValueError(f"`batch_window_ms`: expected a number >= 0, got {self.batch_window_ms}")
        if not self.max_body_mb > 0:
            raise ValueError(f"`max_body_mb`: expected a positive size, got {self.max_body_mb}")
        if self.cache_rows < 0:
            raise ValueError(f"`cache_rows`: expected an integer >= 0, got {self.cache_rows}")


def from_values(cls: type, values: dict[str, Any]) -> Any:
    """An instance of config dataclass ``cls`` from the fields present in ``values`` (others keep
    their defaults), validated."""
    known = {f.name for f in fields(cls)}
    cfg = cls(**{k: v for k, v in values.items() if k in known})
    cfg.validate()
    return cfg


@dataclass(frozen=True)
class RunOptions:
    """What ``ctrkit train`` takes besides TrainConfig and ParallelConfig: where the run comes from and
    goes to, and the model's shape. ``model`` and ``dataset`` not given come from ``config``."""

    config: Path | None = option(
        None,
        "run YAML (model, recipe, model_config, train_config, dataset), e.g. the one written beside a checkpoint",
    )
    model: str | None = option(
        None, "dlrm, dcnv2 or wide_deep; `ctrkit models` lists them", unset="dlrm", suppress=True
    )
    recipe: str | None = option(
        None,
        "the settings the run starts from, under --config and the flags: tuned (ctrkit's accuracy machinery), "
        "plain (the published model with validation, best weights and early stopping, nothing added) or nvidia "
        "(NVIDIA's published configuration of the model); docs/recipes.md says what each sets",
        RECIPES,
        unset="the run YAML's, else tuned",
        suppress=True,
    )
    dataset: Path | None = option(None, "dataset directory holding feature_spec.yaml", suppress=True)
    model_config: Path | None = option(None, "YAML file of model config fields (e.g. embedding_dim, bottom_mlp)")
    embedding_dim: int | None = option(None, "embedding width D", unset="the model's: DLRM 64, the others 16")
    embedding_sizes: str | None = option(
        None,
        "a width per categorical feature, for dcnv2 and wide_deep (DLRM's dot needs one width): a JSON file "
        "mapping feature names to widths (the Wide & Deep seed's embedding_sizes.json; features it leaves out "
        "keep --embedding-dim), or 'auto': round(6 x cardinality^0.25), between 4 and 64",
        unset="--embedding-dim for every feature",
    )
    bottom_mlp: tuple[int, ...] | None = option(
        None,
        "bottom MLP widths, last = embedding dim",
        unset="the model's: DLRM 512,256,64, the others 512,256,64,16",
        parse="int_list",
    )
    top_mlp: tuple[int, ...] | None = option(None, "top MLP widths, last = 1", unset="512,256,1", parse="int_list")
    combiner: str | None = option(
        None,
        "how every multi-hot feature's embeddings are pooled (the seed's Wide & Deep sums)",
        ("sum", "mean"),
        "each feature's 'combiner' in the feature spec, else mean",
    )
    save_checkpoint: Path | None = option(None, "checkpoint file, written atomically at each evaluation and at the end")
    load_checkpoint: Path | None = option(
        None, "resume from this checkpoint (weights, optimizer, step, RNG; same data and batch size)"
    )
    log_path: Path | None = option(None, "append JSON-lines records (loss, lr, samples/s, eval)")
    tensorboard: Path | None = option(
        None,
        "also write the log's scalars (training loss, lr, samples/s; validation and test AUC and log loss) as "
        "TensorBoard event files in this directory (needs tensorboard: pip install 'ctrkit[tensorboard]')",
    )
    device: str = option("auto", "auto (CUDA if present, else CPU), cpu, cuda, cuda:N")
    threads: int | None = option(
        None,
        "torch intra-op threads; idle ones wait as OMP_WAIT_POLICY says, which ctrkit leaves to you (unset: they "
        "spin a while before sleeping, fastest on a machine of your own; PASSIVE: they sleep, safer where other "
        "work shares the cores)",
        unset="torch's choice",
    )
    no_progress: bool = option(False, "no progress bar")
    dry_run: bool = option(
        False,
        "print the run's plan (every mechanism on or off and why, the estimated memory, the models a request "
        "runs) and exit without allocating the model or training",
    )


@dataclass(frozen=True)
class SynthConfig:
    """``ctrkit synth``: which synthetic data, how much, where."""

    kind: str = option(
        "criteo-like",
        "criteo-like: a split-binary dataset of 13 numerical + 26 categorical features; outbrain: displays of "
        "2-12 ads with one click each, request- and item-level features, two multi-hot, display ids for MAP@12; "
        "criteo: raw Criteo-format TSV (--out names a file; .gz to compress); planted: first-order effects and "
        "pairwise interactions of the frequent ids of long-tailed vocabularies, with the test rows' Bayes-optimal "
        "AUC in the spec's metadata; planted-tabular: the same with the signal mostly in nonlinear functions of 6 "
        "numerical features (a step, a sine, a product, a hinge) beside per-id effects of 4 categorical ones; "
        "planted-amounts: planted-tabular's data with the numerical features written as raw amounts "
        "(exp(1.5 x) * 10^j: heavy-tailed, 1 to 1e5 and beyond, float32), as prices or counts come; "
        "outbrain-raw: the raw Kaggle Outbrain files (clicks_train.csv, events.csv, "
        "promoted_content.csv, documents_*.csv, page_views.csv; --rows clicks rows) from a planted click model, "
        "for `ctrkit preprocess outbrain` (truth.json: the MAP@12 of the true scores)",
        ("criteo-like", "outbrain", "criteo", "planted", "planted-tabular", "planted-amounts", "outbrain-raw"),
        positional=True,
    )
    out: Path | None = option(None, "dataset directory to create (a file for criteo)", required=True)
    rows: int = option(300_000, "about this many samples, train + test")
    tables: tuple[int, ...] | None = option(
        None,
        "comma-separated cardinalities of the categorical features",
        unset="26 Criteo-like tables of 3 to 200,000 rows",
        parse="int_list",
    )
    num_numerical: int = option(13, "numerical features")
    test_fraction: float = option(0.1, "share of rows in test/")
    seed: int = option(0, "random seed of the click model and samples")
    overwrite: bool = option(False, "replace an existing dataset directory")


def test_fraction_option() -> Any:
    """The ``--test-fraction`` option of the preprocessing recipes (exclusive with their ``--test-files``)."""
    return option(None, "last fraction of the rows as the test split", unset="0.1", exclusive="split")


def validation_fraction_option() -> Any:
    """The ``--validation-fraction`` option of the preprocessing recipes."""
    return option(
        None,
        "the last fraction of the train split becomes a 'validation' mapping (scored with the train vocabulary, "
        "as test is), for model selection during training",
        unset="none: training holds out the tail of train itself",
    )


def spark_master_option() -> Any:
    """The ``--spark-master`` option of the preprocessing commands (a new field for each config)."""
    return option("local[*]", "Spark master URL for --engine spark", shown="local[*]: all cores of this machine")


@dataclass(frozen=True)
class OutbrainPreprocessConfig:
    """``ctrkit preprocess outbrain``: the raw Kaggle Outbrain directory, the recipe's threshold and seed."""

    raw: Path | None = option(None, "directory of the raw Kaggle Outbrain CSV files (plain or .gz)", positional=True)
    out: Path | None = option(None, "dataset directory to create", required=True)
    frequency_threshold: int = option(
        2, "one-hot ids seen fewer times than this in the training rows share id 0 with missing values"
    )
    seed: int = option(0, "seed of the per-display draw that puts 20% of days 0-10 in the evaluation set")
    ctr_folds: int = option(
        10,
        "the training displays are split into this many folds, and a training row's CTR features are computed "
        "over the other folds' rows, so that no training row's feature counts its own click (evaluation rows: "
        "over all training rows)",
    )
    bad_rows: str = option(
        "error",
        "error: stop at the first malformed row, naming file and line; skip: drop and count them",
        ("error", "skip"),
    )
    block_rows: int = option(
        1 << 17,
        "clicks_train.csv's rows are worked on this many at a time (twice: tallies, then features); memory grows "
        "with the block while it is worked on (about 0.7 KB a row), and the dataset does not depend on the block size",
    )
    engine: str = option(
        "polars",
        "polars: embedded, page views streamed; spark: page_views.csv (the real data's 2 billion rows) counted on "
        "Apache Spark (pip install 'ctrkit[spark]'), the other files read here. Both write byte-identical datasets",
        ("polars", "spark"),
    )
    spark_master: str = spark_master_option()
    overwrite: bool = option(False, "replace an existing dataset directory")
    no_progress: bool = option(False, "no progress bars")


@dataclass(frozen=True)
class CriteoPreprocessConfig:
    """``ctrkit preprocess criteo``: the raw files, the split, the recipe's threshold and the engine."""

    raw: tuple[Path, ...] = option(
        (), "raw TSV files (plain or .gz) of the train split, in order", positional=True, nargs="+"
    )
    out: Path | None = option(None, "dataset directory to create", required=True)
    test_files: tuple[Path, ...] | None = option(None, "raw files of the test split", nargs="+", exclusive="split")
    test_fraction: float | None = test_fraction_option()
    validation_fraction: float | None = validation_fraction_option()
    frequency_threshold: int = option(3, "FL: rarer categories share one id")
    bad_rows: str = option(
        "error",
        "error: stop at the first malformed row, naming file and line; skip: drop and count them, keeping the "
        "first 20 in rejects.jsonl",
        ("error", "skip"),
    )
    engine: str = option(
        "polars",
        "polars: embedded, streaming, memory bounded; spark: Apache Spark (pip install 'ctrkit[spark]'), for "
        "data that outgrows one machine. Both write byte-identical datasets",
        ("polars", "spark"),
    )
    spark_master: str = spark_master_option()
    overwrite: bool = option(False, "replace an existing dataset directory")
    no_progress: bool = option(False, "no progress bars")


@dataclass(frozen=True)
class TablePreprocessConfig:
    """``ctrkit preprocess table``: CSV or Parquet tables with a header, the column roles and the split."""

    raw: tuple[Path, ...] = option(
        (), "CSV or Parquet files (.parquet/.pq) of the train split, with a header, in order", positional=True,
        nargs="+",
    )  # fmt: skip
    out: Path | None = option(None, "dataset directory to create", required=True)
    label: str | None = option(None, "the label column (0/1 or true/false unless --positive or --label-threshold)",
                               required=True)  # fmt: skip
    positive: str | None = option(None, "the label is 1 where the label column equals this value (as text), else 0")
    label_threshold: float | None = option(
        None, "the label is 1 where the label column is at least this number, else 0 (e.g. 4 for ratings 1-5)"
    )
    categorical: tuple[str, ...] = option(
        (), "comma-separated categorical columns (ids, codes); text and boolean columns are categorical unless named "
        "elsewhere", parse="name_list", shown="text and boolean columns",
    )  # fmt: skip
    numerical: tuple[str, ...] = option(
        (), "comma-separated numerical columns (amounts, counts); float columns are numerical unless named elsewhere",
        parse="name_list", shown="float columns",
    )  # fmt: skip
    multi_hot: tuple[str, ...] = option(
        (), "comma-separated multi-hot columns: text of values separated by --separator (Parquet list columns are "
        "multi-hot unless named elsewhere)", parse="name_list", shown="Parquet list columns",
    )  # fmt: skip
    drop: tuple[str, ...] = option((), "comma-separated columns to leave out", parse="name_list", shown="none")
    integers: str = option(
        "error", "the role of integer columns no flag names: error (refused, naming them: an integer may be an id or "
        "an amount), categorical or numerical", ("error", "categorical", "numerical"),
    )  # fmt: skip
    also_categorical: tuple[str, ...] = option(
        ("auto",), "comma-separated numerical columns that are also categorical features, <column>_id: each exact "
        "value an id, for numbers that identify something (a household's repeated amounts, codes); 'auto': those "
        "whose exact values predict the label on held-out training rows (the tail train holds out, or the "
        "validation rows) clearly better than a logistic regression of the other columns and 16 quantile buckets "
        "of each number does (summary.json keeps each column's test); 'none': no column", parse="name_list",
        shown="auto",
    )  # fmt: skip
    separator: str = option("|", "what separates the values of a multi-hot text column")
    order_by: str | None = option(
        None, "sort the rows by this column (e.g. a timestamp; stable) before splitting; not a feature unless named",
        unset="the files' order", exclusive="order",
    )  # fmt: skip
    shuffle_seed: int | None = option(
        None, "shuffle the rows with this seed before splitting, for data whose order means nothing",
        exclusive="order",
    )  # fmt: skip
    group: str | None = option(
        None, "the column whose equal values are ranked together (a display or session id): the map channel of the "
        "validation and test mappings, so that evaluation reports MAP@12; not a feature", unset="none",
    )  # fmt: skip
    test_files: tuple[Path, ...] | None = option(None, "files of the test split", nargs="+", exclusive="split")
    test_fraction: float | None = test_fraction_option()
    validation_fraction: float | None = validation_fraction_option()
    frequency_threshold: int = option(3, "categorical values seen fewer times in the train split share one id")
    null_values: tuple[str, ...] = option(
        ("NA", "NaN", "nan", "null", "NULL"), "comma-separated texts a CSV field reads as missing, besides the empty "
        "field", parse="name_list",
    )  # fmt: skip
    csv_separator: str = option(",", "the CSV field separator: one character, or '\\t' or 'tab' for a tab")
    bad_rows: str = option(
        "error",
        "error: stop at the first row with a bad label or number, naming file and line; skip: drop and count them",
        ("error", "skip"),
    )
    overwrite: bool = option(False, "replace an existing dataset directory")
    no_progress: bool = option(False, "no progress bars")


@dataclass(frozen=True)
class TranscodeConfig:
    """``ctrkit transcode``: CSV/Parquet chunks in, split binary out."""

    input: Path | None = option(None, "directory holding feature_spec.yaml and the data", required=True)
    output: Path | None = option(None, "dataset directory to create", required=True)
    overwrite: bool = option(False, "replace an existing output directory")
    chunk_size: int = option(1 << 20, "rows read and written at a time; memory stays bounded by it, not by the data")


@dataclass(frozen=True)
class GenCsvConfig:
    """``ctrkit gen-csv``: random CSV files for a CSV-type feature spec."""

    feature_spec: Path | None = option(None, "a feature_spec.yaml with csv chunks", required=True)
    out: Path | None = option(None, "directory for the CSV files and the spec", required=True)
    rows: int = option(1000, "rows per mapping")
    seed: int = option(0, "random seed")


@dataclass(frozen=True)
class ConvertConfig:
    """``ctrkit convert-checkpoint``: a checkpoint between the one-file and the sharded forms."""

    checkpoint: Path | None = option(None, "checkpoint written by `ctrkit train` (sharded or not)", required=True)
    out: Path | None = option(None, "the checkpoint to write", required=True)
    world_size: int | None = option(
        None,
        "write the sharded form a run of this many ranks writes (a manifest and a file per rank, tables placed by "
        "--sharding and its size options), without optimizer state",
        unset="one file with whole tables",
    )
    overwrite: bool = option(False, "replace an existing output file")


@dataclass(frozen=True)
class ExportConfig:
    """``ctrkit export``: which checkpoint, in which format, where."""

    checkpoint: Path | None = option(None, "checkpoint written by `ctrkit train`", required=True)
    format: str | None = option(None, "what to write", EXPORT_FORMATS, required=True)
    out: Path | None = option(
        None, "directory to create; for triton, the model repository to create or add a version to", required=True
    )
    name: str | None = option(None, "model name in a Triton repository", unset="the model type")
    version: int | None = option(
        None,
        "triton: the version to write; an existing one is replaced only with --overwrite",
        unset="one after the model's newest version in the repository (1 for a new model)",
    )
    backend: str = option("onnx", "model file inside a Triton repository", ("onnx", "torchscript"))
    quantize: str = option(
        "none",
        "int8: ONNX with int8 linear layers (onnxruntime dynamic quantization, per-batch activation scales; "
        "embeddings stay float32), for throughput on CPUs with int8 dot-product instructions",
        QUANTIZATIONS,
    )
    overwrite: bool = option(False, "replace an existing output directory (triton: an existing --version)")
