"""A new day checked against what the served model knows, before anything is trained on it (TFX's ExampleValidator
against the schema and the previous span, TFDV's drift measures, on ctrkit's own parts).

A ``Profile`` is what a day's rows look like through a model's carried preprocessing: its rows and click rate, each
raw column's share of missing values, each categorical feature's share of values the vocabulary has not seen, each
number's shares between the reference day's deciles. ``check_day`` sets a new day's profile beside the reference
(the day the served model last trained on) and the served model's recent scores, and returns one ``Check`` a
measure: the figure, the threshold and whether it passed (a verdict carries its reason).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import polars as pl

from ctrkit.columns import Role
from ctrkit.preprocess.transform import RowTransform

DECILES = 10
PSI_FLOOR = 1e-4  # a bin's share below this counts as this in PSI (an empty bin would make it infinite)
SEEN_FLOOR = 0.1  # a feature whose recent days' seen share lay below this (ids new every day) is not judged on it


@dataclass(frozen=True)
class Thresholds:
    """When a day is refused (``refresh``'s and ``check``'s flags): a column's missing share risen by more than
    ``missing_rise`` over the reference day's; a categorical feature's share of rows whose value the model knows
    fallen below ``seen_kept`` of its recent days' (judged where that was at least ``SEEN_FLOOR``); a number's PSI on
    the reference deciles above ``psi``; the click rate more than ``ctr_ratio`` times (or below 1/``ctr_ratio`` of)
    the reference's; the served model's AUC on the day keeping less than ``lift_kept`` of its recent days' lift
    over 0.5 (a model that ranks the day's clicks no better than chance: shuffled or broken labels); fewer than
    ``min_rows`` rows, or no click or no non-click."""

    missing_rise: float = 0.3
    seen_kept: float = 0.5
    psi: float = 0.25
    ctr_ratio: float = 2.0
    lift_kept: float = 0.5
    min_rows: int = 100

    def validate(self) -> None:
        for flag, value in (("--max-missing-rise", self.missing_rise), ("--max-psi", self.psi)):
            if not 0 < value < math.inf:
                raise ValueError(f"`{flag}`: expected a finite positive number, got {value}")
        for flag, value in (("--min-seen-kept", self.seen_kept), ("--min-lift-kept", self.lift_kept)):
            if not 0 <= value <= 1:
                raise ValueError(f"`{flag}`: expected a share from 0 to 1, got {value}")
        if not 1 < self.ctr_ratio < math.inf:
            raise ValueError(f"`--max-ctr-ratio`: expected a finite number above 1, got {self.ctr_ratio}")
        if self.min_rows < 2:
            raise ValueError(f"`--min-rows`: expected an integer >= 2, got {self.min_rows}")


@dataclass(frozen=True)
class Check:
    """One measure of the day: ``name`` (what was measured, and of which column), the ``figure``, the
    ``reference`` it was set beside (None: none), the ``threshold`` it was held to and whether it ``passed``."""

    name: str
    figure: float | None
    reference: float | None
    threshold: str
    passed: bool

    def line(self) -> str:
        ref = "" if self.reference is None else f" (reference {self.reference:.4g})"
        figure = "-" if self.figure is None else f"{self.figure:.4g}"
        return f"{self.name}: {figure}{ref}, {self.threshold}: {'ok' if self.passed else 'FAILED'}"


@dataclass(frozen=True)
class Profile:
    """A day's rows through a model's preprocessing (see the module's docstring); ``cuts`` are each number's
    deciles on this day, ``shares`` its rows' shares between them (the reference's bins, for PSI)."""

    rows: int
    click_rate: float
    missing: dict[str, float]
    unseen: dict[str, float]
    cuts: dict[str, list[float]] = field(default_factory=dict)
    shares: dict[str, list[float]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> Profile:
        return cls(int(doc["rows"]), float(doc["click_rate"]), dict(doc["missing"]), dict(doc["unseen"]),
                   dict(doc.get("cuts", {})), dict(doc.get("shares", {})))  # fmt: skip


def _numbers(rows: pl.DataFrame, transform: RowTransform) -> dict[str, np.ndarray]:
    """Each numerical raw column's values that are numbers (float64), missing ones left out."""
    out = {}
    for c in transform.columns:
        if c.role == Role.NUMERICAL and c.name in rows.columns:
            values = rows[c.name].cast(pl.Float64, strict=False).drop_nulls().to_numpy()
            out[c.name] = values[np.isfinite(values)]
    return out


def _bin_shares(values: np.ndarray, cuts: Sequence[float]) -> list[float]:
    counts = np.bincount(np.searchsorted(np.asarray(cuts, np.float64), values, side="right"),
                         minlength=len(cuts) + 1)  # fmt: skip
    return (counts / max(1, len(values))).tolist()


class UnseenCount:
    """Counts, block by block of a day's rows through a model's preprocessing, the rows whose categorical value the
    vocabulary lacks (present, yet id 0) and the multi-hot values it lacks; ``shares`` once every row was added."""

    def __init__(self, transform: RowTransform):
        self.transform = transform
        self.rows = 0
        self.features = {f.feature: 0 for f in transform.categorical if f.ids == "vocabulary"}
        self.bags = {f.feature: [0, 0] for f in transform.multi_hot}

    def add(self, typed: pl.DataFrame, ids: np.ndarray, bags: np.ndarray | None) -> None:
        """A block: its raw columns as ``RowTransform.typed`` reads them, and its (B, F) ids and (B, Fm, L) bags."""
        self.rows += typed.height
        for j, f in enumerate(self.transform.categorical):
            if f.feature in self.features:
                present = typed[f.column].is_not_null().to_numpy()
                self.features[f.feature] += int(((ids[:, j] == 0) & present).sum())
        if bags is not None:
            for j, bag in enumerate(self.transform.multi_hot):
                values = bags[:, j, :]
                self.bags[bag.feature][0] += int((values == 0).sum())
                self.bags[bag.feature][1] += int((values >= 0).sum())

    def shares(self) -> dict[str, float]:
        out = {k: v / max(1, self.rows) for k, v in self.features.items()}
        out.update({k: u / t for k, (u, t) in self.bags.items() if t})
        return out


def typed_rows(rows: pl.DataFrame, transform: RowTransform) -> pl.DataFrame:
    """``rows``' columns the model reads, as it reads them (a column the rows lack: missing in every row)."""
    return transform.typed(rows.select([c for c in transform.column_names if c in rows.columns]), nulls_done=True)


def profile(rows: pl.DataFrame, labels: np.ndarray, transform: RowTransform, reference: Profile | None = None,
            unseen: dict[str, float] | None = None, block_rows: int = 1 << 16) -> Profile:  # fmt: skip
    """The ``Profile`` of raw ``rows`` (a log's columns as read) with 0/1 ``labels``, through ``transform``; a number's
    shares are taken on ``reference``'s cuts where given (else on this day's own deciles). The unseen shares are
    ``unseen`` where given (``UnseenCount``'s, counted while the rows were scored), else counted here. A column the
    model reads and the rows lack is missing in every row; a value the model cannot read is a ``RowError``."""
    n = rows.height
    typed = typed_rows(rows, transform)
    missing = {c: float(typed[c].null_count() / max(1, n)) for c in transform.column_names}
    if unseen is None:
        count = UnseenCount(transform)
        columns = [c for c in transform.column_names if c in rows.columns]
        for lo in range(0, n, block_rows):
            _, ids, bags = transform.raw_rows(rows[lo : lo + block_rows].select(columns))
            count.add(typed[lo : lo + block_rows], ids, bags)
        unseen = count.shares()
    cuts, shares = {}, {}
    for c, values in _numbers(rows, transform).items():
        if reference is not None and c in reference.cuts:
            cuts[c] = reference.cuts[c]
        else:
            qs = np.quantile(values, np.linspace(0, 1, DECILES + 1)[1:-1]) if len(values) else np.zeros(0)
            cuts[c] = sorted(set(float(q) for q in qs))
        shares[c] = _bin_shares(values, cuts[c])
    rate = float(labels.mean()) if len(labels) else 0.0
    return Profile(n, rate, missing, unseen, cuts, shares)


def psi(expected: Sequence[float], actual: Sequence[float]) -> float:
    """The population stability index of ``actual`` bin shares against ``expected``'s (each floored at
    ``PSI_FLOOR``)."""
    e = np.maximum(np.asarray(expected, np.float64), PSI_FLOOR)
    a = np.maximum(np.asarray(actual, np.float64), PSI_FLOOR)
    return float(np.sum((a - e) * np.log(a / e)))


def check_columns(columns: Sequence[str], transform: RowTransform, where: str) -> Check:
    """Every column the model reads is in the day (a renamed or dropped column fails, naming it)."""
    lacking = [c for c in transform.column_names if c not in columns]
    name = "columns" + (f" ({where} lacks {', '.join(lacking)})" if lacking else "")
    return Check(name, float(len(lacking)), None, "every column the model reads present", not lacking)


def check_day(
    day: Profile,
    reference: Profile | None,
    thresholds: Thresholds,
    served_auc: float | None = None,
    recent_aucs: Sequence[float] = (),
    recent_unseen: Mapping[str, Sequence[float]] | None = None,
) -> list[Check]:
    """The checks of a day's ``Profile`` against the ``reference`` day's (None: only those that need none), the
    served model's AUC on the day (``served_auc``) against its ``recent_aucs`` (the median; none: that check is
    left out), and each feature's seen share against its ``recent_unseen`` shares' (their median; none: that check
    is left out)."""
    t = thresholds
    checks = [Check("rows", float(day.rows), None, f">= {t.min_rows}", day.rows >= t.min_rows)]
    both = 0.0 < day.click_rate < 1.0
    ratio = None if reference is None or reference.click_rate <= 0 else day.click_rate / reference.click_rate
    free = ratio is None  # no reference rate to hold the day's to
    within = ratio is None or 1 / t.ctr_ratio <= ratio <= t.ctr_ratio
    said = "clicks and non-clicks both present" if free else f"within {t.ctr_ratio:g}x the reference"
    reference_rate = reference.click_rate if reference is not None else None
    checks.append(Check("click rate", day.click_rate, reference_rate, said, both and within))
    for c, share in day.missing.items():
        ref = reference.missing.get(c, 0.0) if reference is not None else 0.0
        if reference is None and share < 1.0:
            continue
        checks.append(Check(f"missing share of {c}", share, ref, f"at most {t.missing_rise:g} above the reference",
                            share - ref <= t.missing_rise))  # fmt: skip
    for f, share in day.unseen.items():
        recent = list((recent_unseen or {}).get(f, ()))
        if not recent:
            continue
        seen, ref = 1.0 - share, 1.0 - float(np.median(recent))
        if ref < SEEN_FLOOR:
            continue
        checks.append(Check(f"seen share of {f}", seen, ref, f"at least {t.seen_kept:g} of the recent days'",
                            seen >= t.seen_kept * ref))  # fmt: skip
    if reference is not None:
        for c, shares in day.shares.items():
            if c in reference.shares and len(reference.shares[c]) == len(shares):
                value = psi(reference.shares[c], shares)
                checks.append(Check(f"PSI of {c}", value, None, f"at most {t.psi:g}", value <= t.psi))
    if served_auc is not None and recent_aucs:
        ref = float(np.median(recent_aucs))
        floor = 0.5 + t.lift_kept * max(0.0, ref - 0.5)
        said = f"at least {floor:.4f} (keeps {t.lift_kept:g} of the recent days' lift over 0.5)"
        checks.append(Check("served model's AUC on the day", served_auc, ref, said, served_auc >= floor))
    return checks


def failed(checks: Sequence[Check]) -> list[Check]:
    return [c for c in checks if not c.passed]


def reason(checks: Sequence[Check]) -> str:
    """The failed checks in one line (the first three, and how many more)."""
    bad = failed(checks)
    said = "; ".join(c.line() for c in bad[:3])
    return said + (f"; and {len(bad) - 3} more" if len(bad) > 3 else "")


def table(checks: Sequence[Check]) -> str:
    """The checks as a text table: a row a check."""
    rows = [("check", "figure", "reference", "threshold", "verdict")]
    for c in checks:
        rows.append((c.name, "-" if c.figure is None else f"{c.figure:.4g}",
                     "-" if c.reference is None else f"{c.reference:.4g}", c.threshold,
                     "ok" if c.passed else "FAILED"))  # fmt: skip
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows)
