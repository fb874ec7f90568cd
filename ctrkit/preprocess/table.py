"""The table recipe: any CSV or Parquet table with a header, one row per impression, -> a dataset.

Column roles come from the recipe (label, categorical, numerical, multi-hot, dropped) and, for the
columns it does not name, from their type: text and booleans are categorical, floats numerical,
Parquet lists multi-hot. Integer columns must be named, because an integer may be an id or an
amount and only the user knows which. An unnamed first column (the row index pandas and R write) is
dropped.

* label: 0 or 1 (or true / false); ``positive`` makes it "equals this value", ``label_threshold``
  "at least this number" (a rating >= 4 as a click). A missing or other label is a bad row.
* categorical: values compared as text; ids as the Criteo recipe gives them: 0 missing or unseen in
  train, 1 seen fewer than ``frequency_threshold`` times in train, 2.. by descending train count
  (ties by value).
* multi-hot: text holding values separated by ``separator`` (or a Parquet list column); each value
  an id of the column's own vocabulary, counted over the train rows as above.
* numerical: float32 as given (the models standardise them, and log those that are heavy-tailed
  amounts); missing -> 0; a value that is not a number (or infinite) is a bad row.

Rows keep the files' order, which is taken as time order, or are sorted by ``order_by`` (stable), or
shuffled with ``shuffle_seed`` where the order means nothing; the test split is the last
``test_fraction`` of them, or the rows of ``test_files``; validation the last
``validation_fraction`` of train. The table is held in memory in Polars' columnar form, so memory
grows with the data, or (``engine="spark"``) in Apache Spark's parts, each step run in Spark's tasks
(``table_spark``); both engines run the steps of ``table_rows`` and write the same bytes.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from ctrkit.columns import Role
from ctrkit.data.atomic import atomic_directory, check_new_directory, check_output
from ctrkit.data.feature_spec import Feature, FeatureSpec, smallest_int_dtype
from ctrkit.data.spec_builders import split_binary_spec
from ctrkit.data.split_binary import SplitBinaryWriter
from ctrkit.integrity import vocabulary_fingerprint
from ctrkit.preprocess import vocabulary as vocab_mod
from ctrkit.preprocess.criteo import MISSING_ID, RARE_ID
from ctrkit.preprocess.like import Like
from ctrkit.preprocess.output import Rejects, split_bounds
from ctrkit.preprocess.pooling import DEFAULT as DEFAULT_COMBINER
from ctrkit.preprocess.pooling import Bags, PoolingTest, pooling_tests
from ctrkit.preprocess.table_recipe import (
    AUTO,
    FILE_COL,
    LINE_COL,
    RAW_PREFIX,
    TRAIN_VALIDATION_FRACTION,
    Derived,
    Roles,
    TableRecipe,
    assign_roles,
    label_values,
    number_problems,
)
from ctrkit.preprocess.table_rows import PolarsRows, Steps, feature_texts
from ctrkit.preprocess.transform import (
    CategoricalInput,
    Column,
    MultiHotInput,
    NumericalInput,
    RowTransform,
    write_record,
)
from ctrkit.preprocess.value_ids import MAX_FIT_ROWS, value_id_tests
from ctrkit.preprocess.values import timestamp_problem
from ctrkit.progress import tqdm


def _held_out(n_fit: int, n_train: int | None) -> tuple[int, int, int]:
    """The rows a preprocessing test fits on, [first, n_fit), and holds out, [n_fit, n_train): the validation rows,
    or, without a validation mapping (``n_train`` None), the tail of the training rows that ``train`` holds out by
    default (its ``validation_fraction``); at most ``value_ids.MAX_FIT_ROWS`` fitted, no more read."""
    if n_train is None:
        n_train = n_fit
        n_fit = n_train - int(round(n_train * TRAIN_VALIDATION_FRACTION))
    return max(0, n_fit - MAX_FIT_ROWS), n_fit, n_train


def _test_value_ids(
    rows, candidates: Sequence[str], categorical: Sequence[str], vocabularies: dict[str, pl.DataFrame], n_fit: int,
    n_train: int | None, frequency_threshold: int,
) -> dict:  # fmt: skip
    """``value_id_tests`` of the numerical ``candidates`` beside the ``categorical`` features: fitted on rows
    [0, n_fit) and held out on the validation rows [n_fit, n_train), or, without a validation mapping, on the tail
    of the training rows that ``train`` holds out by default (its ``validation_fraction``)."""
    first, n_fit, n_train = _held_out(n_fit, n_train)
    labels, numbers, by_value = rows.test_inputs(candidates, first, n_train)
    fit = n_fit - first
    numerical = {c: (x[:fit], x[fit:]) for c, x in numbers.items()}
    ids = [(by_value[:fit, j], by_value[fit:, j], vocab_mod.cardinality(vocabularies[c]))
           for j, c in enumerate(categorical)]  # fmt: skip
    return value_id_tests(numerical, ids, labels[:fit], labels[fit:], frequency_threshold)


def _test_pooling(
    rows, roles: Roles, cards: dict[str, int], raw_ids: Sequence[str], n_fit: int, n_train: int | None
) -> dict[str, PoolingTest]:
    """``pooling_tests`` of the multi-hot features, on the encoded rows fitted and held out as ``_held_out`` says;
    raw-id features (hashes, not rows of a vocabulary) are left out of model A."""
    first, n_fit, n_train = _held_out(n_fit, n_train)
    blocks = list(rows.blocks(first, n_train))
    fit = n_fit - first
    labels = np.concatenate([b.labels for b in blocks]).astype(np.float64)
    categorical = []
    for j, c in enumerate(roles.categorical):
        if c not in raw_ids:
            ids = np.concatenate([b.ids[j] for b in blocks]).astype(np.int64)
            categorical.append((ids[:fit], ids[fit:], cards[c]))
    numerical = []
    if roles.numerical:
        values = np.concatenate([b.numerical for b in blocks]).astype(np.float64)
        numerical = [(values[:fit, j], values[fit:, j]) for j in range(values.shape[1])]
    multi_hot = {}
    for j, c in enumerate(roles.multi_hot):
        ids = np.concatenate([b.multi_hot[j][0] for b in blocks]).astype(np.int64)
        lengths = np.concatenate([b.multi_hot[j][1] for b in blocks]).astype(np.int64)
        cut = int(lengths[:fit].sum())
        multi_hot[c] = (Bags(ids[:cut], lengths[:fit]), Bags(ids[cut:], lengths[fit:]), cards[c])
    return pooling_tests(categorical, numerical, multi_hot, labels[:fit], labels[fit:])


def _vocabulary(counts: pl.DataFrame, threshold: int) -> pl.DataFrame:
    """(value, count, id) of the fitting rows' text values counted (``counts``: value, count), ids as
    ``vocabulary.assign_ids`` gives them."""
    return vocab_mod.assign_ids(counts, threshold, "value").select("value", "count", "id")


def _fit(
    rows, features: Sequence[str], roles: Roles, schema: dict[str, pl.DataType], recipe: TableRecipe, n_fit: int
) -> dict[str, pl.DataFrame]:
    """The ``features``' vocabularies, counted over the rows [0, ``n_fit``) in the texts the transform looks up
    (``table_rows.feature_texts``)."""
    texts = partial(feature_texts, features=list(features), roles=roles, separator=recipe.separator)
    counts = rows.counts(features, n_fit, texts)
    return {c: _vocabulary(counts[c], recipe.frequency_threshold) for c in features}


def _dtype_name(dtype: pl.DataType) -> str:
    """The type a raw column was read as, as the carried preprocessing records it (``transform.RAW_TYPES``)."""
    if dtype.is_integer():
        return "Int64"
    if dtype.is_float():
        return "Float64"
    return "Boolean" if dtype == pl.Boolean else "String"


def _row_transform(
    schema: dict[str, pl.DataType], roles: Roles, recipe: TableRecipe, vocabularies: dict[str, pl.DataFrame]
) -> RowTransform:
    """What this recipe did to each column, for the model to carry (``preprocess/transform.py``): the raw columns
    with the types they were read as, and each feature's rule; numbers identified by value (``<column>_id``) come
    from their numerical column, parts of time (``<column>_<part>``) from their timestamp column."""
    derived = roles.derived_by_feature()
    columns = [Column(c, _dtype_name(schema[c]), Role.CATEGORICAL) for c in roles.categorical if c not in derived]
    columns += [Column(c, _dtype_name(schema[c]), Role.NUMERICAL) for c in roles.numerical]
    columns += [Column(c, "String", Role.MULTI_HOT) for c in roles.multi_hot]
    columns += [Column(c, _dtype_name(schema[c]), Role.TIME) for c in roles.time]
    columns.sort(key=lambda c: list(schema).index(c.name))  # as the table holds them
    ids = {c: "xxh64" if c in recipe.raw_ids else "vocabulary" for c in roles.categorical}
    categorical = [
        CategoricalInput(c, derived[c].column, derived[c].text, ids[c], derived[c].time_format) if c in derived
        else CategoricalInput(c, c, "as_read", ids[c])
        for c in roles.categorical
    ]  # fmt: skip
    vocab = {c: vocab_mod.vocabulary_frame(v["value"], v["id"]) for c, v in vocabularies.items()
             if c not in recipe.raw_ids}  # fmt: skip
    return RowTransform(
        "ctrkit preprocess table",
        columns,
        [NumericalInput(c, c) for c in roles.numerical],
        categorical,
        [MultiHotInput(c, c, recipe.separator) for c in roles.multi_hot],
        vocab,
        recipe.null_values,
        recipe.label,
    )


def preprocess_table(
    files: Sequence[str | os.PathLike],
    out_dir: str | os.PathLike,
    recipe: TableRecipe,
    test_files: Sequence[str | os.PathLike] | None = None,
    test_fraction: float | None = 0.1,
    validation_fraction: float | None = None,
    overwrite: bool = False,
    progress: bool = False,
    like: Like | None = None,
    engine: str = "polars",
    master: str = "local[*]",
    validation_files: Sequence[str | os.PathLike] | None = None,
) -> dict:
    """CSV or Parquet tables -> a split-binary dataset (train, optionally validation, test).

    Args:
        files: the training input, in order (``.parquet``/``.pq`` are Parquet, anything else CSV).
        out_dir: dataset directory to create; it appears only when complete.
        recipe: column roles and the recipe's parameters.
        test_files: files of the test split; if None, the last ``test_fraction`` of the rows is test.
        test_fraction: see ``test_files``.
        validation_fraction: the last fraction of the train rows becomes a ``validation`` mapping (not
            counted into the vocabularies); None: none (training then holds out its own tail).
        overwrite: replace an existing dataset directory.
        progress: show progress bars.
        like: write the table with a model's carried preprocessing, extended by the values it has not seen
            (``Like``), instead of fitting one.
        engine: "polars" holds the table in this process's memory; "spark" keeps it in Apache Spark's parts
            (``table_spark``: every file read, the fit counted and the transform applied in Spark's tasks), its
            scratch files beside ``out_dir``. Both write the same dataset, byte for byte.
        master: the Spark master URL for the spark engine (``local[*]``: every core of this machine).
        validation_files: files whose rows are the ``validation`` mapping (not counted into the vocabularies), with
            no test mapping: every other row is trained on (``refresh``'s day: its held-out tail).

    Returns:
        The summary also written to ``summary.json``: rows per mapping, bad rows, roles, cardinalities.

    Example:
        >>> recipe = TableRecipe(label="rating", label_threshold=4, categorical=("user", "item"))
        >>> preprocess_table(["ratings.csv"], "data/ratings", recipe)  # doctest: +SKIP
    """
    if like is not None:
        recipe = like.recipe(recipe)
    recipe.validate()
    if not files:
        raise ValueError("no input files given")
    if validation_files is not None and (test_files is not None or validation_fraction is not None):
        raise ValueError(
            "`validation_files` are the held-out rows: give no test files or validation fraction with them"
        )
    if validation_files is None and test_files is None and (test_fraction is None or not 0.0 < test_fraction < 1.0):
        raise ValueError(f"`test_fraction` must lie in (0, 1), got {test_fraction}")
    if validation_fraction is not None and not 0.0 < validation_fraction < 1.0:
        raise ValueError(f"`validation_fraction` must lie in (0, 1), got {validation_fraction}")
    paths = [Path(p) for p in files]
    held = validation_files if validation_files is not None else test_files
    all_paths = paths + ([Path(p) for p in held] if held is not None else [])
    check_output(Path(out_dir), all_paths)
    check_new_directory(Path(out_dir), overwrite)  # before the work, not after it
    start = time.perf_counter()
    rows = _rows(engine, master, Path(out_dir))
    held_out = "validation" if validation_files is not None else "test"
    try:
        return _preprocess(rows, paths, all_paths, Path(out_dir), recipe, test_fraction, validation_fraction,
                           overwrite, progress, like, start, held_out)  # fmt: skip
    finally:
        rows.close()


def _rows(engine: str, master: str, out_dir: Path):
    """The engine that holds the rows (``table_rows``): this process's memory, or Spark's parts (its scratch files
    beside ``out_dir``)."""
    if engine == "polars":
        return PolarsRows()
    if engine != "spark":
        raise ValueError(f"`engine`: expected polars or spark, got {engine!r}")
    from ctrkit.preprocess.table_spark import SparkRows

    return SparkRows(master, out_dir)


def _fit_transform(rows, roles: Roles, raw_schema: dict, recipe: TableRecipe, like: Like | None, n_fit: int,
                   progress: bool) -> tuple[dict[str, pl.DataFrame], RowTransform]:  # fmt: skip
    """The fit: each feature's vocabulary of the texts the transform looks up, counted over the first ``n_fit`` rows
    (extending the model's, ``like``), and the transform that holds them: the fitted object's, the only code that
    turns values into ids (as predict and serve do)."""
    features = list(roles.categorical + roles.multi_hot)
    with tqdm(total=1, desc="preprocess vocabularies", disable=not progress) as bar:
        vocabularies = _fit(rows, features, roles, raw_schema, recipe, n_fit)
        bar.update()
    if like is None:
        return vocabularies, _row_transform(raw_schema, roles, recipe, vocabularies)
    for c, old in like.transform.vocabularies.items():
        vocabularies[c] = vocab_mod.extend(old, vocabularies[c], recipe.frequency_threshold)
    t = like.transform
    grown = {c: vocab_mod.vocabulary_frame(v["value"], v["id"]) for c, v in vocabularies.items()
             if c in t.vocabularies}  # fmt: skip
    return vocabularies, RowTransform(t.source, t.columns, t.numerical, t.categorical, t.multi_hot, grown,
                                      t.null_values, t.label)  # fmt: skip


def _features(roles: Roles, cards: dict[str, int], recipe: TableRecipe, like: Like | None,
              combiners: dict[str, str]) -> dict[str, Feature]:  # fmt: skip
    """The dataset's categorical features: ids of ``cards`` values each, raw ids (the value's hash; the table's
    capacity, or the model's, as its cardinality) and multi-hot features pooled by ``combiners``."""
    features = {c: Feature(smallest_int_dtype(cards[c]), cards[c]) for c in roles.categorical}
    for c in recipe.raw_ids:
        rows_of = like.cardinalities[c] if like is not None else max(2, recipe.capacity or cards[c])
        features[c] = Feature("int64", rows_of, {"dynamic": True})
    for c in roles.multi_hot:
        features[c] = Feature(smallest_int_dtype(cards[c]), cards[c], {"multi_hot": True, "combiner": combiners[c]})
    return features


def _metadata(recipe: TableRecipe, vocabularies: dict[str, pl.DataFrame], like: Like | None) -> dict[str, Any]:
    """The feature spec's metadata: how the label was read, the id rule, the vocabularies' fingerprint and the one
    they extend."""
    fixed = {c: v for c, v in vocabularies.items() if c not in recipe.raw_ids}
    return {
        "preprocessed_by": "ctrkit preprocess table",
        "label": recipe.label,
        **({"positive": recipe.positive} if recipe.positive is not None else {}),
        **({"label_threshold": recipe.label_threshold} if recipe.label_threshold is not None else {}),
        "frequency_threshold": recipe.frequency_threshold,
        "missing_id": MISSING_ID,
        "rare_id": RARE_ID,
        **({"vocabulary_fingerprint": vocabulary_fingerprint(fixed)} if fixed else {}),
        **({"raw_ids": "XXH64 of the value's UTF-8 text, seed 0, as int64; missing: 0"} if recipe.raw_ids else {}),
        **({"extends_vocabulary": [like.fingerprint, *like.extends]} if like is not None and like.fingerprint else {}),
    }


def _layout(features: dict[str, Feature], roles: Roles, recipe: TableRecipe, bounds: list, metadata: dict,
            base_dir: Path) -> FeatureSpec:  # fmt: skip
    """The split-binary layout of the dataset in ``base_dir`` (``split_binary_spec``): its feature, source and channel
    specs and metadata; a group's ids stored for the held-out mappings."""
    group_spec = None
    if recipe.group is not None:
        group_spec = (recipe.group, Feature("int64"), [m for m, _, _ in bounds if m != "train"])
    base = split_binary_spec(features, roles.numerical, recipe.label, [m for m, _, _ in bounds], metadata,
                             numerical_dtype="float32", group=group_spec)  # fmt: skip
    return FeatureSpec(base.feature_spec, base.source_spec, base.channel_spec, base.metadata, base_dir)


def _write_rows(rows, spec: FeatureSpec, roles: Roles, bounds: list, progress: bool, base_dir: Path) -> dict[str, int]:
    """Each mapping's rows of ``bounds`` written as ``spec`` lays them out, and its feature_spec.yaml; the clicks
    of each mapping."""
    clicks = {}
    for mapping, lo, hi in bounds:
        steps_bar = tqdm(total=hi - lo, unit="row", desc=f"preprocess write {mapping}", disable=not progress)
        clicks[mapping] = 0
        with SplitBinaryWriter(spec, mapping) as writer, steps_bar:
            for block in rows.blocks(lo, hi):
                stored = block.groups if mapping != "train" else None
                writer.append(block.numerical if roles.numerical else None, block.ids, block.labels,
                              block.multi_hot or None, stored)  # fmt: skip
                clicks[mapping] += int(block.labels.sum())
                steps_bar.update(block.hi - block.lo)
    spec.to_yaml(base_dir / "feature_spec.yaml")
    return clicks


def _summary(bounds: list, rejects: Rejects, roles: Roles, recipe: TableRecipe, raw_schema: dict,
             transform: RowTransform, id_tests: dict, pooling: dict, combiners: dict[str, str], cards: dict[str, int],
             like: Like | None, clicks: dict[str, int], engine: str, start: float) -> dict[str, Any]:  # fmt: skip
    """``summary.json``: the rows of each mapping and the bad ones, the columns' roles, the tests' verdicts, the
    cardinalities (and the ids new to the model, ``like``), the clicks, the engine and the seconds."""
    return {
        "recipe": "table",
        **{f"{name}_rows": hi - lo for name, lo, hi in bounds},
        "bad_rows": rejects.count,
        "categorical": list(roles.categorical),
        "multi_hot": list(roles.multi_hot),
        "numerical": list(roles.numerical),
        "label": recipe.label,
        **({"order_by": recipe.order_by} if recipe.order_by else {}),
        **(
            {
                "time": {
                    c: {"format": f, "parts": [d.text for d in roles.derived if d.column == c]}
                    for c, f in roles.time.items()
                }
            }
            if roles.time
            else {}
        ),  # fmt: skip
        **({"group": recipe.group} if recipe.group else {}),
        "raw_ids": list(recipe.raw_ids),
        "dropped": [
            c
            for c in raw_schema
            if c not in (FILE_COL, LINE_COL)
            and c not in transform.column_names
            and c not in (recipe.label, recipe.order_by, recipe.group)
        ],
        **({"value_id_tests": {c: t.as_dict() for c, t in id_tests.items()}} if id_tests else {}),
        **({"pooling_tests": {c: t.as_dict() for c, t in pooling.items()}} if pooling else {}),
        **({"combiners": combiners} if combiners else {}),
        "cardinalities": cards,
        **(
            {
                "like": like.where,
                "new_ids": {
                    c: cards[c] - vocab_mod.cardinality(like.transform.vocabularies[c])
                    for c in like.transform.vocabularies
                },
            }
            if like is not None
            else {}
        ),
        "clicks": clicks,
        "engine": engine,
        "seconds": round(time.perf_counter() - start, 3),
    }


def _preprocess(
    rows, paths: list[Path], all_paths: list[Path], out_dir: Path, recipe: TableRecipe, test_fraction: float | None,
    validation_fraction: float | None, overwrite: bool, progress: bool, like: Like | None, start: float,
    held_out: str = "test",
) -> dict:  # fmt: skip
    """A dataset of ``rows`` (the engine's): the files read and their columns' roles given or found, the rows
    cleaned and split, the fit (``_fit_transform``), the rows encoded by the transform and the data's tests (values
    as ids, pooling), then the dataset written whole into ``out_dir``; returns its summary."""
    raw_schema = dict(rows.read(all_paths, len(paths), recipe, like.transform if like is not None else None))
    if like is None:
        roles = assign_roles(raw_schema, recipe, all_paths, rows.facts)
    else:  # the model's columns, read as the model reads them (as predict and the server do)
        roles = like.roles()

    rejects = Rejects(recipe.bad_rows)
    label_expr, label_problem = label_values(recipe)
    auto = recipe.also_categorical == AUTO
    candidates = [c for c in roles.numerical if f"{c}_id" not in raw_schema] if auto else []
    times = [timestamp_problem(pl.col(c), c, f) for c, f in roles.time.items()]
    problems = [label_problem, *number_problems(roles.numerical), *times]
    steps = Steps(pl.coalesce(problems), label_expr,
                  tuple(pl.col(c).cast(pl.Float64, strict=False).alias(RAW_PREFIX + c) for c in candidates),
                  recipe.order_by, recipe.shuffle_seed)  # fmt: skip
    total, n_train = rows.clean(steps, rejects, all_paths)
    if len(all_paths) == len(paths):  # no test files: the last fraction of the rows
        n_train = total - int(round(total * test_fraction))
    bounds = split_bounds(total, n_train, validation_fraction, held_out)
    n_fit = bounds[0][2]

    unknown = [c for c in recipe.raw_ids if c not in roles.categorical]
    if unknown:
        raise ValueError(f"`raw_ids`: '{unknown[0]}' is not a categorical column (categorical: "
                         f"{', '.join(roles.categorical)})")  # fmt: skip
    vocabularies, transform = _fit_transform(rows, roles, raw_schema, recipe, like, n_fit, progress)
    # the test reads raw-id columns by their vocabularies' ids, as it reads the others
    by_value = _row_transform(raw_schema, roles, replace(recipe, raw_ids=()), vocabularies) if (
        candidates and recipe.raw_ids) else None  # fmt: skip
    rows.encode(transform, by_value, recipe.group)
    id_tests = {}
    if candidates:
        id_tests = _test_value_ids(rows, candidates, roles.categorical, vocabularies, n_fit,
                                   n_train if validation_fraction else None, recipe.frequency_threshold)  # fmt: skip
        chosen = [Derived(f"{c}_id", c, "number") for c in candidates if id_tests[c].chosen]
        if chosen:
            roles = replace(roles, categorical=roles.categorical + tuple(d.feature for d in chosen),
                            derived=roles.derived + tuple(chosen))  # fmt: skip
            vocabularies.update(_fit(rows, [d.feature for d in chosen], roles, raw_schema, recipe, n_fit))
            transform = _row_transform(raw_schema, roles, recipe, vocabularies)
            rows.encode(transform, None, recipe.group)
    cards = {c: vocab_mod.cardinality(v) for c, v in vocabularies.items()}
    if like is not None:  # the model's pooling
        combiners = {c: like.combiners.get(c, DEFAULT_COMBINER) for c in roles.multi_hot}
        pooling = {}
    elif recipe.combiner == AUTO:
        pooling = _test_pooling(rows, roles, cards, recipe.raw_ids, n_fit, n_train if validation_fraction else None)
        combiners = {c: t.chosen for c, t in pooling.items()}
    else:
        combiners, pooling = dict.fromkeys(roles.multi_hot, recipe.combiner), {}
    features = _features(roles, cards, recipe, like, combiners)
    with atomic_directory(out_dir, overwrite) as tmp:
        spec = _layout(features, roles, recipe, bounds, _metadata(recipe, vocabularies, like), tmp)
        clicks = _write_rows(rows, spec, roles, bounds, progress, tmp)
        transform.check_features(spec.summary(), str(out_dir))
        write_record(tmp, transform, {c: c for c in transform.vocabularies})
        (tmp / "vocab").mkdir()
        for c, v in vocabularies.items():
            v.write_parquet(tmp / "vocab" / f"{c}.parquet")
        if rejects.kept:
            with open(tmp / "rejects.jsonl", "w") as f:
                for r in rejects.kept:
                    f.write(json.dumps({k: v for k, v in r.items() if k != "line"}) + "\n")
        summary = _summary(bounds, rejects, roles, recipe, raw_schema, transform, id_tests, pooling, combiners,
                           cards, like, clicks, rows.engine, start)  # fmt: skip
        (tmp / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary
