"""Typed, frozen configuration of the components (model configs live beside their models).

Each field carries its help text in its metadata: the command line's flags are generated from these
dataclasses (``cli/options.py``), so every default has one source, this file.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from ctrkit.field_types import COUNT, NON_NEGATIVE, SECONDS, SEED, THREADS, Range, check_fields, check_ranges
from ctrkit.optimizers import DENSE_OPTIMIZERS, TABLE_OPTIMIZERS

__all__ = ["DENSE_OPTIMIZERS", "TABLE_OPTIMIZERS"]  # the optimizers' names, defined with their records
PRECISIONS = ("fp32", "tf32", "bf16", "fp16")  # what training may compute in (``device.precision_of``)
EXPORT_FORMATS = ("onnx", "torchscript", "triton")
QUANTIZATIONS = ("none", "int8")
# the last fraction of 'train' that `train` holds out for validation by default (preprocessing's held-out tests fit
# on the rows before it)
VALIDATION_FRACTION = 0.1
# what a scorer of raw rows does with a value preprocessing refuses (``preprocess.values``): refuse it, naming row and
# column, or score it as missing and count it
BAD_VALUES = ("error", "missing")
RECIPES = ("tuned", "plain", "nvidia")  # defined in train/recipes.py


def option(default: Any, help: str, choices: tuple | None = None, unset: str | None = None, **command_line: Any) -> Any:
    """A config field with its command-line description.

    Args:
        default: the field's default.
        help: what the setting does.
        choices: the values it may take.
        unset: what a default of None means (e.g. "the model's").
        command_line: how the flag is spelled beyond the defaults: ``parse`` ("int_list", "name_list", "table_sizes"),
            ``required``, ``positional``, ``nargs``, ``exclusive`` (a group name: at most one of the group,
            exactly one if a member is ``required``), ``hidden``, ``shown`` (the default as the help says
            it), ``suppress`` (absent from the parsed arguments unless given), ``bounds`` (a numeric setting's
            ``field_types.Range``: the flag refuses a value outside it, and so does ``field_types.check_ranges``),
            ``writes`` (a path the command writes: "file", or "directory" where it replaces the whole directory;
            refused when it names one of the command's inputs; "over": an input its file outputs may write over, as
            a resumed run saves over the checkpoint it resumed from).
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
        unset="the plan's: 10, more on data of a few batches an epoch", bounds=Range(1, 1_000_000)
    )  # fmt: skip
    max_steps: int | None = option(None, "stop after this many steps in total", unset="all epochs", bounds=COUNT)
    batch_size: int | None = option(None, "samples per step", unset="the model's", bounds=Range(1, 2**31 - 1))
    eval_batch_size: int = option(16384, "samples per forward pass in evaluation", bounds=Range(1, 2**31 - 1))
    lr: float | None = option(
        None, "peak learning rate of the dense part", unset="the model's", bounds=Range(0, 3.4e38, lo_open=True)
    )
    optimizer: str | None = option(None, "optimizer of the dense part", DENSE_OPTIMIZERS, "the model's")
    embedding_optimizer: str | None = option(
        None, "optimizer of the embedding tables, always with sparse row updates", TABLE_OPTIMIZERS, "the model's"
    )
    embedding_lr: float | None = option(
        None,
        "peak learning rate of the embeddings",
        unset="the model's, else the dense part's",
        bounds=Range(0, 3.4e38, lo_open=True),
    )
    wide_optimizer: str | None = option(
        None, "optimizer of a model's wide (linear) part, e.g. wide_deep's", TABLE_OPTIMIZERS, "the model's"
    )
    wide_lr: float | None = option(
        None, "peak learning rate of the wide part", unset="the model's", bounds=Range(0, 3.4e38, lo_open=True)
    )
    embedding_l2: float = option(
        0.0,
        "L2 penalty on the embedding vectors each sample looks up (only those rows get its gradient, as sparse "
        "updates), added to the mean loss",
        bounds=Range(0, 1e6),
    )
    weight_decay: float = option(
        0.0, "L2 penalty on the dense part's weights, added to the mean loss", bounds=Range(0, 1e6)
    )
    warmup_steps: int | None = option(
        None, "linear warmup steps", unset="the plan's: 5% of the first epoch", bounds=NON_NEGATIVE
    )
    decay_start_step: int | None = option(
        None,
        "step where polynomial decay begins",
        unset="the plan's: where the decay ends with the planned steps",
        bounds=NON_NEGATIVE,
    )
    decay_steps: int | None = option(None, "length of the decay (0: none)", unset="the plan's: the last half of the "
                                     "planned steps (epochs x batches an epoch)", bounds=NON_NEGATIVE)  # fmt: skip
    decay_power: float = option(2.0, "power of the polynomial decay", bounds=Range(0, 1000, lo_open=True))
    end_lr: float = option(0.0, "learning rate after the decay", bounds=Range(0, 1e6))
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
    seed: int = option(0, "seed of weights, batch order and every torch random source", bounds=SEED)
    evals_per_epoch: int = option(
        4, "validation evaluations per epoch, 0 for only at the end", bounds=Range(0, 1_000_000)
    )
    validation_fraction: float = option(
        VALIDATION_FRACTION,
        "when the dataset has no 'validation' mapping, hold out this last fraction of 'train' (the most recent "
        "rows of a time-ordered log) for validation; 0 for none (no model selection)",
        bounds=Range(0.0, 1.0, hi_open=True),
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
        bounds=Range(0, 1e12),
    )
    warm_start_logloss: bool = option(
        False,
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
    reinit_drop: float = option(
        0.01, "the validation AUC fall below the best that turns auto reinit_embeddings on", bounds=Range(0, 1)
    )
    snapshot_ensemble: int = option(
        1,
        "keep the best evaluation of each of the N epochs with the best validation AUC (N copies of the weights, "
        "in memory and in checkpoints); at the end, the mean of the logits of the best 2..N of them replaces the "
        "selected model when its validation AUC is higher by min_delta and it passes the warm-start rules: the "
        "kept model is then that ensemble, whose every member is run on each request. 1: one model. "
        "Single-process runs only",
        bounds=Range(1, 1000),
    )
    seed_ensemble: int = option(
        1,
        "train N models one after another, with seeds seed, seed+1, ..., each selected on validation as a run of "
        "its own (test scored once, at the end); the mean of their logits replaces the best of them when its "
        "validation AUC is higher by min_delta and its log loss lower than the warm start's: the kept model is "
        "then that ensemble, whose every member is run on each request. 1: one model. Single-process runs with "
        "validation data only",
        bounds=Range(1, 1000),
    )
    small_batch: int | None = option(
        None,
        "also train the run (each member of its seed ensemble) at this smaller batch size, with the patience of "
        "the run's batch, and keep the batch whose kept model has the higher validation AUC (the run's on a tie). "
        "0: only the run's batch. Single-process runs with validation data only",
        unset="the plan's: on data of fewer than 10 batches an epoch, the largest power of two at most the training "
        "rows / 32, at least 32; else 0",
        bounds=Range(0, 2**31 - 1),
    )
    best_weights: str | None = option(
        None,
        "where model selection keeps its copy of the best weights' tables: memory, or disk (a file beside the "
        "checkpoint, or in the temporary directory without one, unlinked as soon as it is mapped, its pages "
        "dropped from memory once copied: no second copy of the tables in memory)",
        ("memory", "disk"),
        unset="the plan's: disk where the tables are 1 GiB or more, or where memory would not hold the copy; else "
        "memory",
    )
    embedding_storage: str | None = option(
        None,
        "where the embedding tables and their optimizer state live while training: memory (where the model "
        "trains), disk (files beside the checkpoint, or in the temporary directory without one, unlinked at once; "
        "the rows in use in an in-memory cache of embedding_cache_rows rows, the least recently used written back "
        "when it is full; CPU runs), or host (the CPU's memory, the rows in use cached on the GPU that trains them "
        "in the same way; on a CPU it only adds the cache). Results equal the tables held where the model trains. "
        "Single-process runs; first-order and multi-hot tables stay where the model is",
        ("memory", "disk", "host"),
        unset="the plan's: where the tables and their state would not fit where the run trains, disk on a CPU and "
        "host on a GPU; else memory",
    )
    embedding_cache_rows: int | None = option(
        None,
        "with embedding_storage disk or host: rows of each table collection's cache (in memory, or on the GPU)",
        unset="the plan's: as many as half the memory left after the rest of the run holds, at most every row",
        bounds=Range(1, 2**62),
    )
    admit_after: int = option(
        1,
        "dynamic features (raw ids): sightings in training before an id gets its own row of the table; until then "
        "it shares the feature's rare row (row 0) with every id not admitted; this and the next two are refused on "
        "a dataset without dynamic features",
        bounds=Range(1, 2**31 - 1),
    )
    eviction: str = option(
        "lfu",
        "dynamic features: which admitted ids give their rows up when the table is full: lfu (the lowest count of "
        "sightings, decayed by count_half_life) or lru (the longest unseen); never an id of the current batch",
        ("lfu", "lru"),
    )
    count_half_life: int = option(
        0,
        "dynamic features: training batches in which an id's count of sightings halves (0: counts never decay; "
        "unset in a --continue-from run: 2 epochs of its data)",
        bounds=NON_NEGATIVE,
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
        bounds=Range(0, 1_000_000),
    )
    plateau_patience: int | None = option(
        None,
        "multiply the learning rates by plateau_factor after this many evaluations without improvement (0: never)",
        unset="the plan's: 4, or 10 on data of fewer than 10 batches an epoch",
        bounds=Range(0, 1_000_000),
    )
    plateau_factor: float = option(
        0.5, "the learning-rate multiplier on a validation plateau", bounds=Range(0, 1, lo_open=True)
    )
    min_delta: float = option(1e-4, "the validation AUC gain that counts as an improvement", bounds=Range(0, 1))
    print_freq: int = option(50, "steps between log records", bounds=COUNT)
    amp: bool = option(
        False,
        "mixed precision: bf16 autocast on a CPU with native bf16 (fp32 elsewhere) and on GPUs with bf16 tensor cores, "
        "else fp16 with loss scaling; on CUDA only from 16,384 samples a step per process (fp32 below, where autocast "
        "runs slower; --amp-dtype takes it at any batch)",
    )
    amp_dtype: str | None = option(
        None, "the mixed-precision dtype, taken at any batch (--amp implied)", ("bf16", "fp16"), "the --amp rule"
    )
    precision: str | None = option(
        None,
        "what training computes in: fp32; tf32 (fp32 with matmuls on TF32 tensor cores: CUDA GPUs from Ampere on; "
        "fp32 on a CPU); bf16 or fp16 autocast at any batch (fp16 with loss scaling; bf16 on a CPU only where it is "
        "native). --amp is the shorthand for the device's autocast",
        PRECISIONS,
        "--amp's autocast, else the device's default: bf16 autocast on a CPU with native bf16 and on a GPU with bf16 "
        "tensor cores from 16,384 samples a step per process, fp32 elsewhere",
    )
    eval_dtype: str | None = option(
        None,
        "the precision of scoring (validation, calibration, test): bf16 autocast (a CPU with native bf16, GPUs) or "
        "fp32; bf16 scores differ from fp32 by rounding",
        ("fp32", "bf16"),
        "the training's autocast dtype where --amp or --precision asked for one, else fp32",
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
    checkpoint_every: int | None = option(
        None, "also checkpoint every N steps", unset="at evaluations and the end", bounds=COUNT
    )

    def validate(self) -> None:
        check_ranges(self)  # each number within its field's bounds
        if self.lr is not None and self.end_lr > self.lr:
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
        if self.amp_dtype not in (None, "bf16", "fp16"):
            raise ValueError(f"`amp_dtype`: expected 'bf16' or 'fp16', got {self.amp_dtype!r}")
        if self.precision in ("fp32", "tf32") and self.amp:
            raise ValueError(f"`precision` {self.precision} and `amp` contradict: drop `amp`, or name bf16 or fp16")
        if self.precision in ("bf16", "fp16") and self.amp_dtype not in (None, self.precision):
            raise ValueError(f"`precision` {self.precision} and `amp_dtype` {self.amp_dtype} contradict: drop one")
        if self.eval_dtype not in (None, "fp32", "bf16"):
            raise ValueError(f"`eval_dtype`: expected 'fp32' or 'bf16', got {self.eval_dtype!r}")

    @property
    def precision_asked(self) -> bool:
        """Whether the run's precision was asked for (``precision``, ``amp`` or ``amp_dtype``) rather than left to its
        device's default (``device.default_precision``)."""
        return self.precision is not None or self.amp or self.amp_dtype is not None

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
        check_fields(cls, values, "training settings")
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
        None,
        "under auto, split tables wider than this into column blocks this wide",
        unset="never",
        bounds=Range(1, 65536),
    )
    row_budget_mb: float | None = option(
        None,
        "under auto, split a table larger than this many MB (fp32) by rows over every rank, so a table larger than "
        "one worker's memory still trains",
        unset="a quarter of the memory a rank has: host memory shared by the node's ranks on CPU, the GPU's on CUDA",
        bounds=Range(0, 2**40, lo_open=True, unit="MB"),
    )
    replicate_below_kb: float = option(
        256.0,
        "under auto, keep every one-hot table of at most this many KiB (fp32) whole on every rank and train it "
        "data-parallel (its gradient summed over ranks each step) instead of sending its ids and vectors between "
        "ranks; 0: never",
        bounds=Range(0, 2**40, unit="KB"),
    )
    print_sharding_plan: bool = option(False, "print where every table lives (rank 0)")
    dist_timeout: float = option(
        120.0,
        "seconds a rank waits in a collective before failing (a dead peer ends the job, not hangs it)",
        bounds=SECONDS,
    )

    def validate(self) -> None:
        check_ranges(self)

    @property
    def row_budget_bytes(self) -> int | None:
        return None if self.row_budget_mb is None else int(self.row_budget_mb * 2**20)

    @property
    def replicate_below_bytes(self) -> int:
        return int(self.replicate_below_kb * 2**10)


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
    embedding_dim: int | None = option(
        None, "embedding width D", unset="the model's: DLRM 64, the others 16", bounds=Range(1, 65536)
    )
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
        "how every multi-hot feature's embeddings are pooled (the seed's Wide & Deep sums); refused on a dataset "
        "without multi-hot features",
        ("sum", "mean"),
        "each feature's 'combiner' in the feature spec, else mean",
    )
    numerical_buckets: int | None = option(
        None,
        "quantile buckets of each numerical feature in the first-order term (at most this many, fewer where clicks "
        "are few; 0: none)",
        unset="the recipe's: none in tuned, plain and nvidia",
        bounds=Range(0, 65536),
    )
    save_checkpoint: Path | None = option(
        None, "checkpoint file, written atomically at each evaluation and at the end", writes="file"
    )
    load_checkpoint: Path | None = option(
        None, "resume from this checkpoint (weights, optimizer, step, RNG; same data and batch size)", writes="over"
    )
    continue_from: Path | None = option(
        None,
        "start from this checkpoint's model (its selected weights, with its dynamic tables' ids and counts) and "
        "optimizer states, on --dataset (a new day of data): a new run with its own steps, schedule and model "
        "selection on the new data's validation; rates and count half-life left unset take the continued run's "
        "defaults (half the dense and table rates, four times the first-order rate, counts halving every 2 epochs; the "
        "plan shows them); --load-checkpoint, if given too, resumes this run instead",
        writes="over",
    )
    allow_other_vocabulary: bool = option(
        False,
        "continue from --load-checkpoint on a dataset preprocessed with other vocabularies (refused by default: "
        "the same id means another value there, so the learned rows no longer match their values)",
    )
    log_path: Path | None = option(None, "append JSON-lines records (loss, lr, samples/s, eval)", writes="file")
    tensorboard: Path | None = option(
        None,
        "also write the log's scalars (training loss, lr, samples/s; validation and test AUC and log loss) as "
        "TensorBoard event files in this directory (needs tensorboard: pip install 'ctrkit[tensorboard]')",
        writes="file",
    )
    device: str = option("auto", "auto (CUDA if present, else CPU), cpu, cuda, cuda:N")
    threads: int | None = option(
        None,
        "torch intra-op threads; idle ones wait as OMP_WAIT_POLICY says, which ctrkit leaves to you (unset: they "
        "spin a while before sleeping, fastest on a machine of your own; PASSIVE: they sleep, safer where other "
        "work shares the cores)",
        unset="torch's choice",
        bounds=THREADS,
    )
    no_progress: bool = option(False, "no progress bar")
    dry_run: bool = option(
        False,
        "print the run's plan (every mechanism on or off and why, the estimated memory, the models a request "
        "runs) and exit without allocating the model or training",
    )
