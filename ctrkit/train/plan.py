"""The plan of a training run: every setting, mechanism and derived value, resolved once before the first step.

``make_plan`` takes the resolved settings (recipe, run YAML and flags over the model's defaults: ``run.resolve_run``)
and the data's size and fills in what depends on the data (the most epochs, the patience, the learning-rate
schedule, the small batch), each with the rule or layer that chose it. ``ctrkit train`` prints the plan, writes it
into the run YAML and the checkpoint, and the trainer executes its settings. The rules that depend on the data are
all here: the trainer and the run apply none of their own. What a plan is made from is ``plan_facts``; the memory
fitting, ``plan_memory``; what it prints, ``plan_text``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ctrkit.config import TrainConfig
from ctrkit.device import AUTOCAST, DeviceFacts, Precision, eval_dtype_for, precision_of
from ctrkit.train.mechanisms import continued_settings
from ctrkit.train.plan_facts import Facts, RunSettings, epoch_steps, facts_of
from ctrkit.train.plan_memory import check_storage, memory_plan
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


AUTO_WIDTH = (4, 64)  # the bounds of --embedding-sizes auto


def auto_embedding_width(cardinality: int) -> int:
    """``--embedding-sizes auto``'s width for a table of ``cardinality`` rows: 6 x its fourth root
    (the rule of thumb Google's feature-column guide gives), rounded and kept within ``AUTO_WIDTH``."""
    return int(min(AUTO_WIDTH[1], max(AUTO_WIDTH[0], round(6 * cardinality**0.25))))


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
        members: the TrainConfig of each model trained, one after another (``seed_ensemble`` x batch sizes; one
            for a plain run, ``train``), every setting decided: member m trains at ``batches[m % len(batches)]``
            with seed ``seed + m // len(batches)``; a smaller batch's has its own epochs and schedule, and the
            run's batch's patience. None is left only where it means none (``max_steps``: the epochs' steps,
            ``checkpoint_every``: at evaluations, ``embedding_cache_rows``: tables in memory) or where it means the
            device's default, which the plan's ``precision`` decides (``precision``, ``amp_dtype``, ``eval_dtype``:
            what was asked is kept).
        precision: what the run computes in and scores in (``decide_precision``).
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
    members: tuple[TrainConfig, ...]
    continued_from: str | None = None
    precision: Precision = Precision()

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
            "members": len(self.members),
            "continued_from": self.continued_from,
            "precision": self.precision.name,
        }


def make_plan(
    spec: RunSettings,
    train_rows: int,
    validation_rows: int,
    validation_source: str,
    processes: int = 1,
    device: str = "cpu",
    preprocessing: dict[str, Any] | None = None,
    hardware: DeviceFacts | None = None,
    trained_batches: tuple[int | None, ...] = (),
    resumed_member: int = 0,
) -> Plan:
    """The plan of RunSpec ``spec`` on ``train_rows`` training and ``validation_rows`` validation rows (held out
    as ``validation_source`` says) in a job of ``processes`` processes on ``device`` (its ``hardware``: what the
    precision rules read; None: no native bf16 or TF32), resuming a seed ensemble whose
    members were trained at ``trained_batches`` from a checkpoint taken in member ``resumed_member``, with the
    memory room measured now (``facts_of``, then ``plan_run``)."""
    facts = facts_of(
        spec,
        train_rows,
        validation_rows,
        validation_source,
        processes,
        device,
        preprocessing,
        hardware,
        trained_batches=trained_batches,
        resumed_member=resumed_member,
    )
    return plan_run(spec, facts)


def plan_run(spec: RunSettings, facts: Facts) -> Plan:
    """The plan of the resolved settings ``spec`` (``run.resolve_run``: flags, run YAML, recipe and the model's
    defaults in their layers) on ``facts`` (the data's size, the job, the device, the memory room, a continued
    checkpoint): every default and rule the data, the room or the device decides, applied here and only here; a
    function of its arguments alone. A setting the run cannot carry out (a second batch size or an ensemble in a
    distributed run, tables on disk where they cannot be) is a one-line ValueError naming it, never silently
    dropped."""
    sources = dict(spec.sources)
    precision = decide_precision(spec.train, facts)
    cfg, resolved, rules = _schedule(spec.train, sources, facts)
    resolved, batches, configs = _batches(cfg, resolved, facts, rules)
    check_storage(cfg, facts)
    _check_features(sources, facts)
    memory, cfg, budget = memory_plan(spec, cfg, sources, facts, cfg.seed_ensemble * len(batches), rules)
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
        *resource_lines(spec, cfg, facts, memory, budget, why, rules, precision),
    ]
    lines += [("warning", w, "") for w in fit_warnings(resolved, facts.train_rows)]
    if facts.preprocessing is not None:
        lines.append(preprocessing_line(facts.preprocessing))
    models = cfg.snapshot_ensemble * cfg.seed_ensemble
    members = tuple(
        replace(configs[m % len(batches)], seed=cfg.seed + m // len(batches))
        for m in range(cfg.seed_ensemble * len(batches))
    )
    if len(facts.trained_batches) > len(members):
        raise ValueError(
            f"the checkpoint holds {len(facts.trained_batches)} trained members; this run asks for {len(members)} "
            "(--seed-ensemble, --small-batch): resume with the same settings"
        )
    if facts.resumed_member >= len(members):
        raise ValueError(
            f"the checkpoint was taken in member {facts.resumed_member + 1} of a seed ensemble; this run asks for "
            f"{len(members)} (--seed-ensemble, --small-batch): resume with the same settings"
        )
    return Plan(
        spec.recipe,
        spec.model,
        resolved,
        tuple(lines),
        memory,
        models,
        batches,
        members,
        None if facts.continued is None else str(facts.continued),
        precision,
    )


def decide_precision(cfg: TrainConfig, facts: Facts) -> Precision:
    """What the run computes in and scores in, from the settings and the device's facts (``device.precision_of``,
    ``device.eval_dtype_for``: the hardware's rules, read from ``facts.hardware``). One process's share of a step
    decides whether autocast pays on CUDA."""
    local = cfg.batch_size // facts.processes if cfg.batch_size else None
    name, autocast, why = precision_of(facts.hardware, cfg.precision, cfg.amp, cfg.amp_dtype, local)
    scored = eval_dtype_for(facts.hardware, cfg.eval_dtype, autocast, cfg.precision_asked)
    return Precision(name, why, next((k for k, dtype in AUTOCAST.items() if dtype == scored), None))


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
    each; a second batch or an ensemble a run cannot plan is refused, as is a resume whose checkpoint's members were
    trained at other batch sizes."""
    small, trained = cfg.small_batch, facts.trained_batches
    if small is None and trained and all(b is None for b in trained):
        small = 0  # members saved before they recorded their batch: trained before --small-batch, at one
        rules["small_batch"] = "the checkpoint's members were trained at one batch size"
    elif small is None:
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
                replace(cfg, batch_size=small, small_batch=small, **patience), epoch_steps(facts.train_rows, small)
            )[0]
        )
    batches = (cfg.batch_size, small) if small else (cfg.batch_size,)
    if any(b is not None and b != batches[i % len(batches)] for i, b in enumerate(trained)):
        raise ValueError(
            f"the checkpoint's members were trained at batch sizes {list(trained)}, this run takes turns over "
            f"{list(batches)} (--batch-size, --small-batch): resume with the same settings"
        )
    return resolved, batches, configs


# settings that act only on features a dataset may lack: (the settings, the fact that says it has them, what they act
# on, what makes such features)
FEATURE_SETTINGS = (
    (("admit_after", "eviction", "count_half_life"), "dynamic", "admission and eviction act on dynamic features "
     "(raw ids)", "`preprocess table --raw-ids` makes them"),
    (("combiner",), "multi_hot", "pooling acts on multi-hot features", "`preprocess table --multi-hot` makes them"),
)  # fmt: skip


def _check_features(sources: dict, facts: Facts) -> None:
    """Refuses a flag among ``FEATURE_SETTINGS`` where the dataset lacks the features it acts on: it would act on
    nothing."""
    for names, fact, what, made in FEATURE_SETTINGS:
        given = [k for k in names if source(sources, k).layer is Layer.FLAG]
        if given and not getattr(facts, fact):
            flags = ", ".join("--" + k.replace("_", "-") for k in given)
            raise ValueError(f"{flags}: {what}, and this dataset has none ({made}); drop the flag")
