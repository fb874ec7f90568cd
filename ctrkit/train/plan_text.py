"""The plan's words: the lines ``ctrkit train`` prints for a plan (``plan.Plan.lines``: topic, value, the rule or
layer that chose it), and the warnings on a run that plans too few steps. ``plan.plan_run`` decides; this module only
says what was decided."""

from __future__ import annotations

from typing import Any

from ctrkit.config import TrainConfig
from ctrkit.device import Precision
from ctrkit.train.memory import Room, gib, tables_directory
from ctrkit.train.plan_facts import Facts, RunSettings, epoch_steps

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
    steps = epoch_steps(train_rows, cfg.batch_size)
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


def training_lines(
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


def mechanism_lines(
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


def preprocessing_line(preprocessing: dict[str, Any]) -> tuple[str, str, str]:
    """The plan's line on the preprocessing the checkpoint carries to score raw rows."""
    described = preprocessing["description"]
    if "vocabularies" in preprocessing:  # a table's or Criteo's
        values = sum(int(v["ids"].numel()) for v in preprocessing["vocabularies"].values())
    else:  # Outbrain's: its vocabularies' values are counted in its description
        values = int(described.get("values", 0))
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


def resource_lines(
    spec: RunSettings,
    cfg: TrainConfig,
    facts: Facts,
    memory: dict,
    budget: Room,
    why,
    rules: dict[str, str],
    precision: Precision,
) -> list[tuple[str, str, str]]:
    """The plan's lines on how and where the run executes: processes and device (computing in ``precision``), the
    tables, dynamic ids, a continued model, memory and scoring."""
    processes, device, mc = facts.processes, facts.device, spec.model_config
    how = [f"{processes} processes" if processes > 1 else "one process", device]
    how.append(f"batch split over threads: {cfg.split_batch}" if device == "cpu" and processes == 1 else "")
    how += [_precision_text(cfg, precision.name, precision.why), "torch.compile" if cfg.compile else ""]
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
