"""Accuracy against baselines: every model with its defaults, logistic regression and LightGBM, on
exactly the same split and features of each data set of a panel.

Each model trains through the same code path as ``ctrkit train`` (``train/run.py``) with nothing but
the dataset given, so the table measures the defaults. The baselines fit the trainer's split: the
dataset's ``validation`` mapping, or the same held-out tail of ``train``; the test mapping is scored
once per method.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ctrkit.bench.panel import PanelEntry
from ctrkit.bench.peak import where_it_ran
from ctrkit.config import TrainConfig
from ctrkit.data.atomic import atomic_file
from ctrkit.data.dataset import SplitBinaryDataset, split_tail

BASELINES = ("logistic", "lightgbm", "reference")  # the reference: planted data sets only (``bench.reference``)
EPOCHS_TOLERANCE = 0.002  # the issue's: more epochs may not end worse than this
LABELS = {"logistic": "logistic regression", "lightgbm": "LightGBM", "reference": "planted form, fitted",
          "dlrm": "DLRM", "dcnv2": "DCNv2", "wide_deep": "Wide & Deep"}  # fmt: skip


def splits(path: Path, validation_fraction: float):
    """(train, validation, test) as the trainer sees them."""
    spec_train = SplitBinaryDataset(path, "train")
    test = SplitBinaryDataset(path, "test")
    if "validation" in spec_train.spec.source_spec:
        return spec_train, SplitBinaryDataset(path, "validation"), test
    head, tail = split_tail(spec_train, validation_fraction)
    return head, tail, test


@dataclass(frozen=True)
class Column:
    """One trained column of the table: a model with its defaults, or with a maximum of epochs, or in a named
    precision. Its ``key`` names its results (the model's name alone for the defaults, as the collected results
    read them); what the column is travels with its results as data (``model``, ``epochs``, ``precision``)."""

    model: str
    epochs: int | None = None
    precision: str | None = None

    @property
    def key(self) -> str:
        return self.model + (f"@{self.epochs}" if self.epochs is not None else "") + (
            f"/{self.precision}" if self.precision else "")  # fmt: skip

    @property
    def heading(self) -> str:
        details = ", ".join(d for d in (f"{self.epochs} ep." if self.epochs is not None else "", self.precision) if d)
        return LABELS[self.model] + (f" ({details})" if details else "")


def columns(
    models: Sequence[str], epochs: Sequence[int] | None = None, precisions: Sequence[str] | None = None
) -> list[Column]:
    """A column per model, maximum of epochs and precision given."""
    return [Column(m, e, p) for m in models for e in (epochs or (None,)) for p in (precisions or (None,))]


def run_entry(
    entry: PanelEntry,
    trained: Sequence[Column],
    baselines: Sequence[str] = BASELINES,
    done: Callable[[dict[str, Any]], None] | None = None,
    **train_options: Any,
) -> dict[str, Any]:
    """One row of the table: every baseline and every trained column (``columns``) on one data set. ``done`` is
    called with the row as it stands after each baseline and model (the panel writes its files then)."""
    from ctrkit.bench.reference import fitted_reference
    from ctrkit.eval.baselines import gradient_boosted_trees, logistic_regression
    from ctrkit.train.run import train

    fraction = train_options.get("validation_fraction", TrainConfig().validation_fraction)
    tr, va, te = splits(entry.path, fraction)
    rows = {"train": len(tr), "validation": len(va), "test": len(te)}
    row: dict[str, Any] = {"dataset": entry.name, "group": entry.group, "note": entry.note,
                           "bayes_auc": entry.bayes_auc, "observable_auc": entry.observable_auc, "rows": rows,
                           "precisions": list(dict.fromkeys(c.precision for c in trained if c.precision)),
                           "results": {}}  # fmt: skip  # the first precision: the one the others are set against
    fits: dict[str, Callable[..., dict[str, Any] | None]] = {
        "logistic": logistic_regression, "lightgbm": gradient_boosted_trees, "reference": fitted_reference}  # fmt: skip
    for name in baselines:
        result = fits[name](tr, va, te)
        if result is None:  # the reference, on a data set of no planted structure
            continue
        row["results"][name] = result
        if done is not None:
            done(row)
    for column in trained:
        start = time.perf_counter()
        torch.manual_seed(0)
        options = dict(train_options)
        if column.epochs is not None:
            options["epochs"] = column.epochs
        if column.precision is not None:
            options["precision"] = column.precision
        result = train(entry.path, model=column.model, progress=False, **options)
        fit = result.get("calibration") or {}
        row["results"][column.key] = {
            "model": column.model,
            "epochs": column.epochs,
            "precision": column.precision,
            "computed_in": result.get("precision"),  # what the run computed in (fp32 where the device lacks it)
            "auc": result["auc"],
            "logloss": result["logloss"],
            "validation_auc": result.get("validation", {}).get("auc"),
            "best_step": result["best_step"],
            "ensemble": result.get("ensemble"),
            "seed_ensemble": result.get("member_ensemble"),  # the seeds whose models' mean was kept
            "batch_size": result.get("batch_size"),  # ... and their batch (--small-batch: the one kept)
            "single_auc": result.get("single", {}).get("auc"),  # the best single model's, beside an ensemble's
            "calibration": fit["scale"] if fit.get("applied") else None,  # the logit scale kept (--calibrate)
            "steps": result["step"],
            "seconds": time.perf_counter() - start,
        }
        if done is not None:
            done(row)
    return row


def markdown(rows: list[dict[str, Any]], methods: Sequence[str], headings: dict[str, str]) -> str:
    """The table: test AUC (log loss) per data set and method (``methods``' keys, under ``headings``), the best
    model in bold."""
    head = "| data set | train / validation / test | Bayes AUC | " + " | ".join(headings[m] for m in methods) + " |"
    lines = [head, "| --- | --- | ---: | " + " | ".join("---:" for _ in methods) + " |"]
    for row in rows:
        res = row["results"]
        best = max((m for m in methods if "model" in res.get(m, {})), key=lambda m: res[m]["auc"], default=None)
        cells = []
        for m in methods:
            if m not in res:
                cells.append("")
                continue
            text = f"{res[m]['auc']:.4f} ({res[m]['logloss']:.4f})"
            cells.append(f"**{text}**" if m == best else text)
        r = row["rows"]
        bayes = f"{row['bayes_auc']:.4f}" if row.get("bayes_auc") else ""
        lines.append(f"| {row['dataset']} | {r['train']:,} / {r['validation']:,} / {r['test']:,} | {bayes} | "
                     + " | ".join(cells) + " |")  # fmt: skip
    return "\n".join(lines) + "\n"


def targets(rows: list[dict[str, Any]]) -> list[str]:
    """The issue's targets, checked per row: every model >= logistic regression, the best model >=
    LightGBM, on planted data the share of the gap from logistic regression to Bayes closed (and to the best
    any model of the columns can reach, where the data set records it), and with
    several epoch maxima, the most epochs never worse than the fewest by more than 0.002 test AUC. With several
    precisions, each one's test AUC, log loss and time against the first's (what a default precision is decided
    on). Then, per group of data sets drawn with two or more seeds, each model against logistic regression over
    the seeds (``across_seeds``)."""
    out = []
    for row in rows:
        res = row["results"]
        trained = {k: r for k, r in res.items() if "model" in r}  # the baselines' results name no model
        if not trained:
            continue
        best = max(r["auc"] for r in trained.values())
        if "logistic" in res:
            below = [k for k, r in trained.items() if r["auc"] < res["logistic"]["auc"]]
            out.append(f"{row['dataset']}: every model >= logistic regression: "
                       + ("yes" if not below else f"no ({', '.join(below)})"))  # fmt: skip
        if "lightgbm" in res:
            out.append(f"{row['dataset']}: best model >= LightGBM: {'yes' if best >= res['lightgbm']['auc'] else 'no'}")
        for bound, what in (("bayes_auc", "Bayes"), ("observable_auc", "the best any model of the columns can reach")):
            if row.get(bound) and "logistic" in res:
                closed = (best - res["logistic"]["auc"]) / (row[bound] - res["logistic"]["auc"])
                out.append(f"{row['dataset']}: gap to {what} closed: {closed:.0%}")
        if "reference" in res and "logistic" in res:  # the reachable target: each model's share of this gap
            gap = res["reference"]["auc"] - res["logistic"]["auc"]
            shares = ", ".join(f"{LABELS[r['model']]} {(r['auc'] - res['logistic']['auc']) / gap:.0%}"
                               for r in trained.values())  # fmt: skip
            out.append(f"{row['dataset']}: share of the logistic regression -> fitted planted form gap "
                       f"({res['logistic']['auc']:.4f} -> {res['reference']['auc']:.4f}): {shares}")  # fmt: skip
        for (model, precision), runs in _grouped(trained, "epochs", "precision").items():
            if len(runs) > 1:
                few, most = min(runs, key=lambda r: r["epochs"]), max(runs, key=lambda r: r["epochs"])
                ok = "yes" if most["auc"] >= few["auc"] - EPOCHS_TOLERANCE else "no"
                out.append(f"{row['dataset']}: {LABELS[model]}{f' ({precision})' if precision else ''} with "
                           f"{most['epochs']} epochs >= with {few['epochs']} - {EPOCHS_TOLERANCE}: {ok} "
                           f"({most['auc']:.4f} vs {few['auc']:.4f})")  # fmt: skip
        for (model, epochs), runs in _grouped(trained, "precision", "epochs").items():
            first = runs[0]
            for other in runs[1:]:
                out.append(f"{row['dataset']}: {LABELS[model]}{f' ({epochs} ep.)' if epochs else ''} in "
                           f"{other['precision']} against {first['precision']}: test AUC "
                           f"{other['auc'] - first['auc']:+.4f}, log loss {other['logloss'] - first['logloss']:+.4f}, "
                           f"time x{other['seconds'] / first['seconds']:.2f}")  # fmt: skip
    return out + across_seeds(rows)


def across_seeds(rows: list[dict[str, Any]]) -> list[str]:
    """Per ``group`` of rows (a generated family at one size) with two or more seeds: each trained column's test AUC
    minus logistic regression's on each seed, as their median, the seeds where it is below and their standard
    deviation over the data seeds (not ``bench ablation``'s seed spread, a range over training seeds). The target,
    every model at or above the regression within the seed spread, reads as a median difference of at least 0."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        if row.get("group") and "logistic" in row["results"]:
            groups.setdefault(row["group"], []).append(row)
    out = []
    for group, members in groups.items():
        columns = {k: r for row in members for k, r in row["results"].items() if "model" in r}
        for key, r in columns.items():
            diffs = [m["results"][key]["auc"] - m["results"]["logistic"]["auc"] for m in members if key in m["results"]]
            if len(diffs) < 2:
                continue
            median = statistics.median(diffs)
            out.append(f"{group}, {len(diffs)} seeds: {Column(r['model'], r['epochs'], r['precision']).heading} - "
                       f"logistic regression: median {median:+.4f}, below on {sum(d < 0 for d in diffs)}, "
                       f"sd over the data seeds {statistics.stdev(diffs):.4f}; median >= 0: "
                       f"{'yes' if median >= 0 else 'no'}")  # fmt: skip
    return out


def _grouped(trained: dict[str, dict], varied: str, kept: str) -> dict[tuple, list[dict]]:
    """The trained columns' results by (model, ``kept``), in the panel's order, where ``varied`` was given: runs of
    one model that differ only in ``varied``."""
    groups: dict[tuple, list[dict]] = {}
    for r in trained.values():
        if r.get(varied) is not None:
            groups.setdefault((r["model"], r.get(kept)), []).append(r)
    return groups


def write_results(
    rows: list[dict[str, Any]], methods: Sequence[str], headings: dict[str, str], out_dir: Path, extra: dict
) -> Path:
    """``results.json`` and ``results.md`` in ``out_dir``, each replaced whole (the panel writes them after each
    baseline and model: a panel stopped part way keeps every run it finished)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    doc = {**where_it_ran(), "rows": rows, **extra}
    text = markdown(rows, methods, headings) + "\n" + "\n".join(f"- {t}" for t in targets(rows)) + "\n"
    for name, content in (("results.json", json.dumps(doc, indent=2, sort_keys=True, default=float) + "\n"),
                          ("results.md", text)):  # fmt: skip
        with atomic_file(out_dir / name) as tmp:
            tmp.write_text(content)
    return out_dir / "results.md"
