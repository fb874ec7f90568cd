"""The plan's memory fitting: a process's estimated peak by part, and the settings it changes where the run would not
fit (the best weights' tables on disk, row-wise Adagrad, the tables tiered on disk or in host memory with a cache),
else a one-line refusal naming the options. ``plan.plan_run`` calls ``check_storage`` and ``memory_plan``."""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from typing import Any

from ctrkit.config import TrainConfig
from ctrkit.models.tiered_tables import HOMES
from ctrkit.optimizers import KINDS, LIGHT_TABLE_OPTIMIZER, kind
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
from ctrkit.train.plan_facts import Facts, ModelSizes, RunSettings
from ctrkit.train.sources import Layer, source


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


def _tier_home(device: str) -> str:
    """Where a run's tables go when they do not fit where it trains: on disk for a CPU run, in the CPU's memory
    (``host``) for a GPU run."""
    return "disk" if device == "cpu" else "host"


def _tier_possible(facts: Facts, home: str) -> bool:
    """Whether a run's tables can be tiered in ``home``: one process, sparse gradients, no dynamic tables; on disk
    on the CPU, in host memory on a GPU or (the cache's logic alone) on the CPU."""
    where = facts.device == "cpu" if home == "disk" else facts.device in ("cpu", "cuda")
    return where and not facts.distributed and facts.sizes.table_rows > 0 and facts.sparse and not facts.dynamic


def check_storage(cfg: TrainConfig, facts: Facts) -> None:
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


def memory_plan(
    spec: RunSettings, cfg: TrainConfig, sources: dict, facts: Facts, members: int, rules: dict[str, str]
) -> tuple[dict, TrainConfig, Room]:
    """The memory estimate, and the settings it changes: the best weights' tables on disk where they are large or
    a second copy would not fit, row-wise Adagrad or the tables on disk where the run would not fit (else a
    one-line refusal naming the options). Returns the estimate, the settings (``best_weights``,
    ``embedding_storage`` and ``embedding_cache_rows`` decided) and the room it was made for."""
    # one job: one decision: the estimate and the settings it changes (best weights' place, the embedding optimizer,
    # the tables' storage) are decided together, each change re-estimated
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
