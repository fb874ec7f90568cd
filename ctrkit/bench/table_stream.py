"""Day by day on a drifting table of text columns (``ctrkit bench table-stream``): each day a CSV file as a log
holds it, preprocessed with ``preprocess table`` and trained three ways, each scored on the next day's raw rows as
``predict --input`` scores them.

* ``like``: day 1 preprocessed and trained; each later day preprocessed ``--like`` the previous day's model (its
  values keep their ids, new values get new ones) and trained ``--continue-from`` it (its tables grown).
* ``raw_ids``: every categorical column as raw 64-bit ids in dynamic tables (``--raw-ids``), continued day by day.
* ``retrain``: each day, the preprocessing fitted on days 1..k and a model trained from scratch on all of them.
* ``regression``: each day, the same preprocessing fitted on days 1..k and a logistic regression on their training
  rows (one-hot ids, standardised numbers, C chosen on their validation rows: ``eval.baselines.fit_logistic``), the
  next day's raw test rows encoded by the dataset's own transform. Not a default method: the baseline a continued
  model is held to (issue #94).

The days are ``synthetic_stream.DriftingStream``'s (ids born and fading every day, drifting effects), each id
written as text (its hexadecimal name), so every categorical column is an ordinary text column.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from ctrkit.data.synthetic_stream import MAPPINGS, DriftingStream
from ctrkit.metrics import log_loss_from_logits, roc_auc

METHODS = ("like", "raw_ids", "retrain", "regression")
DEFAULT_METHODS = ("like", "raw_ids", "retrain")
LABEL = "clicked"


def write_text_days(out: Path, days: int, rows: int, vocabularies: Sequence[int], seed: int = 0,
                    num_numerical: int = 4) -> list[Path]:  # fmt: skip
    """``days`` CSV files of ``rows`` rows each under ``out`` (``day_1.csv`` ...): text columns ``cat0``.. (each id's
    hexadecimal name), numbers ``num0``.., the label; the last 10% of each day's rows are its test rows."""
    model = DriftingStream(vocabularies, days, seed, num_numerical=num_numerical)
    rng = np.random.default_rng([seed, 58])
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for day in range(1, days + 1):
        numerical, ids, labels, _ = model.sample(day, rows, rng)
        text = {f"cat{f}": [f"{v & (2**64 - 1):x}" for v in ids[:, f].tolist()] for f in range(ids.shape[1])}
        numbers = [pl.Series(f"num{j}", numerical[:, j]) for j in range(numerical.shape[1])]
        frame = pl.DataFrame(text).with_columns(*numbers, pl.Series(LABEL, labels.astype(np.int64)))
        paths.append(out / f"day_{day}.csv")
        frame.write_csv(paths[-1])
    return paths


def _split() -> tuple[float, float]:
    """``preprocess table``'s test and validation fractions for the stream's shares (80/10/10)."""
    shares = dict(MAPPINGS)
    return shares["test"], shares["validation"] / (1 - shares["test"])


def _preprocess(files: Sequence[Path], out: Path, like: Path | None, raw_ids: Sequence[str], capacity: int | None
                ) -> None:  # fmt: skip
    """``preprocess table`` of ``files``: fitted (``raw_ids`` as raw ids in tables of ``capacity`` rows), or
    ``--like`` the checkpoint ``like``."""
    from ctrkit.checkpoint import load_checkpoint
    from ctrkit.preprocess.table import preprocess_table
    from ctrkit.preprocess.table_recipe import TableRecipe

    test, validation = _split()
    if like is not None:
        recipe = TableRecipe(label=LABEL)
        model = load_checkpoint(like, mmap=True, assemble=False).like(str(like))
    else:
        columns = pl.read_csv(files[0], n_rows=1).columns
        recipe = TableRecipe(label=LABEL, categorical=tuple(c for c in columns if c.startswith("cat")),
                             numerical=tuple(c for c in columns if c.startswith("num")), also_categorical=(),
                             raw_ids=tuple(raw_ids), capacity=capacity if raw_ids else None)  # fmt: skip
        model = None
    preprocess_table(files, out, recipe, test_fraction=test, validation_fraction=validation, overwrite=True,
                     like=model)  # fmt: skip


def _train(dataset: Path, checkpoint: Path, options: dict[str, Any], continue_from: Path | None = None) -> float:
    from ctrkit.train.run import train

    extra: dict[str, Any] = {"continue_from": continue_from} if continue_from is not None else {}
    started = time.perf_counter()
    train(dataset, progress=False, save_checkpoint=checkpoint, **options, **extra)
    return time.perf_counter() - started


def _test_rows(day: Path) -> pl.DataFrame:
    """The day's test rows (its last 10%), as text."""
    frame = pl.read_csv(day, infer_schema=False)
    return frame.tail(int(round(len(frame) * _split()[0])))


def _metrics(y: np.ndarray, logits: np.ndarray) -> dict[str, float]:
    return {"auc": round(roc_auc(y, logits), 5), "logloss": round(log_loss_from_logits(y, logits), 5)}


def _score(checkpoint: Path, day: Path, work: Path) -> dict[str, float]:
    """Next-day test AUC and log loss: the day's test rows scored from their raw values, as ``predict --input``
    scores them."""
    from ctrkit.serve.predictor import Predictor
    from ctrkit.serve.score_file import score_file

    test = _test_rows(day)
    test.drop(LABEL).write_csv(work / "next.csv")
    predictor = Predictor.from_checkpoint(checkpoint)
    if predictor.transform is None:
        raise ValueError(f"{checkpoint}: carries no preprocessing (its dataset was made by `preprocess table`)")
    score_file(predictor, predictor.transform, work / "next.csv", work / "scores.csv")
    p = np.clip(pl.read_csv(work / "scores.csv")["probability"].to_numpy().astype(np.float64), 1e-7, 1 - 1e-7)
    return _metrics(test[LABEL].cast(pl.Int64).to_numpy(), np.log(p / (1 - p)))


def _regression(dataset: Path, day: Path) -> dict[str, float]:
    """A logistic regression fitted on ``dataset``'s training rows (C chosen on its validation rows), scored on the
    next day's test rows encoded from their raw values by the dataset's transform."""
    from ctrkit.data.dataset import SplitBinaryDataset
    from ctrkit.data.feature_spec import FeatureSpec
    from ctrkit.eval.baselines import Table, fit_logistic, read_table
    from ctrkit.preprocess.transform import from_dataset

    spec = FeatureSpec.from_yaml(dataset)
    fitted = fit_logistic(
        read_table(SplitBinaryDataset(spec, "train")), read_table(SplitBinaryDataset(spec, "validation"))
    )
    transform = from_dataset(dataset)
    if transform is None:
        raise ValueError(f"{dataset}: no preprocessing record; expected a dataset of `preprocess table`")
    test = _test_rows(day)
    numerical, categorical, _ = transform.raw_rows(test.drop(LABEL))
    y = test[LABEL].cast(pl.Int64).to_numpy()
    return _metrics(y, fitted.logits(Table(numerical, categorical, [], y)))


def run_table_stream(days: Sequence[Path], work: Path, options: dict[str, Any],
                     methods: Sequence[str] = DEFAULT_METHODS, capacity: float = 1.5, log=print
                     ) -> list[dict[str, Any]]:  # fmt: skip
    """Trains on days 1..k and scores day k+1 for k = 1..N-1, each of ``methods``; one record a test day: per method,
    next-day AUC and log loss, the day's training seconds (preprocessing included) and the tables' rows. ``retrain`` and
    ``regression`` read one dataset of days 1..k (``all_k``), each counting its preprocessing."""
    from ctrkit.data.feature_spec import FeatureSpec

    work.mkdir(parents=True, exist_ok=True)
    categorical = [c for c in pl.read_csv(days[0], n_rows=1).columns if c.startswith("cat")]
    distinct = pl.read_csv(days[0], infer_schema=False).select(pl.col(categorical).n_unique()).row(0)
    rows = max(2, int(capacity * max(distinct)))  # each raw-id table: room for a day's ids and more
    _preprocess(days[:1], work / "warm", None, (), None)  # the process's first-run costs, outside every method's time
    _train(work / "warm", work / "warm.pt", {**options, "max_steps": 2})
    previous: dict[str, Path | None] = {m: None for m in methods}
    records = []
    for k in range(1, len(days)):
        row: dict[str, Any] = {"test_day": k + 1}
        fitted: tuple[Path, float] | None = None  # days 1..k preprocessed together, and its seconds (done once)
        for method in methods:
            data, ckpt = work / f"{method}_{k}", work / f"{method}_{k}.pt"
            started, before = time.perf_counter(), 0.0
            if method in ("retrain", "regression"):
                if fitted is None:
                    _preprocess(days[:k], work / f"all_{k}", None, (), None)
                    fitted = (work / f"all_{k}", time.perf_counter() - started)
                else:  # the other method's dataset, its seconds counted again
                    before = fitted[1]
                data = fitted[0]
            else:
                raw = categorical if method == "raw_ids" else ()
                _preprocess([days[k - 1]], data, previous[method], raw, rows)
            if method == "regression":
                scores = _regression(data, days[k])
            else:
                _train(data, ckpt, options, continue_from=None if method == "retrain" else previous[method])
                scores = _score(ckpt, days[k], work)
            seconds = before + time.perf_counter() - started
            spec = FeatureSpec.from_yaml(data)
            row[method] = {**scores, "train_seconds": round(seconds, 2),
                           "table_rows": int(sum(spec.cardinalities) + sum(spec.multi_hot_cardinalities))}  # fmt: skip
            previous[method] = ckpt
        records.append(row)
        log(" ".join(f"{m} AUC {row[m]['auc']:.4f}" for m in methods) + f" (test day {k + 1})")
    return records
