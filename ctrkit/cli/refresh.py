"""A model's day: refresh, check."""

from __future__ import annotations

import argparse
import inspect
import sys

from ctrkit.cli.options import add_command, add_config_flags, config_from, config_values
from ctrkit.data_config import TablePreprocessConfig
from ctrkit.refresh_config import CheckConfig, CheckThresholds, RefreshConfig

EXIT_REFUSED = 3  # a day whose checks failed: nothing published (2 stays bad input)
# preprocess table's flags that refresh decides itself (its split, its output) or owns under its own name
NOT_TABLE_FLAGS = ("raw", "out", "label", "test_files", "test_fraction", "validation_fraction", "like", "overwrite",
                   "no_progress")  # fmt: skip


def register(sub: argparse._SubParsersAction) -> None:
    doc = inspect.cleandoc(refresh.__doc__ or "")
    summary, _, details = doc.partition("\n\n")
    parser = sub.add_parser("refresh", help=summary, description=" ".join(details.split()))
    add_config_flags(parser, RefreshConfig)
    add_config_flags(parser, CheckThresholds)
    table = parser.add_argument_group(
        "table flags", "as `preprocess table` takes them: on the model's first day they say how its log is read; "
        "given on a later day, each must equal the first day's (else refused, naming it)",
    )  # fmt: skip
    table.add_argument("--label", default=argparse.SUPPRESS,
                       help="the label column (0/1 or true/false unless --positive or --label-threshold); needed on "
                            "the first day")  # fmt: skip
    add_config_flags(table, TablePreprocessConfig, exclude=NOT_TABLE_FLAGS, suppress=True)
    parser.set_defaults(handler=refresh)
    add_command(sub, "check", check, (CheckConfig, CheckThresholds))


def _thresholds(args: argparse.Namespace):
    """The checks' thresholds of the flags (``refresh.checks.Thresholds``), validated."""
    from ctrkit.refresh.checks import Thresholds

    c: CheckThresholds = config_from(args, CheckThresholds)
    t = Thresholds(c.max_missing_rise, c.min_seen_kept, c.max_psi, c.max_ctr_ratio, c.min_lift_kept, c.min_rows)
    t.validate()
    return t


def _table_flags(args: argparse.Namespace) -> dict:
    """The table flags given on the command line (those left out are absent)."""
    names = [f for f in config_values(args, TablePreprocessConfig) if f not in NOT_TABLE_FLAGS or f == "label"]
    return {k: getattr(args, k) for k in names}


def refresh(args: argparse.Namespace) -> int:
    """a model's day in one command: check the day, score it, train on it, gate, publish

    The first day of a model (nothing in --repository under --name yet) is read with the table flags of `preprocess
    table`, its last --holdout-fraction of rows held out, the rest trained on, and the model published as version 1.
    Every later day, with the same command line (a cron line): the day is checked against the served model (its
    columns, missing shares, unseen values, numbers' PSI, click rate; the served model's AUC on the day, scored
    before training on it, against its recent days); written --like the served model and trained on, continuing
    it, with the rows the served model has not trained on yet (the last day's held-out tail); while the newest whole
    days hold at most --fresh-rows rows, a second candidate trained from scratch on them, the better of the two on
    the day's held-out tail kept; the candidate and the served model scored on that tail (the gate); and the
    candidate published as the next version
    (atomically; `ctrkit serve --poll-s` and Triton's POLL mode pick it up while the old version answers) or the
    served one kept. Each day ends in one line, published, kept or refused, and one JSON record in the state
    directory's history.jsonl (also history.html). A refused day exits with status 3, nothing published; --force
    takes it. --rollback serves the version before the served one again.
    """
    from ctrkit.refresh.loop import Refresh, RefreshSettings, Refused, rollback

    cfg: RefreshConfig = config_from(args, RefreshConfig)
    if cfg.repository is None or cfg.name is None:  # (both required flags)
        raise ValueError("give the model repository (--repository) and the model's name (--name)")
    options = {k: v for k, v in (("epochs", cfg.epochs), ("max_steps", cfg.max_steps), ("seed", cfg.seed))
               if v is not None}  # fmt: skip
    settings = RefreshSettings(
        cfg.repository, cfg.name, cfg.state_dir, cfg.model, cfg.holdout_fraction, cfg.backend, cfg.keep_versions,
        _thresholds(args), cfg.auc_tolerance, cfg.logloss_tolerance, cfg.bootstrap_rounds, cfg.force, options,
        cfg.nproc_per_node, cfg.notify, not cfg.no_progress, cfg.fresh_rows,
    )  # fmt: skip
    say = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    if cfg.rollback:
        record = rollback(settings, say)
        print(f"{cfg.name}: rolled back: {record['reason']}")
        return 0
    try:
        record = Refresh(settings, _table_flags(args), say).run(cfg.days)
    except Refused as e:
        print(f"{cfg.name}: {e}")
        return EXIT_REFUSED
    gate = record.get("gate")
    figures = (
        f"; served {gate['served']['auc']:.4f} -> candidate {gate['candidate']['auc']:.4f} on held-out rows"
        if gate
        else ""
    )
    progressive = record.get("progressive")
    before = f"; the served model scored the day at AUC {progressive['auc']:.4f}" if progressive else ""
    version = record.get("version") or record.get("served_after")
    print(f"{cfg.name}: day {record['day']} {record['verdict']} (version {version}){before}{figures}; "
          f"{record['reason']} ({record['seconds']:.1f} s)")  # fmt: skip
    return 0


def check(args: argparse.Namespace) -> int:
    """a day's raw rows checked against a model, as refresh checks them, printed as a table

    The day's columns, each column's missing share, each categorical feature's share of values the model has not
    seen, each number's PSI on the reference day's deciles, the click rate, and the model's AUC and log loss on the
    day before any training on it. The model is a checkpoint (--checkpoint, its reference day given by --against)
    or the version a refresh serves (--repository, --name: its reference day and recent days). Exits with status 3
    where a check fails.
    """
    from ctrkit.preprocess.table_recipe import TableRecipe
    from ctrkit.refresh.checks import profile, table
    from ctrkit.refresh.day import read_day
    from ctrkit.refresh.loop import judge_day, model_reading, predictor_of, reference_of, table_recipe
    from ctrkit.refresh.store import RefreshStore

    cfg: CheckConfig = config_from(args, CheckConfig)
    limits = _thresholds(args)
    history: list = []
    if cfg.repository is not None:
        if cfg.name is None:
            raise ValueError("`name`: give the model's name in --repository")
        store = RefreshStore(cfg.repository, cfg.name, cfg.state_dir)
        state = store.read()
        if state is None or state.served is None:
            raise ValueError(f"{store.state_file}: no model refreshed there yet (ctrkit refresh makes one)")
        checkpoint = store.checkpoint(state.served.checkpoint)
        recipe, _ = table_recipe(state.flags, like=True)
        reference, history, age = reference_of(state), store.history(), state.days + 1 - state.served.day
    elif cfg.checkpoint is not None:
        checkpoint, reference, age = cfg.checkpoint, None, 1
    else:  # (one of the two is required)
        raise ValueError("give the model's --checkpoint, or --repository and --name")
    predictor, transform = predictor_of(checkpoint)
    if cfg.repository is None:
        label = cfg.label or transform.label
        if not label:
            raise ValueError(f"`label`: {checkpoint} names no label column; give --label")
        recipe = TableRecipe(label=label, positive=cfg.positive, label_threshold=cfg.label_threshold,
                             csv_separator=cfg.csv_separator)  # fmt: skip
    recipe = model_reading(recipe, transform)
    if cfg.against:
        earlier = read_day(cfg.against, recipe)
        reference = profile(earlier.rows, earlier.labels, transform, unseen={})  # (a reference's are read nowhere)
    day = read_day(cfg.days, recipe)
    judged = judge_day(day, predictor, transform, reference, limits, history, age)
    print(table(judged.checks))
    if judged.progressive is not None:
        p = judged.progressive
        print(f"the model on the day's {len(day):,} rows before training on them: AUC {p.auc:.4f}, log loss "
              f"{p.logloss:.4f}, calibration {p.calibration:.3f}")  # fmt: skip
    bad = [c for c in judged.checks if not c.passed]
    print(f"{len(judged.checks) - len(bad)} of {len(judged.checks)} checks passed" + (
        "; the day would be refused" if bad else ""))  # fmt: skip
    return EXIT_REFUSED if bad else 0
