"""What every preprocessing engine writes, written one way: dataset, vocabularies, rejects, summary.

The directory appears only when complete (see ``atomic_directory``); engines keep their temporary
files in ``scratch`` inside it, which is removed before the rename.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack

import numpy as np
import polars as pl

from ctrkit.columns import Role
from ctrkit.data.atomic import atomic_directory
from ctrkit.data.feature_spec import Feature, FeatureSpec
from ctrkit.data.spec_builders import criteo_like_spec
from ctrkit.data.split_binary import DataError, SplitBinaryWriter
from ctrkit.integrity import vocabulary_fingerprint
from ctrkit.preprocess.criteo import CRITEO_SOURCE, MISSING_ID, RARE_ID, CriteoRecipe
from ctrkit.preprocess.transform import (
    CategoricalInput,
    Column,
    NumericalInput,
    RowTransform,
    write_record,
)
from ctrkit.preprocess.vocabulary import cardinality, save_vocabulary, vocabulary_frame

REJECTS_KEPT = 20
# how a raw-id column's values become ids (the spec's metadata says it)
RAW_ID_RULE = "key: int(value, 16) + (digits << 60), as int64 (exact for 1 to 15 hexadecimal digits); missing: 0"


class Rejects:
    """Bad rows: the first one raised (``error``) or all counted and the first 20 kept (``skip``)."""

    def __init__(self, policy: str):
        self.policy = policy
        self.count = 0
        self.kept: list[dict] = []

    def add(self, file: str, rows: Sequence[tuple[int, str, str]]) -> None:
        """Bad rows of ``file`` in line order, as (line_no, problem, raw line)."""
        if not rows:
            return
        if self.policy == "error":
            line_no, problem, _ = rows[0]
            raise DataError(f"{file}:{line_no}: {problem} (set `bad_rows` to skip to drop bad rows)")
        self.count += len(rows)
        for line_no, problem, line in rows[: max(0, REJECTS_KEPT - len(self.kept))]:
            self.kept.append({"file": file, "line_no": line_no, "problem": problem, "line": line})


def split_bounds(total: int, n_train: int, validation_fraction: float | None, held_out: str = "test"
                 ) -> list[tuple[str, int, int]]:  # fmt: skip
    """The mappings of ``total`` rows, the first ``n_train`` of them training, as (name, first row, end row):
    train, then (with ``validation_fraction``) the last fraction of the training rows as validation, then the rest
    as ``held_out`` (test, or validation where the held-out rows were given as such); each must hold at least one
    row."""
    n_fit = n_train - int(round(n_train * validation_fraction)) if validation_fraction else n_train
    bounds = [("train", 0, n_fit)] + ([("validation", n_fit, n_train)] if validation_fraction else [])
    bounds.append((held_out, n_train, total))
    if any(hi <= lo for _, lo, hi in bounds):
        sizes = ", ".join(f"{hi - lo} {name}" for name, lo, hi in bounds)
        raise ValueError(f"the split left {sizes} rows; each needs at least one")
    return bounds


def criteo_transform(recipe: CriteoRecipe, vocabularies: Sequence[pl.DataFrame]) -> RowTransform:
    """What the Criteo recipe does to a row, for the model to carry (``preprocess/transform.py``): columns I1..I13
    through log(max(x, -2) + 3), C1..C26 as lowercase hexadecimal values through their vocabularies (or as raw
    keys, for ``raw_ids``)."""
    numerical = [recipe.field_name(1 + i) for i in range(recipe.num_numerical)]
    cats = [recipe.field_name(i) for i in range(1 + recipe.num_numerical, recipe.num_fields)]
    raw = set(recipe.raw_ids)
    return RowTransform(
        CRITEO_SOURCE,
        [Column(c, "Int64", Role.NUMERICAL) for c in numerical] + [Column(c, "String", Role.CATEGORICAL) for c in cats],
        [NumericalInput(f"num_{i}", c, "criteo_log") for i, c in enumerate(numerical)],
        [CategoricalInput(f"cat_{i}.bin", c, "hex", "hex_key" if c in raw else "vocabulary")
         for i, c in enumerate(cats)],
        [],
        {f"cat_{i}.bin": vocabulary_frame(v["value"], v["id"]) for i, (c, v) in enumerate(zip(cats, vocabularies))
         if c not in raw},
        label="label",
        file_columns=[recipe.field_name(i) for i in range(recipe.num_fields)],
        file_separator="\t",
    )  # fmt: skip


class DatasetOutput:
    """The output directory of one preprocessing run; use as a context manager.

    Order of calls: ``split(...)`` → ``start(vocabularies)`` → ``append(...)`` per block, in row order
    → ``finish(...)``.
    """

    def __init__(self, out_dir: str | os.PathLike, recipe: CriteoRecipe, overwrite: bool, like=None):
        self.recipe = recipe
        self.like = like  # a model's ``preprocess.like.Like``: its raw-id tables' rows, the vocabularies extended
        self.cats = [recipe.field_name(i) for i in range(1 + recipe.num_numerical, recipe.num_fields)]
        self._atomic = atomic_directory(out_dir, overwrite)
        self._stack = ExitStack()
        self._writers: dict[str, SplitBinaryWriter] = {}

    def __enter__(self) -> DatasetOutput:
        self.dir = self._atomic.__enter__()
        self.scratch = self.dir / "scratch"
        return self

    def __exit__(self, *exc) -> bool | None:
        self._stack.close()
        shutil.rmtree(self.scratch, ignore_errors=True)
        return self._atomic.__exit__(*exc)

    def split(self, total: int, n_train: int, validation_fraction: float | None) -> list[tuple[str, int, int]]:
        """The mappings as (name, first row, end row): train, then (with ``validation_fraction``) the last
        fraction of the train rows as validation, then test; each must hold at least one row.

        Vocabularies are counted over the train mapping only, so validation scores ids as test does.
        """
        self.bounds = split_bounds(total, n_train, validation_fraction)
        return self.bounds

    def append_rows(self, first: int, numerical, ids: Sequence[np.ndarray], labels: np.ndarray) -> None:
        """Appends the block of rows ``first``.. to the mappings those rows belong to."""
        for name, lo, hi in self.bounds:
            a, b = max(lo - first, 0), min(hi - first, len(labels))
            if a < b:
                self.append(name, None if numerical is None else numerical[a:b], [i[a:b] for i in ids], labels[a:b])

    def start(self, vocabularies: Sequence[pl.DataFrame]) -> None:
        """Writes the spec and vocabularies and opens the split-binary writers."""
        raw = set(self.recipe.raw_ids)
        self.cardinalities = [
            (self.like.cardinalities[f"cat_{i}.bin"] if self.like is not None
             else max(2, self.recipe.capacity or cardinality(v))) if c in raw else cardinality(v)
            for i, (c, v) in enumerate(zip(self.cats, vocabularies))
        ]  # fmt: skip
        base = criteo_like_spec(self.cardinalities, self.recipe.num_numerical, [m for m, _, _ in self.bounds])
        features = dict(base.feature_spec)
        for i, c in enumerate(self.cats):
            if c in raw:  # the value's key as a raw id; the table's capacity as its cardinality
                features[f"cat_{i}.bin"] = Feature("int64", self.cardinalities[i], {"dynamic": True})
        fixed = {c: v for c, v in zip(self.cats, vocabularies) if c not in raw}
        meta = {
            "preprocessed_by": "ctrkit preprocess criteo",
            "frequency_threshold": self.recipe.frequency_threshold,
            "missing_id": MISSING_ID,
            "rare_id": RARE_ID,
            **({"vocabulary_fingerprint": vocabulary_fingerprint(fixed)} if fixed else {}),
            **({"raw_ids": RAW_ID_RULE} if raw else {}),
            **({"extends_vocabulary": [self.like.fingerprint, *self.like.extends]}
               if self.like is not None and self.like.fingerprint else {}),
        }  # fmt: skip
        self.spec = FeatureSpec(features, base.source_spec, base.channel_spec, meta, self.dir)
        self.spec.to_yaml(self.dir / "feature_spec.yaml")
        transform = criteo_transform(self.recipe, vocabularies)
        transform.check_features(self.spec.summary(), str(self.dir))
        write_record(self.dir, transform, {f"cat_{i}.bin": c for i, c in enumerate(self.cats) if c not in raw})
        (self.dir / "vocab").mkdir()
        with ThreadPoolExecutor(os.cpu_count() or 1) as pool:  # Parquet writes release the GIL
            list(
                pool.map(lambda c, v: save_vocabulary(v, self.dir / "vocab" / f"{c}.parquet"), self.cats, vocabularies)
            )
        self.cat_dtypes = [np.dtype(self.spec.feature_spec[c].dtype) for c in self.spec.onehot_features]
        for mapping, _, _ in self.bounds:
            self._writers[mapping] = self._stack.enter_context(SplitBinaryWriter(self.spec, mapping))

    def append(self, mapping: str, numerical: np.ndarray | None, ids: Sequence[np.ndarray], labels: np.ndarray
               ) -> None:  # fmt: skip
        self._writers[mapping].append(numerical if self.recipe.num_numerical else None, list(ids), labels)

    def finish(self, engine: str, rejects: Rejects, seconds: float) -> dict:
        """Closes the writers, writes ``rejects.jsonl`` (when any) and ``summary.json``; returns the summary."""
        self._stack.close()
        if rejects.kept:
            with open(self.dir / "rejects.jsonl", "w") as f:
                for r in rejects.kept:
                    f.write(json.dumps(r) + "\n")
        summary = {
            "engine": engine,
            **{f"{name}_rows": hi - lo for name, lo, hi in self.bounds},
            "bad_rows": rejects.count,
            "cardinalities": dict(zip(self.cats, self.cardinalities)),
            "frequency_threshold": self.recipe.frequency_threshold,
            "seconds": round(seconds, 3),
        }
        (self.dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        return summary
