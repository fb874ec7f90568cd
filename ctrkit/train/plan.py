"""The plan of a training run: every setting, mechanism and derived value, resolved once before the first step.

``make_plan`` takes the resolved settings (recipe, run YAML and flags over the model's defaults: ``run.resolve_run``)
and the data's size and fills in what depends on the data (the most epochs, the patience, the learning-rate
schedule, the small batch), each with the rule or layer that chose it. ``ctrkit train`` prints the plan, writes it
into the run YAML and the checkpoint, and the trainer executes its settings. The rules that depend on the data are
all here: the trainer and the run apply none of their own. What a plan is made from is ``plan_facts``; what it
prints, ``plan_text``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from ctrkit.config import TrainConfig
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
    table_state_bytes,
    working_bytes,
)
from ctrkit.train.plan_facts import Facts, ModelSizes, RunSettings, facts_of
from ctrkit.train.plan_text import fit_warnings, mechanism_lines, preprocessing_line, resource_lines, training_lines
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
        *training_lines(cfg, resolved, facts, rules, why),
        *mechanism_lines(spec, cfg, facts, batches, why),
        *resource_lines(spec, cfg, facts, memory, budget, why, rules),
    ]
    lines += [("warning", w, "") for w in fit_warnings(resolved, facts.train_rows)]
    if facts.preprocessing is not None:
        lines.append(preprocessing_line(facts.preprocessing))
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
