"""Day by day on a drifting stream (``ctrkit synth stream``): train on days 1..k, test on day k+1, three ways.

* ``fixed``: the vocabulary of day 1's training rows, the model trained once on day 1 (what a fixed vocabulary
  allows): later days' ids it never saw fall to the unseen row.
* ``retrain``: each day, a new vocabulary of days 1..k's training rows and a model trained from scratch on all of
  them (model selection on day k's validation).
* ``dynamic``: raw ids in dynamic tables, trained on day 1, then each day continued (``--continue-from``) on that
  day's rows only.

Each is scored on day k+1's test rows; the record holds test AUC and log loss, the training seconds and the rows of
the tables (the embedding rows and their bytes) per day.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ctrkit.data.dataset import SplitBinaryDataset
from ctrkit.data.feature_spec import Feature, FeatureSpec, smallest_int_dtype
from ctrkit.data.spec_builders import split_binary_spec
from ctrkit.data.split_binary import SplitBinaryWriter
from ctrkit.models.dynamic import lookup_sorted

METHODS = ("fixed", "retrain", "dynamic")
BLOCK = 1 << 18  # rows read and written at a time


def _rows(spec: FeatureSpec, mapping: str):
    """A mapping's rows in blocks: (numerical float32, raw ids int64, labels)."""
    data = SplitBinaryDataset(spec, mapping, check_ids=False)
    for start in range(0, len(data), BLOCK):
        b = data.slice(start, min(start + BLOCK, len(data)))
        yield b.numerical.numpy(), b.categorical.numpy(), b.labels.numpy().astype(np.int8)


def vocabularies(days: Sequence[Path]) -> list[np.ndarray]:
    """Each feature's sorted distinct raw ids over the training rows of ``days``."""
    seen: list[list[np.ndarray]] | None = None
    for day in days:
        for _, ids, _ in _rows(FeatureSpec.from_yaml(day), "train"):
            seen = seen or [[] for _ in range(ids.shape[1])]
            for f in range(ids.shape[1]):
                seen[f].append(np.unique(ids[:, f]))
    return [np.unique(np.concatenate(parts)) for parts in seen or []]


def _index(vocab: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Vocabulary indices 1..len(vocab) of ``ids``; 0 for ids not in it."""
    return lookup_sorted(vocab, np.arange(1, len(vocab) + 1), ids)


def with_vocabulary(vocab: list[np.ndarray], parts: dict[str, list[tuple[Path, str]]], out: Path) -> Path:
    """A dataset at ``out`` whose mappings (name -> [(day, mapping of that day)]) hold the days' rows with raw ids
    replaced by indices of ``vocab`` (tables of len + 1 rows, row 0 the unseen ids)."""
    first = FeatureSpec.from_yaml(next(iter(parts.values()))[0][0])
    cards = [len(v) + 1 for v in vocab]
    names = list(first.onehot_features)
    categorical = {n: Feature(smallest_int_dtype(c), c) for n, c in zip(names, cards)}
    spec = split_binary_spec(categorical, list(first.numerical_features), first.label_feature, list(parts),
                             numerical_dtype="float32")  # fmt: skip
    if out.exists():
        shutil.rmtree(out)
    spec = FeatureSpec(spec.feature_spec, spec.source_spec, spec.channel_spec, {}, out)
    for mapping, sources in parts.items():
        with SplitBinaryWriter(spec, mapping) as writer:
            for day, theirs in sources:
                for numerical, ids, labels in _rows(FeatureSpec.from_yaml(day), theirs):
                    mapped = np.stack([_index(vocab[f], ids[:, f]) for f in range(ids.shape[1])], 1)
                    writer.append(numerical, mapped, labels)
    spec.to_yaml(out / "feature_spec.yaml")
    return out


def _train(dataset: Path, checkpoint: Path, options: dict[str, Any], continue_from: Path | None = None) -> float:
    """Trains (in this process) and returns the seconds it took."""
    from ctrkit.train.run import train

    extra = {"continue_from": continue_from} if continue_from is not None else {}
    started = time.perf_counter()
    train(dataset, progress=False, save_checkpoint=checkpoint, **options, **extra)
    return time.perf_counter() - started


def _score(checkpoint: Path, dataset: Path) -> dict[str, float]:
    """Test AUC and log loss of a checkpoint's model on a dataset's test mapping."""
    import torch

    from ctrkit.calibration import calibrated
    from ctrkit.checkpoint import load_checkpoint
    from ctrkit.eval.evaluator import metrics_of, predict_logits

    ckpt = load_checkpoint(checkpoint)
    data = SplitBinaryDataset(FeatureSpec.from_yaml(dataset), "test", check_ids=False)
    logits = calibrated(predict_logits(ckpt.build_model(), data, torch.device("cpu")), ckpt.calibration)
    m = metrics_of(data, logits)
    return {"auc": round(m["auc"], 5), "logloss": round(m["logloss"], 5)}


def _tables(checkpoint: Path) -> dict[str, Any]:
    """The tables of a checkpoint's model: rows of the embedding tables, rows held by an id, and the MiB of the
    tables (deep and first-order) with the dynamic tables' id maps."""
    from ctrkit.checkpoint import load_checkpoint

    ckpt = load_checkpoint(checkpoint)
    rows = int(sum(ckpt.model_config["cardinalities"]))
    held = [v for k, v in ckpt.model.items() if k.startswith("dynamic_ids.held")]
    parts = ("embeddings.", "wide_embeddings.", "dynamic_ids.")
    size = sum(v.numel() * v.element_size() for k, v in ckpt.model.items() if k.startswith(parts))
    return {"table_rows": rows, "rows_held": int(sum(int(h.sum()) for h in held)) if held else rows,
            "table_mib": round(size / 2**20, 1)}  # fmt: skip


def run_stream(days: Sequence[Path], work: Path, options: dict[str, Any], methods: Sequence[str] = METHODS,
               log=print) -> list[dict[str, Any]]:  # fmt: skip
    """Trains on days 1..k and tests on day k+1 for k = 1..N-1, each of ``methods``; returns one record a test
    day: per method, test AUC and log loss, the day's training seconds and the table rows."""
    work.mkdir(parents=True, exist_ok=True)
    records: list[dict[str, Any]] = []
    fixed_vocab = vocabularies(days[:1]) if "fixed" in methods else None
    if fixed_vocab is not None:
        d1 = with_vocabulary(fixed_vocab, {"train": [(days[0], "train")], "validation": [(days[0], "validation")]},
                             work / "fixed_train")  # fmt: skip
        fixed_seconds = _train(d1, work / "fixed.pt", options)
    previous = None
    for k in range(1, len(days)):
        test_day = days[k]
        row: dict[str, Any] = {"test_day": k + 1}
        if "fixed" in methods:
            data = with_vocabulary(fixed_vocab, {"test": [(test_day, "test")]}, work / "fixed_test")
            seconds = fixed_seconds if k == 1 else 0.0  # trained once
            row["fixed"] = {**_score(work / "fixed.pt", data), "train_seconds": round(seconds, 2),
                            **_tables(work / "fixed.pt")}  # fmt: skip
        if "retrain" in methods:
            vocab = vocabularies(days[:k])
            data = with_vocabulary(vocab, {"train": [(d, "train") for d in days[:k]],
                                           "validation": [(days[k - 1], "validation")], "test": [(test_day, "test")]},
                                   work / "retrain")  # fmt: skip
            seconds = _train(data, work / "retrain.pt", options)
            row["retrain"] = {**_score(work / "retrain.pt", data), "train_seconds": round(seconds, 2),
                              **_tables(work / "retrain.pt")}  # fmt: skip
        if "dynamic" in methods:
            ckpt = work / f"dynamic_{k}.pt"
            seconds = _train(days[k - 1], ckpt, options, continue_from=previous)
            row["dynamic"] = {**_score(ckpt, test_day), "train_seconds": round(seconds, 2), **_tables(ckpt)}
            if previous is not None:
                previous.unlink()
            previous = ckpt
        records.append(row)
        log(" ".join(f"{m} AUC {row[m]['auc']:.4f}" for m in methods if m in row) + f" (test day {k + 1})")
    return records


def summary(records: list[dict[str, Any]], methods: Sequence[str] = METHODS) -> dict[str, Any]:
    """Mean test AUC and log loss of each method over the test days, and its cumulative training seconds."""
    out = {}
    for m in methods:
        rows = [r[m] for r in records if m in r]
        if rows:
            out[m] = {"mean_auc": round(float(np.mean([r["auc"] for r in rows])), 5),
                      "mean_logloss": round(float(np.mean([r["logloss"] for r in rows])), 5),
                      "train_seconds": round(float(sum(r["train_seconds"] for r in rows)), 2),
                      "most_table_rows": max(r.get("table_rows", 0) for r in rows),
                      "most_table_mib": max(r.get("table_mib", 0) for r in rows)}  # fmt: skip
    return out
