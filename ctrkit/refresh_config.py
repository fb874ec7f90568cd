"""Typed, frozen configuration of ``ctrkit refresh`` and ``ctrkit check``; their flags are generated from these
dataclasses as from ``config.py``'s (the table flags are ``data_config.TablePreprocessConfig``'s)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ctrkit.config import option
from ctrkit.field_types import COUNT, FRACTION, SEED, SHARE, Range


@dataclass(frozen=True)
class CheckThresholds:
    """When a day's checks refuse it: the flags of ``refresh`` and ``check`` alike (``refresh.checks.Thresholds``)."""

    max_missing_rise: float = option(0.3, "a column's share of missing values may rise this much over the reference "
                                           "day's (a share, 0-1)", bounds=SHARE)  # fmt: skip
    min_seen_kept: float = option(
        0.5,
        "a categorical feature's share of rows whose value the model knows must keep at least this share of its "
        "recent days' (features under 10% there, ids new every day, are not judged)",
        bounds=SHARE,
    )
    max_psi: float = option(
        0.25, "a number's population stability index on the reference day's deciles", bounds=Range(0, 1000)
    )
    max_ctr_ratio: float = option(
        2.0, "the click rate may be this many times the reference day's, or that share of it", bounds=Range(1, 1e6)
    )
    min_lift_kept: float = option(
        0.5,
        "the served model's AUC on the new day, before training on it, must keep at least this share of its "
        "recent days' lift over 0.5 (0.5: chance, what shuffled labels give)",
        bounds=SHARE,
    )
    min_rows: int = option(100, "rows a day must hold", bounds=COUNT)


@dataclass(frozen=True)
class RefreshConfig:
    """``ctrkit refresh``: the day's files, the model repository, and how the day is trained, gated and published."""

    days: tuple[Path, ...] = option(
        (), "the day's raw files (CSV, TSV or Parquet with a header), in order", positional=True, nargs="*"
    )
    repository: Path | None = option(None, "the model repository the versions are published to (Triton's layout)",
                                      required=True)  # fmt: skip
    name: str | None = option(None, "the model's name in the repository", required=True)
    state_dir: Path | None = option(
        None, "where refresh keeps the model's checkpoints, history and held-out rows (outside the repository: "
        "Triton reloads a model whose directory changes)", unset="REPOSITORY.refresh/NAME beside the repository",
    )  # fmt: skip
    model: str | None = option(None, "the model trained on the first day; later days continue it (another name is "
                                     "refused)", unset="dlrm on the first day, then the served model")  # fmt: skip
    holdout_fraction: float = option(
        0.1,
        "the day's last share of rows (in time order) held out for selection and the gate; they are trained on "
        "with the next day",
        bounds=FRACTION,
    )
    backend: str = option("onnx", "the Triton backend of each version (export --backend)", ("onnx", "torchscript",
                                                                                           "python"))  # fmt: skip
    keep_versions: int = option(3, "versions left in the repository (the oldest removed), and checkpoints kept for "
                                   "--rollback", bounds=Range(1, 1_000_000))  # fmt: skip
    auc_tolerance: float = option(
        0.002,
        "the gate keeps the served model when the candidate's AUC on the held-out rows is lower by more than "
        "this even at the top of its 95% bootstrap interval",
        bounds=SHARE,
    )
    logloss_tolerance: float = option(
        0.002, "... or its log loss higher by more than this even at the bottom of its interval", bounds=Range(0, 1000)
    )
    bootstrap_rounds: int = option(
        200, "paired bootstrap resamples of the held-out rows for the gate's intervals", bounds=Range(10, 1_000_000)
    )
    force: bool = option(False, "take a day whose checks fail (the record says which)")
    epochs: int | None = option(
        None, "training's most epochs a day", unset="train's default", bounds=Range(1, 1_000_000)
    )
    max_steps: int | None = option(None, "training's most steps a day", unset="train's default", bounds=COUNT)
    seed: int | None = option(None, "training's seed", unset="train's default", bounds=SEED)
    fresh_rows: int = option(
        50_000,
        "while the newest whole days hold at most this many rows, a second candidate is trained from scratch on them "
        "(its preprocessing fitted afresh) beside the continued one, and the gate takes the better on the held-out "
        "rows; 0: only the continued candidate",
        bounds=Range(0, 10**12),
    )
    nproc_per_node: int = option(
        1, "train under torchrun with this many processes (hybrid parallel; 1: this process)", bounds=Range(1, 1024)
    )
    notify: str | None = option(
        None, "the URL of a running server (http://HOST:PORT) told to load the model after a version is published "
        "(the repository extension's load: `ctrkit serve`, Triton in EXPLICIT mode)", unset="none: servers poll",
    )  # fmt: skip
    rollback: bool = option(False, "serve the version published before the served one again (as the next version); "
                                   "no day files")  # fmt: skip
    no_progress: bool = option(False, "no progress bars")

    def validate(self) -> None:
        if self.rollback and self.days:
            raise ValueError("`rollback` takes no day files")
        if not self.rollback and not self.days:
            raise ValueError("no day files given: ctrkit refresh DAY_FILES... --repository R --name N (or --rollback)")


@dataclass(frozen=True)
class CheckConfig:
    """``ctrkit check``: a day's raw files against a model, as ``refresh`` checks them."""

    days: tuple[Path, ...] = option((), "the day's raw files (CSV, TSV or Parquet with a header)", positional=True,
                                    nargs="+")  # fmt: skip
    checkpoint: Path | None = option(None, "the model's checkpoint", exclusive="model", required=True)
    repository: Path | None = option(None, "a model repository refresh publishes to: its served version, its "
                                           "reference day and recent days", exclusive="model")  # fmt: skip
    name: str | None = option(None, "the model's name in --repository")
    state_dir: Path | None = option(None, "refresh's state directory of the model", unset="REPOSITORY.refresh/NAME")
    against: tuple[Path, ...] | None = option(
        None, "with --checkpoint: raw files of the reference day (the day the model last trained on)", nargs="+",
        unset="none: the checks that need no reference",
    )  # fmt: skip
    label: str | None = option(None, "the label column", unset="the model's")
    positive: str | None = option(None, "the label is 1 where the label column equals this value (as text)")
    label_threshold: float | None = option(
        None, "the label is 1 where the label column is at least this number", bounds=Range(-3.4e38, 3.4e38)
    )
    csv_separator: str = option(",", "the CSV field separator: one byte, or 'tab'")

    def validate(self) -> None:
        if self.repository is not None and not self.name:
            raise ValueError("`name`: give the model's name in --repository")
        if self.against and self.checkpoint is None:
            raise ValueError("`against` applies with --checkpoint (a repository has its own reference day)")
