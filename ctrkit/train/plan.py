"""The plan of a training run: every setting, mechanism and derived value, resolved once before the first step.

``make_plan`` takes the resolved settings (recipe, run YAML and flags over the model's defaults: ``run.resolve_run``)
and the data's size and fills in what depends on the data (the most epochs, the patience, the learning-rate
schedule, the small batch), each with the rule or layer that chose it. ``ctrkit train`` prints the plan, writes it
into the run YAML and the checkpoint, and the trainer executes its settings. The rules that depend on the data are
all here: the trainer and the run apply none of their own.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any, Protocol

from ctrkit.config import TrainConfig
from ctrkit.models.contract import table_parameter_ids, table_parameters
from ctrkit.models.tiered_tables import HOMES
from ctrkit.optimizers import KINDS, LIGHT_TABLE_OPTIMIZER, kind
from ctrkit.train.mechanisms import continued_settings
from ctrkit.train.memory import (
    USABLE,
    WARM_START_ID_BYTES,
    WARM_START_ROWS,
    WARM_START_VALUE_BYTES,
    Room,
    check_disk_room,
    check_host_room,
    gib,
    local_processes,
    process_rss,
    room,
    table_state_bytes,
    tables_directory,
    working_bytes,
)
from ctrkit.train.sources import Layer, source

# Small data: an epoch of fewer than SMALL_EPOCH batches (a table of a few thousand rows at batch 1,024).
# There a run measured in epochs and evaluations ends after a few dozen steps while still improving, so
# the unset limits below are raised (docs/decisions/small-data-steps.md).
SMALL_EPOCH = 10
DEFAULT_EPOCHS = 10  # the most passes over the data when unset (early stopping ends most runs)
MIN_STEPS = 100  # ... raised on small data until the run may take this many steps
PATIENCE = (8, 4)  # unset early-stopping and plateau patience, in evaluations (docs/decisions/patience.md)
SMALL_DATA_PATIENCE = (20, 10)  # ... on small data
SMALL_BATCH_STEPS = 32  # the unset small_batch: an epoch of at least this many steps ...
MIN_SMALL_BATCH = 32  # ... at a batch of at least this many rows (docs/decisions/small-batch.md)
WARMUP_SHARE = 0.05  # unset warmup: this share of the first epoch
DECAY_SHARE = 0.5  # unset decay: over this last share of the planned steps


def default_epochs(steps_per_epoch: int) -> int:
    """The most epochs when unset: ``DEFAULT_EPOCHS``, or on small data as many as make ``MIN_STEPS`` steps."""
    if steps_per_epoch >= SMALL_EPOCH:
        return DEFAULT_EPOCHS
    return max(DEFAULT_EPOCHS, -(-MIN_STEPS // max(steps_per_epoch, 1)))


def default_patience(steps_per_epoch: int) -> tuple[int, int]:
    """The early-stopping and plateau patience when unset: ``PATIENCE``, or ``SMALL_DATA_PATIENCE`` on small data."""
    return SMALL_DATA_PATIENCE if steps_per_epoch < SMALL_EPOCH else PATIENCE


def default_small_batch(train_rows: int) -> int:
    """The smaller batch also tried on small data: the largest power of two at most ``train_rows /
    SMALL_BATCH_STEPS``, at least ``MIN_SMALL_BATCH``."""
    target = max(train_rows // SMALL_BATCH_STEPS, 1)
    return max(MIN_SMALL_BATCH, 1 << (target.bit_length() - 1))


def resolved_train(cfg: TrainConfig, steps_per_epoch: int) -> tuple[TrainConfig, dict[str, str]]:
    """``cfg`` with every field that depends on the data set (``steps_per_epoch`` batches an epoch): the most
    epochs, the patience and the learning-rate schedule (warmup over ``WARMUP_SHARE`` of the first epoch, decay
    over the last ``DECAY_SHARE`` of the planned steps: epochs x batches, not ``max_steps``, so a run stopped and
    resumed follows one curve); and the rule that set each."""
    rules: dict[str, str] = {}
    values: dict[str, Any] = {}
    small = steps_per_epoch < SMALL_EPOCH
    tiny = f"fewer than {SMALL_EPOCH} batches an epoch"
    if cfg.epochs is None:
        values["epochs"] = default_epochs(steps_per_epoch)
        rules["epochs"] = (
            f"{tiny}: as many as make {MIN_STEPS} steps"
            if small and values["epochs"] > DEFAULT_EPOCHS
            else f"the default maximum, {DEFAULT_EPOCHS}"
        )
    stop, plateau = default_patience(steps_per_epoch)
    for name, value in (("early_stopping_patience", stop), ("plateau_patience", plateau)):
        if getattr(cfg, name) is None:
            values[name] = value
            rules[name] = f"{tiny}: {value} evaluations" if small else f"{value} evaluations"
    planned = (values.get("epochs") or cfg.epochs) * steps_per_epoch
    if cfg.warmup_steps is None:
        values["warmup_steps"] = max(1, round(WARMUP_SHARE * min(steps_per_epoch, planned)))
        rules["warmup_steps"] = f"{WARMUP_SHARE:.0%} of the first epoch"
    if cfg.decay_steps is None:
        values["decay_steps"] = int(planned * DECAY_SHARE)
        rules["decay_steps"] = f"the last {DECAY_SHARE:.0%} of the planned steps"
    if cfg.decay_start_step is None:
        values["decay_start_step"] = max(planned - values.get("decay_steps", cfg.decay_steps), 0)
        rules["decay_start_step"] = "so the decay ends with the planned steps"
    return replace(cfg, **values), rules


@dataclass(frozen=True)
class Plan:
    """A run's plan.

    Attributes:
        recipe: the recipe the settings started from.
        model: the model's name.
        train: the TrainConfig the trainer executes (every field the data decides filled in).
        lines: (topic, what, why) per line of the printed block, one a mechanism.
        memory: estimated bytes held while training: ``weights``, ``optimizer`` (state), ``copies`` (kept for
            selection and ensembles) and ``total``.
        models_per_request: models that scoring the kept model runs on each request (at most).
        batches: the batch sizes trained (the run's, and a smaller one where ``small_batch`` applies).
        members: models trained one after another (``seed_ensemble`` x batch sizes).
        configs: the TrainConfig of each batch size (``train`` first); a smaller batch's has its own epochs and
            schedule, and the run's batch's patience.
        precision: what the run computes in: fp32, tf32, bf16 or fp16 (``device.precision_of``).
        continued_from: the checkpoint a continued run (``--continue-from``) started from, as given; None for a
            fresh run. Its checkpoints carry it, so that resuming one keeps the continued run's settings.
    """

    recipe: str
    model: str
    train: TrainConfig
    lines: tuple[tuple[str, str, str], ...]
    memory: dict[str, int]
    models_per_request: int
    batches: tuple[int, ...]
    members: int
    configs: tuple[TrainConfig, ...] = ()
    continued_from: str | None = None
    precision: str = "fp32"

    def text(self) -> str:
        """The printed block: a heading line, then one line a topic."""
        width = max(len(t) for t, _, _ in self.lines)
        out = [f"plan: {self.model}, recipe {self.recipe} (`ctrkit train --dry-run` prints this without training)"]
        out += [f"  {topic:<{width}}  {what}" + (f"  [{why}]" if why else "") for topic, what, why in self.lines]
        return "\n".join(out)

    def to_dict(self) -> dict[str, Any]:
        """The plan as plain values (the run YAML's and the checkpoint's ``plan``)."""
        return {
            "recipe": self.recipe,
            "model": self.model,
            "lines": [{"topic": t, "what": w, "why": y} for t, w, y in self.lines],
            "memory_bytes": dict(self.memory),
            "models_per_request": self.models_per_request,
            "batches": list(self.batches),
            "members": self.members,
            "continued_from": self.continued_from,
            "precision": self.precision,
        }


@dataclass(frozen=True)
class ModelSizes:
    """A model's bytes by part and its deep tables' rows (``sizes_of``).

    Attributes:
        tables: the deep tables' bytes; ``table_rows``: their rows (the first-order tables not counted).
        first_order: the first-order (wide) term's bytes.
        dense: every other parameter's bytes.
        buffers: the buffers' bytes.
    """

    tables: int
    first_order: int
    dense: int
    buffers: int
    table_rows: int


def sizes_of(model: Any) -> ModelSizes:
    """``model``'s sizes (built on the meta device: nothing allocated)."""
    tables = table_parameter_ids(model)
    wide = {id(p) for p in model.wide_parameters()}
    deep = side = dense = 0
    for p in model.parameters():
        n = p.numel() * p.element_size()
        if id(p) in wide:
            side += n
        elif id(p) in tables:
            deep += n
        else:
            dense += n
    rows = sum(p.shape[0] for p in table_parameters(model) if id(p) not in wide)
    return ModelSizes(deep, side, dense, sum(b.numel() * b.element_size() for b in model.buffers()), rows)


def _memory(
    cfg: Any,
    table_optimizer: str,
    sizes: ModelSizes,
    model_config: Any,
    train_rows: int,
    validation: bool,
    members: int,
    warm: bool,
    processes: int,
    best_on_disk: bool = False,
    cache_rows: int | None = None,
    validation_rows: int = 0,
    fit_first: bool = False,
    now: int = 0,
) -> dict[str, int]:
    """A process's estimated peak by part, in bytes (``memory``'s docstring says what is counted); ``more``: what it
    allocates beyond what it holds now; ``cache_rows``: the tables tiered (on disk, or in the CPU's memory for a
    GPU run) with a cache of this many rows (their bytes and their state's in the home: ``tables_in_tier``);
    ``fit_first``: deep tables drawn after the warm start; ``now``: what the process holds now."""
    deep, side, dense, buffers, rows = sizes.tables, sizes.first_order, sizes.dense, sizes.buffers, sizes.table_rows
    deep, rows = deep // processes, rows // processes  # a job's tables are split over its processes, about evenly
    stored = 0
    if cache_rows is not None and rows:  # in memory: the cached rows, their slots, and each row's slot
        cached = min(cache_rows, rows)
        stored = deep + table_state_bytes(table_optimizer, deep, rows)
        deep, index = deep * cached // rows, CACHE_SLOT_BYTES * cached + CACHE_INDEX_BYTES * rows
        rows = cached
        best_on_disk = True  # a run with tiered tables keeps the best weights' tables on disk
    else:
        index = 0
    weights = deep + side + dense + buffers + index
    state = table_state_bytes(table_optimizer, deep, rows) + kind(cfg.optimizer).state_copies * dense
    if side:
        state += kind(cfg.wide_optimizer or "adagrad").state_copies * side
    copies = (weights - deep - index if best_on_disk else weights) if validation else 0  # the best weights
    on_disk = (stored or deep) if best_on_disk and validation else 0
    if cfg.snapshot_ensemble > 1:
        copies += cfg.snapshot_ensemble * weights
    if members > 1:
        copies += members * max(cfg.snapshot_ensemble, 1) * weights
    inputs = len(getattr(model_config, "cardinalities", ())) + getattr(model_config, "num_numerical", 0) + 1
    fit_rows = min(train_rows, WARM_START_ROWS) + min(validation_rows, WARM_START_ROWS)  # both held as matrices
    fit = WARM_START_ID_BYTES * (side // 4) + WARM_START_VALUE_BYTES * fit_rows * inputs if warm else 0
    scoring = working_bytes(min(cfg.eval_batch_size, max(train_rows, 1)), inputs)
    held = weights + state + copies + scoring  # once the deep tables are drawn
    more = max(weights - deep + fit, held) if fit_first else held + max(0, fit - copies - scoring)
    return {
        "weights": weights,
        "optimizer": state,
        "copies": copies,
        "copies_on_disk": on_disk,
        "warm_start": fit,
        "process": now,
        "tables_in_tier": stored,
        "cache_rows": rows if stored else 0,
        "more": more,
        "peak": now + more,
        "total": weights + state + copies,
    }


# the tables' learning rate where the plan picks row-wise Adagrad and the rate was left to the default
# (docs/decisions/memory-plan.md)
ROWWISE_ADAGRAD_LR = 0.03
BEST_ON_DISK_TABLES = 1 << 30  # tables of this many bytes a process or more: the best weights' tables kept on disk
CACHE_SLOT_BYTES = 16  # tables on disk: each cache slot's row and last use (int64 each) ...
CACHE_INDEX_BYTES = 4  # ... and each table row's slot (int32)
CACHE_SHARE = 0.5  # an unset cache takes this share of the memory the rest of the run leaves
MIN_CACHE_BATCHES = 2  # ... and at least this many batches' lookups (a step's rows must all be cached at once)


def cache_rows_for(
    cfg: Any, need: Any, budget: Room, usable: int | None, sizes: ModelSizes, lookups: int
) -> tuple[int, str]:
    """The cache rows of tables on disk, and why: ``embedding_cache_rows`` if set; else ``CACHE_SHARE`` of what the
    rest of the run leaves of ``usable`` (every row where that is unknown), at least ``MIN_CACHE_BATCHES`` x
    ``lookups`` (a batch's ids), at most every row. ``need(cache_rows)``: the estimate with that cache."""
    rows = max(sizes.table_rows, 1)
    if cfg.embedding_cache_rows is not None:
        return cfg.embedding_cache_rows, "embedding_cache_rows"
    if usable is None:
        return rows, f"every row: the memory available is unknown ({budget.where})"
    bare = need(0)["more"]
    per_row = max(need(rows)["more"] - bare, 1) / rows
    fit = int((usable - bare) * CACHE_SHARE / per_row)
    least = min(rows, MIN_CACHE_BATCHES * lookups)
    chosen = max(least, min(rows, fit))
    return (
        chosen,
        f"{CACHE_SHARE:.0%} of what the rest of the run leaves of {budget.where}"
        if chosen < rows
        else "every row fits",
    )


def _fit_or_refuse(
    cfg: Any,
    sources: dict,
    memory: dict,
    need: Any,
    budget: Room,
    usable: int,
    processes: int,
    rules: dict,
    tiered: Any = None,
    home: str = "disk",
) -> tuple[dict, Any]:
    """Where the estimate exceeds the room: row-wise Adagrad on the tables when the table optimizer was left to
    the recipe or the default and that fits; else, where ``embedding_storage`` was left unset, the tables in the
    tier ``home`` (disk on a CPU, host on a GPU; ``tiered(optimizer)``: the estimate, cache rows and why; None where
    a run cannot keep them there) with that optimizer (the plan says why); else a one-line ValueError naming the
    options."""
    local = local_processes(processes, budget)
    fits = lambda m: m["more"] * local <= usable  # noqa: E731
    peak, has = gib(memory["peak"]), gib(budget.bytes)
    lighter_by_default = not source(sources, "embedding_optimizer").user_set
    optimizer, changes = cfg.embedding_optimizer, {}
    if lighter_by_default and not kind(optimizer).light:
        optimizer, changes = LIGHT_TABLE_OPTIMIZER, {"embedding_optimizer": LIGHT_TABLE_OPTIMIZER}
        if not source(sources, "embedding_lr").user_set:
            changes["embedding_lr"] = ROWWISE_ADAGRAD_LR
        lighter = need(optimizer)
        if fits(lighter):
            rules["embedding_optimizer"] = (
                f"memory: {cfg.embedding_optimizer}'s state would need a peak of {peak}, {budget.where} has {has}"
            )
            return lighter, replace(cfg, **changes)
    if tiered is not None and cfg.embedding_storage is None:
        stored, cache_rows, cache_why = tiered(optimizer)
        if fits(stored):
            if changes:
                rules["embedding_optimizer"] = f"memory: {cfg.embedding_optimizer}'s state would not fit in memory"
            rules["embedding_storage"] = f"memory: the tables would need a peak of {peak}, {budget.where} has {has}"
            rules["embedding_cache_rows"] = cache_why
            return stored, replace(cfg, embedding_storage=home, embedding_cache_rows=cache_rows, **changes)
    options = []
    if not kind(cfg.embedding_optimizer).light:
        lighter = need(LIGHT_TABLE_OPTIMIZER)
        others = [k.name for k in KINDS.values() if k.tables and k.light and k.name != LIGHT_TABLE_OPTIMIZER]
        light = " or ".join([LIGHT_TABLE_OPTIMIZER, *others])
        options.append(f"`embedding_optimizer` {light}{' (fits)' if fits(lighter) else ''}")
    if memory["copies"]:
        alone = need(cfg.embedding_optimizer, validation=False)
        options.append(f"`validation_fraction` 0, no copy of the best weights{' (fits)' if fits(alone) else ''}")
    if tiered is not None and cfg.embedding_storage not in HOMES:
        options.append(f"`embedding_storage` {home}{' (fits)' if fits(tiered(cfg.embedding_optimizer)[0]) else ''}")
    elif cfg.embedding_storage in HOMES:
        options.append("a smaller `embedding_cache_rows` or `batch_size`")
    options += ["a smaller `embedding_dim` or `embedding_sizes`", "more machines with torchrun"]
    per = f" in each of {local} processes" if local > 1 else ""
    raise ValueError(
        f"this run needs a peak of about {gib(memory['peak'])}{per} (weights {gib(memory['weights'])}, optimizer "
        f"state {gib(memory['optimizer'])}, copies kept {gib(memory['copies'])}): {gib(memory['more'])} more than the "
        f"process holds now, beyond what {budget.where} leaves ({gib(budget.bytes)}): use {'; '.join(options)}"
    )


# the CPU's draw of the tables (``table_draw``'s C kernel) at this many values a second a thread, and the first touch
# of their fresh memory (advised to huge pages) at this many bytes a second: measured on the FL15 build
# (docs/decisions/table-draw.md), for the plan's estimate of a long build
DRAW_VALUES_PER_S = 2.5e9
TOUCH_BYTES_PER_S = 4.6e9
LONG_BUILD_S = 10.0  # the plan says how long the tables' build is expected to take from this many seconds


def build_seconds(facts: Facts) -> float:
    """The expected seconds to build a fresh CPU run's deep tables: their values over ``DRAW_VALUES_PER_S`` on each
    of the run's threads, and the first touch of their memory (``TOUCH_BYTES_PER_S``). A GPU draws its own tables
    in one pass over their memory: not estimated (0)."""
    if facts.device != "cpu":
        return 0.0
    draw = _drawn_values(facts) / (DRAW_VALUES_PER_S * max(facts.threads, 1))
    return draw + facts.sizes.tables / facts.processes / TOUCH_BYTES_PER_S


def _drawn_values(facts: Facts) -> int:
    """The float32 values of a process's deep tables."""
    return facts.sizes.tables // 4 // facts.processes


def _build_time(facts: Facts) -> str:
    """``, drawn in about N s (...)`` where a fresh run's tables take ``LONG_BUILD_S`` or more to draw."""
    seconds = build_seconds(facts)
    if facts.continued is not None or seconds < LONG_BUILD_S:
        return ""
    values = _drawn_values(facts)
    threads = f"{facts.threads} thread{'s' if facts.threads != 1 else ''}"
    return f", drawn in about {seconds:.0f} s ({values / 1e9:.2f}B values on {threads} of the CPU)"


FEW_STEPS = 20  # a run planning fewer steps than this is warned about


def fit_warnings(cfg: TrainConfig, train_rows: int) -> list[str]:
    """What in the resolved ``cfg`` the data cannot carry out as meant: a batch larger than the training rows, a
    warmup as long as the run, a run of a few steps."""
    steps = -(-train_rows // cfg.batch_size)
    planned = min(cfg.epochs * steps, cfg.max_steps) if cfg.max_steps else cfg.epochs * steps
    out = []
    if cfg.batch_size > train_rows:
        out.append(
            f"the batch of {cfg.batch_size:,} is larger than the {train_rows:,} training rows: each epoch is one "
            f"step; set --batch-size below {train_rows:,}"
        )
    if cfg.warmup_steps and cfg.warmup_steps >= planned:
        out.append(
            f"the warmup of {cfg.warmup_steps:,} steps is as long as the run's {planned:,}: the rates never reach "
            "their peak; set --warmup-steps lower (or --batch-size, for more steps)"
        )
    if planned < FEW_STEPS and planned == cfg.epochs * steps:  # not where --max-steps asked for few
        plural = "s" if planned != 1 else ""
        out.append(
            f"the run plans {planned:,} step{plural} in all: too few to train a model; a smaller --batch-size (or "
            "more --epochs) gives more"
        )
    return out


class RunSettings(Protocol):
    """What a plan reads of a run's resolved settings (``run.RunSpec``): the model and its config, the training
    settings and the layer each came from, the recipe, where the checkpoint goes and the checkpoint a continued run
    starts from."""

    model: str
    model_config: Any
    train: TrainConfig
    sources: dict
    recipe: str
    save_checkpoint: Path | None
    continue_from: Path | None


@dataclass(frozen=True)
class Facts:
    """What a plan is made from besides the settings: the data, the job and the model's sizes.

    Attributes:
        train_rows, validation_rows: the data's rows; ``validation_source`` says where the validation rows come from.
        processes: the job's processes; ``distributed``: more than one (a one-rank torchrun job plans as one process,
            as it trains the same weights).
        device: ``cpu`` or ``cuda``.
        steps: batches an epoch at the run's batch size.
        sizes: the bytes and table rows of the model built on the meta device.
        linear: the model has a first-order term; ``buckets``: its numerical buckets.
        dynamic: the features of raw ids (dynamic tables).
        continued: the checkpoint a continued run starts from, as given (None: a fresh run).
        sparse: the tables get sparse gradients (a dense gradient updates every row each step).
        room: what the process may still allocate where it trains (``memory.room``, measured).
        process_bytes: what the process holds now (``memory.process_rss``, measured).
        disk_free: bytes free on the disk the tables would go to on disk (``memory.tables_directory``), or None.
        host_room: on a GPU, what the process may still allocate in the CPU's memory (where tables in host memory
            go); None on the CPU (``room`` is the CPU's).
        threads: the CPU threads the tables are drawn on (``torch.get_num_threads``).
        preprocessing: the preprocessing the dataset carries (``RowTransform.to_state``), or None.
        precision: what the run computes in on its device (``device.precision_of``: the hardware's rule);
            ``precision_note``: why it is fp32 where more was asked ("" otherwise).
    """

    train_rows: int
    validation_rows: int
    validation_source: str
    processes: int
    distributed: bool
    device: str
    steps: int
    sizes: ModelSizes
    linear: bool
    buckets: bool
    dynamic: tuple[int, ...]
    continued: Any
    sparse: bool
    room: Room
    process_bytes: int
    disk_free: int | None
    preprocessing: dict[str, Any] | None = None
    precision: str = "fp32"
    precision_note: str = ""
    host_room: Room | None = None
    threads: int = 1

    @property
    def validation(self) -> bool:
        return self.validation_rows > 0

    @property
    def host(self) -> Room:
        """What the process may still allocate in the CPU's memory."""
        return self.host_room if self.host_room is not None else self.room


def facts_of(
    spec: RunSettings,
    train_rows: int,
    validation_rows: int,
    validation_source: str,
    processes: int,
    device: str,
    preprocessing: dict[str, Any] | None = None,
    precision: tuple[str, str] = ("fp32", ""),
) -> Facts:
    """The facts of RunSpec ``spec``'s run: its model built on the meta device (nothing allocated), the memory and
    disk room measured now."""
    import torch

    from ctrkit.data.atomic import free_bytes
    from ctrkit.models.registry import create_model

    with torch.device("meta"):
        model = create_model(spec.model, spec.model_config)
    return Facts(
        train_rows=train_rows,
        validation_rows=validation_rows,
        validation_source=validation_source,
        processes=processes,
        distributed=processes > 1,
        device=device,
        steps=-(-train_rows // spec.train.batch_size),
        sizes=sizes_of(model),
        linear=model.wide_embeddings is not None,
        buckets=model.wide_buckets is not None,
        dynamic=tuple(spec.model_config.dynamic_features),
        continued=spec.continue_from,
        sparse=spec.model_config.sparse_gradients,
        room=room(device),
        process_bytes=process_rss(),
        disk_free=free_bytes(tables_directory(spec.save_checkpoint)),
        preprocessing=preprocessing,
        precision=precision[0],
        precision_note=precision[1],
        host_room=room("cpu") if device != "cpu" else None,
        threads=torch.get_num_threads(),
    )


def make_plan(
    spec: RunSettings,
    train_rows: int,
    validation_rows: int,
    validation_source: str,
    processes: int = 1,
    device: str = "cpu",
    preprocessing: dict[str, Any] | None = None,
    precision: tuple[str, str] = ("fp32", ""),
) -> Plan:
    """The plan of RunSpec ``spec`` on ``train_rows`` training and ``validation_rows`` validation rows (held out
    as ``validation_source`` says) in a job of ``processes`` processes on ``device`` computing in ``precision``
    (``device.precision_of``'s name and why it is fp32 where more was asked),
    with the memory room measured now (``facts_of``, then ``plan_run``)."""
    facts = facts_of(spec, train_rows, validation_rows, validation_source, processes, device, preprocessing, precision)
    return plan_run(spec, facts)


def plan_run(spec: RunSettings, facts: Facts) -> Plan:
    """The plan of the resolved settings ``spec`` (``run.resolve_run``: flags, run YAML, recipe and the model's
    defaults in their layers) on ``facts`` (the data's size, the job, the device, the memory room, a continued
    checkpoint): every default and rule the data, the room or the device decides, applied here and only here; a
    function of its arguments alone. A setting the run cannot carry out (a second batch size or an ensemble in a
    distributed run, tables on disk where they cannot be) is a one-line ValueError naming it, never silently
    dropped."""
    sources = dict(spec.sources)
    cfg, resolved, rules = _schedule(spec.train, sources, facts)
    resolved, batches, configs = _batches(cfg, resolved, facts, rules)
    _check_storage(cfg, facts)
    _check_dynamic(sources, facts)
    memory, cfg, budget = _memory_plan(spec, cfg, sources, facts, cfg.seed_ensemble * len(batches), rules)
    storage = cfg.embedding_storage
    chosen = {
        "embedding_optimizer": cfg.embedding_optimizer,
        "embedding_lr": cfg.embedding_lr,
        "best_weights": cfg.best_weights,
        "embedding_storage": storage,
        "embedding_cache_rows": cfg.embedding_cache_rows,
        "linear_warm_start": bool(cfg.linear_warm_start and facts.continued is None),
    }
    resolved = replace(resolved, **chosen)
    configs = [replace(c, **chosen) for c in configs]
    memory["room"] = budget.bytes
    why = lambda name: rules.get(name) or str(source(sources, name))  # noqa: E731
    lines = [
        *_training_lines(cfg, resolved, facts, rules, why),
        *_mechanism_lines(spec, cfg, facts, batches, why),
        *_resource_lines(spec, cfg, facts, memory, budget, why, rules),
    ]
    lines += [("warning", w, "") for w in fit_warnings(resolved, facts.train_rows)]
    if facts.preprocessing is not None:
        lines.append(_preprocessing_line(facts.preprocessing))
    models = cfg.snapshot_ensemble * cfg.seed_ensemble
    return Plan(
        spec.recipe,
        spec.model,
        resolved,
        tuple(lines),
        memory,
        models,
        batches,
        cfg.seed_ensemble * len(batches),
        tuple(configs),
        None if facts.continued is None else str(facts.continued),
        facts.precision,
    )


def _schedule(cfg: TrainConfig, sources: dict, facts: Facts) -> tuple[TrainConfig, TrainConfig, dict[str, str]]:
    """The settings the data decides (``resolved_train``), and a continued run's own (``continued_settings``):
    (the settings, the settings with the data's values filled in, the rule of each value a rule chose)."""
    resolved, rules = resolved_train(cfg, facts.steps)
    if facts.continued is not None:  # a trained model, carried on (``mechanisms.continued_settings``)
        changes = continued_settings(cfg, sources, rules, facts.steps)
        cfg, resolved = replace(cfg, **changes), replace(resolved, **changes)
    return cfg, resolved, rules


def _batches(
    cfg: TrainConfig, resolved: TrainConfig, facts: Facts, rules: dict[str, str]
) -> tuple[TrainConfig, tuple[int, ...], list[TrainConfig]]:
    """The batch sizes trained (the run's, and on small data a smaller one: ``small_batch``) and the settings at
    each; a second batch or an ensemble a run cannot plan is refused."""
    small = cfg.small_batch
    if small is None:
        small = (
            default_small_batch(facts.train_rows)
            if (facts.steps < SMALL_EPOCH and facts.validation and not facts.distributed)
            else 0
        )
        rules["small_batch"] = f"{'' if small else 'only on '}data of fewer than {SMALL_EPOCH} batches an epoch"
    elif small and small >= cfg.batch_size:
        raise ValueError(f"--small-batch {small}: expected a batch size below the run's, {cfg.batch_size}")
    for name, value, what in (
        ("small_batch", small, "a second batch size"),
        ("snapshot_ensemble", cfg.snapshot_ensemble, "a snapshot ensemble"),
        ("seed_ensemble", cfg.seed_ensemble, "a seed ensemble"),
    ):
        if value and value > 1 and (facts.distributed or not facts.validation):
            where = "a distributed (torchrun) run trains one model" if facts.distributed else "it needs validation data"
            raise ValueError(
                f"--{name.replace('_', '-')} {value}: {what} cannot be planned: {where}; set "
                f"--{name.replace('_', '-')} {0 if name == 'small_batch' else 1}"
            )
    resolved = replace(resolved, small_batch=small)
    configs = [resolved]
    if small:  # its own epochs and schedule, the run's batch's patience
        patience = {k: getattr(resolved, k) for k in ("early_stopping_patience", "plateau_patience")}
        configs.append(
            resolved_train(
                replace(cfg, batch_size=small, small_batch=small, **patience), -(-facts.train_rows // small)
            )[0]
        )
    return resolved, (cfg.batch_size, small) if small else (cfg.batch_size,), configs


def _tier_home(device: str) -> str:
    """Where a run's tables go when they do not fit where it trains: on disk for a CPU run, in the CPU's memory
    (``host``) for a GPU run."""
    return "disk" if device == "cpu" else "host"


def _tier_possible(facts: Facts, home: str) -> bool:
    """Whether a run's tables can be tiered in ``home``: one process, sparse gradients, no dynamic tables; on disk
    on the CPU, in host memory on a GPU or (the cache's logic alone) on the CPU."""
    where = facts.device == "cpu" if home == "disk" else facts.device in ("cpu", "cuda")
    return where and not facts.distributed and facts.sizes.table_rows > 0 and facts.sparse and not facts.dynamic


def _check_storage(cfg: TrainConfig, facts: Facts) -> None:
    """Refuses ``embedding_storage`` disk or host where the run cannot keep its tables there."""
    home = cfg.embedding_storage
    if home not in HOMES:
        return
    if facts.dynamic:
        raise ValueError(
            f"dynamic features (raw ids) train with their tables in memory, not with --embedding-storage {home}; "
            "set --embedding-storage memory"
        )
    if not _tier_possible(facts, home):
        where = (
            "a distributed (torchrun) run"
            if facts.distributed
            else (f"a run on {facts.device}" if facts.sizes.table_rows else "no tables")
        )
        where = where if facts.sparse else "a model with dense embedding gradients (sparse_gradients false)"
        trains = "on the CPU" if home == "disk" else "on a GPU or the CPU"
        raise ValueError(
            f"--embedding-storage {home}: tiered tables train in one process {trains}, not {where}; "
            "set --embedding-storage memory"
        )


DYNAMIC_SETTINGS = ("admit_after", "eviction", "count_half_life")  # what only dynamic features (raw ids) act on


def _check_dynamic(sources: dict, facts: Facts) -> None:
    """Refuses a flag among ``DYNAMIC_SETTINGS`` where the dataset has no dynamic features: it would act on
    nothing."""
    given = [k for k in DYNAMIC_SETTINGS if source(sources, k).layer is Layer.FLAG]
    if given and not facts.dynamic:
        flags = ", ".join("--" + k.replace("_", "-") for k in given)
        raise ValueError(
            f"{flags}: admission and eviction act on dynamic features (raw ids), and this dataset has none "
            "(`preprocess table --raw-ids` makes them); drop the flag"
        )


def _memory_plan(
    spec: RunSettings, cfg: TrainConfig, sources: dict, facts: Facts, members: int, rules: dict[str, str]
) -> tuple[dict, TrainConfig, Room]:
    """The memory estimate, and the settings it changes: the best weights' tables on disk where they are large or
    a second copy would not fit, row-wise Adagrad or the tables on disk where the run would not fit (else a
    one-line refusal naming the options). Returns the estimate, the settings (``best_weights``,
    ``embedding_storage`` and ``embedding_cache_rows`` decided) and the room it was made for."""
    processes, validation, sizes = facts.processes, facts.validation, facts.sizes
    warm = cfg.linear_warm_start and facts.linear and validation and facts.continued is None
    best_left = source(sources, "best_weights").layer is Layer.DEFAULT
    best = cfg.best_weights or ("disk" if validation and sizes.tables // processes >= BEST_ON_DISK_TABLES else "memory")
    if cfg.best_weights is None and best == "disk":
        rules["best_weights"] = f"{gib(sizes.tables // processes)} of tables, from {gib(BEST_ON_DISK_TABLES)} on disk"
    home = cfg.embedding_storage if cfg.embedding_storage in HOMES else _tier_home(facts.device)
    can_tier = _tier_possible(facts, home)

    def need(optimizer: str, validation: bool = validation, best: str = best, cache: int | None = None) -> dict:
        first = facts.device == "cpu" and processes == 1 and cache is None  # ``storage.FILLED_LATER``
        return _memory(
            cfg,
            optimizer,
            sizes,
            spec.model_config,
            facts.train_rows,
            validation,
            members,
            warm,
            processes,
            best == "disk",
            cache,
            facts.validation_rows,
            first,
            facts.process_bytes,
        )

    budget = facts.room
    usable = None if budget.bytes is None else int(budget.bytes * USABLE)
    lookups = cfg.batch_size * max(len(spec.model_config.cardinalities), 1)

    def tiered(optimizer: str) -> tuple[dict, int, str]:
        rows, rule = cache_rows_for(cfg, lambda c: need(optimizer, cache=c), budget, usable, sizes, lookups)
        return need(optimizer, cache=rows), rows, rule

    if cfg.embedding_storage in HOMES:
        memory, cache_rows, rules["embedding_cache_rows"] = tiered(cfg.embedding_optimizer)
        cfg = replace(cfg, embedding_cache_rows=cache_rows)
    else:
        memory = need(cfg.embedding_optimizer)
    local = local_processes(processes, budget)
    if usable is not None and memory["more"] * local > usable and best == "memory":
        if validation and best_left and need(cfg.embedding_optimizer, best="disk")["more"] <= usable:
            best, memory = "disk", need(cfg.embedding_optimizer, best="disk")
            rules["best_weights"] = f"memory: a second copy of the tables would not fit in {budget.where}"
    if usable is not None and memory["more"] * local > usable:
        memory, cfg = _fit_or_refuse(
            cfg,
            sources,
            memory,
            partial(need, best=best),
            budget,
            usable,
            processes,
            rules,
            tiered if can_tier else None,
            home,
        )
    storage = cfg.embedding_storage or "memory"
    if storage in HOMES:
        best = "disk"
        _check_cache(cfg, lookups, sizes.table_rows)
        if storage == "host":  # on a CPU, the tables' home and the rest of the run share its memory
            check_host_room(memory["tables_in_tier"] + (memory["more"] if facts.device == "cpu" else 0), facts.host)
        check_disk_room(spec, memory, facts.disk_free, tables=storage == "disk")
    elif cfg.embedding_storage is None:
        rules.setdefault("embedding_storage", "the tables and their state fit in memory")
    return (
        memory,
        replace(
            cfg,
            best_weights=best,
            embedding_storage=storage,
            embedding_cache_rows=cfg.embedding_cache_rows if storage in HOMES else None,
        ),
        budget,
    )


def _check_cache(cfg: TrainConfig, lookups: int, table_rows: int) -> None:
    """Refuses a cache of tiered tables that cannot hold one step's rows."""
    step_rows = min(lookups, max(table_rows, 1))  # the distinct rows one step can look up in the flat table
    if cfg.embedding_cache_rows is not None and cfg.embedding_cache_rows < step_rows:
        raise ValueError(
            f"`embedding_cache_rows` {cfg.embedding_cache_rows:,} is fewer than the rows one step can look up "
            f"({step_rows:,}: a batch of {cfg.batch_size:,} x {lookups // cfg.batch_size} features); set it to at "
            "least that, or lower `batch_size`"
        )


def _training_lines(
    cfg: TrainConfig,
    resolved: TrainConfig,
    facts: Facts,
    rules: dict[str, str],
    why,
) -> list[tuple[str, str, str]]:
    """The plan's lines on the data and the training: epochs, stopping, optimizers, schedule and plateau."""
    validation, best, side = facts.validation, cfg.best_weights, facts.sizes.first_order
    held = (
        f"{facts.validation_rows:,} validation rows ({facts.validation_source})" if validation else "no validation data"
    )
    lines = [
        (
            "data",
            f"{facts.train_rows:,} training rows, {held}; {facts.steps:,} batches of {cfg.batch_size:,} an epoch",
            why("batch_size"),
        )
    ]
    most = f"at most {resolved.epochs}" + (f", at most {cfg.max_steps:,} steps" if cfg.max_steps else "")
    lines.append(("epochs", most, why("epochs")))
    stop = resolved.early_stopping_patience if validation else 0
    kept = f" (their tables on disk: {why('best_weights')})" if best == "disk" and validation else ""
    lines.append(
        (
            "early stop",
            f"after {stop} evaluations without a gain of {cfg.min_delta:g} in validation AUC, "
            f"{resolved.evals_per_epoch} evaluations an epoch; the best weights kept{kept}"
            if stop and validation
            else ("off" + (f"; the best weights kept{kept}" if validation else "; the last weights kept")),
            why("early_stopping_patience"),
        )
    )
    lines.append(
        (
            "optimizers",
            f"{cfg.optimizer} {cfg.lr:g} (dense), {cfg.embedding_optimizer} {cfg.embedding_lr:g} "
            "(tables)" + (f", {cfg.wide_optimizer} {cfg.wide_lr:g} (first-order)" if side else ""),
            why(next((n for n in ("embedding_optimizer", "lr", "embedding_lr", "wide_lr") if n in rules), "optimizer")),
        )
    )
    lines.append(
        (
            "schedule",
            _schedule_text(cfg, resolved),
            why("decay_steps") if cfg.lr_schedule == "poly" else why("lr_schedule"),
        )
    )
    plateau = resolved.plateau_patience if validation else 0
    lines.append(
        (
            "plateau",
            f"rates x{cfg.plateau_factor:g} after {plateau} evaluations without a gain" if plateau else "off",
            why("plateau_patience"),
        )
    )
    return lines


def _mechanism_lines(
    spec: RunSettings, cfg: TrainConfig, facts: Facts, batches: tuple[int, ...], why
) -> list[tuple[str, str, str]]:
    """The plan's lines on the mechanisms: the first-order term, the warm start, redraws, batches, ensembles and
    calibration."""
    validation, lines = facts.validation, []
    if "linear" in type(spec.model_config).__dataclass_fields__:  # a model whose first-order term is optional
        lines.append(
            ("first order", "on: a logistic term beside the deep part" if facts.linear else "off", why("linear"))
        )
    buckets = spec.model_config.numerical_buckets if facts.buckets else 0
    lines.append(
        (
            "buckets",
            f"up to {buckets} quantile buckets a numerical in the first-order term" if buckets else "off",
            why("numerical_buckets"),
        )
    )
    lines.append(("warm start", _warm_start_text(cfg, facts), why("linear_warm_start")))
    redraws = cfg.reinit_embeddings if validation or cfg.reinit_embeddings == "on" else "off"
    redraw = {
        "auto": "auto: once a later epoch overfits (validation AUC falls by "
        f"{cfg.reinit_drop:g}), from the best weights with new tables",
        "on": "every epoch after the first",
        "off": "off",
    }[redraws]
    lines.append(("redraws", redraw, why("reinit_embeddings")))
    lines.append(
        (
            "batches",
            " and ".join(f"{b:,}" for b in batches) + (", the better kept" if len(batches) > 1 else ""),
            why("small_batch"),
        )
    )
    ens = [f"snapshot ensemble of up to {cfg.snapshot_ensemble}"] if cfg.snapshot_ensemble > 1 else []
    ens += [f"{cfg.seed_ensemble} seeds"] if cfg.seed_ensemble > 1 else []
    lines.append(
        (
            "ensembles",
            ", ".join(ens) + " where validation prefers the mean" if ens else "off: one model",
            why("snapshot_ensemble") or why("seed_ensemble"),
        )
    )
    calibrate = {
        "auto": "auto: a logit scale kept where a likelihood-ratio test passes at 99%",
        "on": "on",
        "off": "off",
    }[cfg.calibrate if validation else "off"]
    lines.append(("calibration", calibrate, why("calibrate")))
    return lines


def _preprocessing_line(preprocessing: dict[str, Any]) -> tuple[str, str, str]:
    """The plan's line on the preprocessing the checkpoint carries to score raw rows."""
    described = preprocessing["description"]
    values = sum(int(v["ids"].numel()) for v in preprocessing["vocabularies"].values())
    rare = (
        "; values rarer than the frequency threshold are left out and score as unseen ones (id 0)"
        if described.get("rare_values") == "missing"
        else ""
    )
    what = f"carried in the checkpoint: {len(described['columns'])} raw columns' rules, {values:,} vocabulary values"
    return ("preprocessing", what + rare, "the dataset's preprocessing.json")


def _schedule_text(cfg: TrainConfig, resolved: TrainConfig) -> str:
    decay = (
        f"decay from step {resolved.decay_start_step:,} over {resolved.decay_steps:,}"
        if resolved.decay_steps
        else "no decay"
    )
    schedule = "step (a quarter, then an eighth of the peak)" if cfg.lr_schedule == "step" else decay
    return f"warmup {resolved.warmup_steps:,} step{'s' if resolved.warmup_steps != 1 else ''}, {schedule}"


def _warm_start_text(cfg: TrainConfig, facts: Facts) -> str:
    if cfg.linear_warm_start and facts.linear and facts.validation and facts.continued is None:
        rule = "kept unless a trained model beats its validation AUC"
        rule += " and log loss" if cfg.warm_start_logloss else ""
        return f"on: the first-order term fitted as a logistic regression first; {rule}"
    reason = "no first-order term" if not facts.linear else ("no validation data" if not facts.validation else "")
    if cfg.linear_warm_start and facts.linear and facts.validation:
        reason = "the run continues a trained model"
    return "off" + (f" ({reason})" if reason else "")


def _resource_lines(
    spec: RunSettings, cfg: TrainConfig, facts: Facts, memory: dict, budget: Room, why, rules: dict[str, str]
) -> list[tuple[str, str, str]]:
    """The plan's lines on how and where the run executes: processes and device, the tables, dynamic ids, a
    continued model, memory and scoring."""
    processes, device, mc = facts.processes, facts.device, spec.model_config
    how = [f"{processes} processes" if processes > 1 else "one process", device]
    how.append(f"batch split over threads: {cfg.split_batch}" if device == "cpu" and processes == 1 else "")
    how += [_precision_text(cfg, facts.precision, facts.precision_note), "torch.compile" if cfg.compile else ""]
    lines = [
        (
            "execution",
            ", ".join(h for h in how if h),
            why("split_batch")
            if cfg.split_batch != "auto"
            else "auto: on with 2 or more threads and 64 samples a thread",
        )
    ]
    if cfg.embedding_storage == "disk":
        lines.append(
            (
                "tables",
                f"on disk ({gib(memory['tables_in_tier'])} with their optimizer state, in "
                f"{tables_directory(spec.save_checkpoint)}), {cfg.embedding_cache_rows:,} rows of each cached in "
                "memory",
                why("embedding_storage") + "; cache: " + why("embedding_cache_rows"),
            )
        )
    elif cfg.embedding_storage == "host":
        lines.append(
            (
                "tables",
                f"in host memory ({gib(memory['tables_in_tier'])} with their optimizer state), "
                f"{cfg.embedding_cache_rows:,} rows of each cached on {facts.device}",
                why("embedding_storage") + "; cache: " + why("embedding_cache_rows"),
            )
        )
    else:
        where = "in memory" if facts.device == "cpu" else f"on {facts.device}"
        lines.append(("tables", where + _build_time(facts), why("embedding_storage")))
    if facts.dynamic:
        caps = [mc.cardinalities[i] for i in facts.dynamic]
        span = f"{min(caps):,}" + (f" to {max(caps):,}" if max(caps) != min(caps) else "")
        decay = f"halving every {cfg.count_half_life:,} batches" if cfg.count_half_life else "never decaying"
        rule = "count_half_life" if "count_half_life" in rules else "admit_after"  # a continued run's half-life
        lines.append(
            (
                "dynamic",
                f"{len(facts.dynamic)} features of raw ids in tables of {span} rows; an id gets a row "
                f"after {cfg.admit_after} sighting{'s' if cfg.admit_after != 1 else ''}, {cfg.eviction} "
                f"eviction when full, counts {decay}",
                why(rule),
            )
        )
    if facts.continued is not None:
        lines.append(
            (
                "continues",
                f"from {facts.continued}: its selected weights (dynamic tables' ids and counts "
                "with them) and optimizer states; steps, schedule and model selection start over",
                "--continue-from",
            )
        )
    lines.append(("memory", _memory_text(memory, budget, processes), "estimate"))
    models = cfg.snapshot_ensemble * cfg.seed_ensemble
    lines.append(("scoring", f"{models} models a request at most" if models > 1 else "1 model a request", ""))
    return lines


PRECISION_TEXT = {
    "fp32": "fp32",
    "tf32": "tf32 (fp32 with matmuls on TF32 tensor cores)",
    "bf16": "bf16 autocast",
    "fp16": "fp16 autocast with loss scaling",
}


def _precision_text(cfg: TrainConfig, precision: str, note: str) -> str:
    """The precision the run computes in, and why where the device gave less than was asked."""
    if note:
        return f"fp32 ({cfg.precision or 'autocast'} asked: {note})"
    if not cfg.precision_asked and precision != "fp32":
        return f"{PRECISION_TEXT[precision]} (this device's default; --precision fp32 computes in fp32)"
    return PRECISION_TEXT[precision]


def _memory_text(memory: dict, budget: Room, processes: int) -> str:
    per = " a process" if processes > 1 else ""
    disk = f" (and {gib(memory['copies_on_disk'])} on disk)" if memory["copies_on_disk"] else ""
    has = (
        f"; {gib(memory['more'])} more of {gib(budget.bytes)} available beside it ({budget.where})"
        if budget.bytes
        else ""
    )
    return (
        f"peak about {gib(memory['peak'])}{per}: weights {gib(memory['weights'])}, optimizer state "
        f"{gib(memory['optimizer'])}, copies kept {gib(memory['copies'])}{disk}, warm start "
        f"{gib(memory['warm_start'])}, this process now {gib(memory['process'])}{has}"
    )
