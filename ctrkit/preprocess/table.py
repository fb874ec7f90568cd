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
grows with the data (the Criteo recipe streams; this one trades that for generality).
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import polars as pl
from tqdm import tqdm

from ctrkit.config import TrainConfig
from ctrkit.data.atomic import atomic_directory
from ctrkit.data.feature_spec import Feature, FeatureSpec, smallest_int_dtype, split_binary_spec
from ctrkit.data.split_binary import SplitBinaryWriter
from ctrkit.preprocess import vocabulary as vocab_mod
from ctrkit.preprocess.criteo import BAD_ROW_POLICIES, MISSING_ID, RARE_ID
from ctrkit.preprocess.output import Rejects, split_bounds
from ctrkit.preprocess.value_ids import value_id_tests

_TRAIN_VALIDATION_FRACTION = TrainConfig().validation_fraction  # the tail `train` holds out by default
FILE_COL, LINE_COL = "__ctrkit_file", "__ctrkit_line"  # where each row came from, for error messages
NUMERIC_TEXT_FRACTION = 0.9  # a text column this often numeric is refused unless named
WRITE_ROWS = 1 << 18  # rows per block written
DEFAULT_NULL_VALUES = ("NA", "NaN", "nan", "null", "NULL")
INTEGER_ROLES = ("error", "categorical", "numerical")
RESERVED = ("label", "numerical")  # the dataset's own file names
AUTO = "auto"  # TableRecipe.also_categorical: chosen by the held-out test of ``value_ids``
RAW_PREFIX = "__ctrkit_raw_"  # a numerical column as Float64 with its nulls, for the ids ``auto`` adds
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")  # a feature name is also a file name


@dataclass(frozen=True)
class TableRecipe:
    """What the columns are and how categories get ids.

    Attributes:
        label: the label column.
        categorical, numerical, multi_hot: columns of each role; columns named nowhere get a role by type.
        drop: columns to leave out.
        also_categorical: numerical columns that are also categorical features, ``<column>_id``: each exact
            value an id (for numbers that identify something: repeated amounts of one household, codes);
            "auto" (the default): the numerical columns whose exact values predict the label in held-out
            training rows beyond the table's other columns and 16 quantile buckets (``value_ids``); () for
            none.
        positive: the label is 1 where the label column equals this value (as text), else 0.
        label_threshold: the label is 1 where the label column is at least this number, else 0.
        separator: what separates the values of a multi-hot text column.
        frequency_threshold: values seen fewer times in the train rows share the rare id 1.
        order_by: sort the rows by this column (stable) before splitting; it is not a feature unless named.
        integers: the role of integer columns named nowhere: "error" (refused: an integer may be an id
            or an amount), "categorical" or "numerical".
        group: the column whose equal values are ranked together (a display or session id): stored as the
            ``map`` channel of the validation and test mappings, for MAP@12; not a feature.
        shuffle_seed: shuffle the rows with this seed before splitting (data without a time order).
        null_values: texts read as missing (besides the empty field), CSV only.
        csv_separator: the CSV field separator.
        bad_rows: "error" (stop at the first bad row, naming file and line) or "skip" (drop and count).
    """

    label: str
    categorical: tuple[str, ...] = ()
    numerical: tuple[str, ...] = ()
    multi_hot: tuple[str, ...] = ()
    drop: tuple[str, ...] = ()
    also_categorical: tuple[str, ...] | str = AUTO
    positive: str | None = None
    label_threshold: float | None = None
    separator: str = "|"
    frequency_threshold: int = 3
    order_by: str | None = None
    group: str | None = None
    integers: str = "error"
    shuffle_seed: int | None = None
    null_values: tuple[str, ...] = DEFAULT_NULL_VALUES
    csv_separator: str = ","
    bad_rows: str = "error"

    def validate(self) -> None:
        if not self.label:
            raise ValueError("`label`: name the label column")
        if self.positive is not None and self.label_threshold is not None:
            raise ValueError("give at most one of `positive` and `label_threshold`")
        if self.order_by is not None and self.shuffle_seed is not None:
            raise ValueError("give at most one of `order_by` and `shuffle_seed`")
        if isinstance(self.also_categorical, str) and self.also_categorical != AUTO:
            raise ValueError(f"`also_categorical`: expected columns or '{AUTO}', got {self.also_categorical!r}")
        if self.frequency_threshold < 1:
            raise ValueError(f"`frequency_threshold` must be >= 1, got {self.frequency_threshold}")
        if not self.separator:
            raise ValueError("`separator` must not be empty")
        if len(field_separator(self.csv_separator).encode()) != 1:
            raise ValueError(f"`csv_separator` must be one byte (or '\\t' or 'tab'), got {self.csv_separator!r}")
        if self.integers not in INTEGER_ROLES:
            raise ValueError(f"`integers` must be one of {', '.join(INTEGER_ROLES)}, got {self.integers!r}")
        if self.bad_rows not in BAD_ROW_POLICIES:
            raise ValueError(f"`bad_rows` must be one of {', '.join(BAD_ROW_POLICIES)}, got {self.bad_rows!r}")
        roles = [("label", (self.label,)), ("categorical", self.categorical), ("numerical", self.numerical),
                 ("multi_hot", self.multi_hot), ("drop", self.drop),
                 ("group", (self.group,) if self.group else ())]  # fmt: skip
        seen: dict[str, str] = {}
        for role, names in roles:
            for name in names:
                if name in seen:
                    raise ValueError(f"column '{name}' is given two roles: `{seen[name]}` and `{role}`")
                seen[name] = role


def field_separator(text: str) -> str:
    """The CSV field separator ``text`` names: one character, or ``\\t`` / ``tab`` for a tab (as a shell passes it)."""
    return {"\\t": "\t", "tab": "\t"}.get(text, text)


def _read(path: Path, recipe: TableRecipe, file_index: int) -> pl.DataFrame:
    """One input file, with the file index and the line (CSV, header = line 1) or row (Parquet) of each row."""
    if not path.exists():
        raise ValueError(f"{path}: input file not found")
    if path.is_dir():
        raise ValueError(f"{path}: is a directory; expected a CSV or Parquet file")
    parquet = path.name.lower().endswith((".parquet", ".pq"))
    try:
        if parquet:
            df = pl.read_parquet(path)
        else:
            df = pl.read_csv(
                path,
                separator=field_separator(recipe.csv_separator),
                null_values=list(recipe.null_values),
                infer_schema_length=None,  # the whole file: a text value late in a column makes it text
            )
    except (pl.exceptions.PolarsError, OSError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"{path}: cannot be read as {'Parquet' if parquet else 'CSV'}: {first}") from None
    if not len(df.columns) or not len(df):
        raise ValueError(f"{path}: holds no rows")
    if df.columns[0] == "":  # the unnamed row index pandas and R write
        df = df.drop("")
    first_line = 1 if parquet else 2
    return df.with_columns(
        pl.lit(file_index, pl.Int32).alias(FILE_COL),
        pl.int_range(first_line, first_line + len(df), dtype=pl.Int64).alias(LINE_COL),
    )


def _read_all(paths: Sequence[Path], recipe: TableRecipe, offset: int) -> pl.DataFrame:
    frames = [_read(p, recipe, offset + i) for i, p in enumerate(paths)]
    for p, f in zip(paths[1:], frames[1:]):
        if set(f.columns) != set(frames[0].columns):
            missing = sorted(set(frames[0].columns) - set(f.columns))
            extra = sorted(set(f.columns) - set(frames[0].columns))
            raise ValueError(f"{p}: columns differ from {paths[0]}'s (missing {missing}, extra {extra})")
    try:
        return pl.concat([f.select(frames[0].columns) for f in frames], how="vertical_relaxed")
    except pl.exceptions.PolarsError as e:
        raise ValueError(f"{paths[0]}..: the files' column types do not agree: {str(e).splitlines()[0]}") from None


@dataclass(frozen=True)
class Roles:
    """The columns of each role: the named ones in the order given, then the others in table order (integer
    columns, under `integers`, last)."""

    categorical: tuple[str, ...]
    numerical: tuple[str, ...]
    multi_hot: tuple[str, ...]


def assign_roles(df: pl.DataFrame, recipe: TableRecipe, where: Path) -> Roles:
    """Checks that every named column exists and gives the others a role by their type."""
    columns = [c for c in df.columns if c not in (FILE_COL, LINE_COL)]
    named = {"label": (recipe.label,), "categorical": recipe.categorical, "numerical": recipe.numerical,
             "multi_hot": recipe.multi_hot, "drop": recipe.drop,
             "order_by": (recipe.order_by,) if recipe.order_by else (),
             "group": (recipe.group,) if recipe.group else ()}  # fmt: skip
    for role, names in named.items():
        for name in names:
            if name not in columns:
                raise ValueError(f"`{role}`: {where} has no column '{name}' (columns: {', '.join(columns)})")
    taken = {n for names in named.values() for n in names}
    cats, nums, multi = list(recipe.categorical), list(recipe.numerical), list(recipe.multi_hot)
    integers = []
    for c in columns:
        if c in taken:
            continue
        dtype = df.schema[c]
        if dtype == pl.String:
            _check_not_numbers(df, c, where)
            cats.append(c)
        elif dtype in (pl.Boolean, pl.Categorical) or isinstance(dtype, pl.Enum):
            cats.append(c)
        elif dtype.is_float():
            nums.append(c)
        elif isinstance(dtype, pl.List):
            multi.append(c)
        elif dtype.is_integer():
            integers.append(c)
        elif df[c].null_count() == len(df):
            continue  # an empty column carries nothing
        else:
            raise ValueError(f"{where}: column '{c}' holds {dtype}: give it a role (`drop` it, or `order_by` it)")
    if recipe.integers == "categorical":
        cats += integers
    elif recipe.integers == "numerical":
        nums += integers
    elif integers:
        raise ValueError(
            f"{where}: columns {', '.join(repr(c) for c in integers)} hold integers; name each in `categorical` "
            "(ids, codes) or `numerical` (amounts, counts), or `drop` it (`integers` gives all of them one role)"
        )
    for c in cats + nums + multi + ([recipe.group] if recipe.group else []):
        if not _NAME.match(c) or c in RESERVED or c.endswith(".offsets"):
            raise ValueError(
                f"column '{c}': a feature name must be letters, digits, '_', '.' or '-', and not "
                f"{' or '.join(RESERVED)} or end with '.offsets' (it names a file); rename the column"
            )
    for c in () if recipe.also_categorical == AUTO else recipe.also_categorical:
        if c not in nums:
            raise ValueError(f"`also_categorical`: '{c}' is not a numerical column (numerical: {', '.join(nums)})")
        if f"{c}_id" in columns:
            raise ValueError(f"`also_categorical`: '{c}_id' is a column already; rename it")
        cats.append(f"{c}_id")
    if not cats and not multi:
        raise ValueError(f"{where}: no categorical column; the models need at least one")
    return Roles(tuple(cats), tuple(nums), tuple(multi))


def _check_not_numbers(df: pl.DataFrame, column: str, where: Path) -> None:
    """Refuses a text column whose values are nearly all numbers: a numerical column with a few bad values,
    which taken as categorical would silently give every number its own id."""
    values = df.select(pl.col(column), pl.col(LINE_COL)).drop_nulls(column)
    numbers = values[column].cast(pl.Float64, strict=False)
    if len(values) and numbers.is_not_null().mean() >= NUMERIC_TEXT_FRACTION:
        line, value = values.filter(numbers.is_null()).row(0)[::-1]
        raise ValueError(
            f"{where}:{line}: column '{column}' holds text, but {numbers.is_not_null().sum():,} of its "
            f"{len(values):,} values are numbers (here '{value}'): name it in `numerical` (its other values then "
            "are bad rows) or in `categorical`"
        )


def _labels(recipe: TableRecipe) -> tuple[pl.Expr, pl.Expr]:
    """The label as 0/1 and the problem of each row whose label is not one (null where fine)."""
    col = pl.col(recipe.label)
    name = recipe.label
    if recipe.positive is not None:
        label = col.cast(pl.String) == recipe.positive
        problem = pl.when(col.is_null()).then(pl.lit(f"{name}: missing label"))
        return label, problem
    if recipe.label_threshold is not None:
        number = col.cast(pl.Float64, strict=False)
        problem = (
            pl.when(col.is_null())
            .then(pl.lit(f"{name}: missing label"))
            .when(number.is_null())
            .then(pl.format(f"{name}: '{{}}' is not a number (label_threshold compares numbers)", col.cast(pl.String)))
        )
        return number >= recipe.label_threshold, problem
    text = col.cast(pl.String).str.to_lowercase()
    ones, zeros = ["1", "1.0", "true"], ["0", "0.0", "false"]
    problem = (
        pl.when(col.is_null())
        .then(pl.lit(f"{name}: missing label"))
        .when(~text.is_in(ones + zeros))
        .then(
            pl.format(
                f"{name}: expected a label of 0 or 1, got '{{}}' (`positive` or `label_threshold` turn other values "
                "into clicks)",
                col.cast(pl.String),
            )
        )
    )
    return text.is_in(ones), problem


def _numbers(names: Sequence[str]) -> tuple[list[pl.Expr], list[pl.Expr]]:
    """Each numerical column as Float64 (missing -> 0) and the problems: text that is no number, infinity."""
    values, problems = [], []
    for n in names:
        col = pl.col(n)
        number = col.cast(pl.Float64, strict=False)
        problems.append(
            pl.when(col.is_not_null() & number.is_null())
            .then(pl.format(f"{n}: '{{}}' is not a number", col.cast(pl.String)))
            .when(number.is_infinite())
            .then(pl.format(f"{n}: {{}} is not finite", number))
        )
        values.append(number.fill_nan(None).fill_null(0.0).alias(n))
    return values, problems


def _test_value_ids(
    table: pl.DataFrame, columns: Sequence[str], ids: dict[str, np.ndarray], vocabularies: dict[str, pl.DataFrame],
    n_fit: int, n_train: int | None, frequency_threshold: int,
) -> dict:  # fmt: skip
    """``value_id_tests`` of ``columns`` beside the categorical features ``ids``: fitted on rows [0, n_fit)
    and held out on the validation rows [n_fit, n_train), or, without a validation mapping, on the tail of
    the training rows that ``train`` holds out by default (its ``validation_fraction``)."""
    if n_train is None:
        n_train = n_fit
        n_fit = n_train - int(round(n_train * _TRAIN_VALIDATION_FRACTION))
    labels = table["__label"].to_numpy().astype(np.float64)
    numerical = {}
    for c in columns:
        x = table[RAW_PREFIX + c].to_numpy().astype(np.float64)  # nulls: NaN
        numerical[c] = (x[:n_fit], x[n_fit:n_train])
    categorical = [(i[:n_fit], i[n_fit:n_train], vocab_mod.cardinality(vocabularies[c])) for c, i in ids.items()]
    return value_id_tests(numerical, categorical, labels[:n_fit], labels[n_fit:n_train], frequency_threshold)


def _vocabulary(train_values: pl.Series, threshold: int) -> pl.DataFrame:
    """(value, count, id) of the train split's text values, ids as ``vocabulary.assign_ids`` gives them."""
    counts = (
        train_values.drop_nulls().alias("value").value_counts(name="count").with_columns(pl.col("count").cast(pl.Int64))
    )
    return vocab_mod.assign_ids(counts, threshold, "value").select("value", "count", "id")


def _ids(values: pl.Series, vocab: pl.DataFrame) -> np.ndarray:
    """Ids of text ``values`` under ``vocab``; missing and unseen values get MISSING_ID."""
    joined = values.alias("value").to_frame().join(vocab, on="value", how="left", maintain_order="left")
    return joined["id"].fill_null(MISSING_ID).to_numpy().astype(np.int64)


def _as_lists(df: pl.DataFrame, name: str, separator: str) -> pl.Series:
    """A multi-hot column as lists of text values (empty values left out; missing -> an empty list)."""
    col = df[name]
    if isinstance(col.dtype, pl.List):
        lists = col.cast(pl.List(pl.String))
    else:
        lists = col.cast(pl.String).str.split(separator)
    return lists.fill_null([]).list.eval(pl.element().filter(pl.element().is_not_null() & (pl.element() != "")))


def preprocess_table(
    files: Sequence[str | os.PathLike],
    out_dir: str | os.PathLike,
    recipe: TableRecipe,
    test_files: Sequence[str | os.PathLike] | None = None,
    test_fraction: float | None = 0.1,
    validation_fraction: float | None = None,
    overwrite: bool = False,
    progress: bool = False,
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

    Returns:
        The summary also written to ``summary.json``: rows per mapping, bad rows, roles, cardinalities.

    Example:
        >>> recipe = TableRecipe(label="rating", label_threshold=4, categorical=("user", "item"))
        >>> preprocess_table(["ratings.csv"], "data/ratings", recipe)  # doctest: +SKIP
    """
    recipe.validate()
    if not files:
        raise ValueError("no input files given")
    if test_files is None and (test_fraction is None or not 0.0 < test_fraction < 1.0):
        raise ValueError(f"`test_fraction` must lie in (0, 1), got {test_fraction}")
    if validation_fraction is not None and not 0.0 < validation_fraction < 1.0:
        raise ValueError(f"`validation_fraction` must lie in (0, 1), got {validation_fraction}")
    start = time.perf_counter()
    paths = [Path(p) for p in files]
    test_paths = [Path(p) for p in test_files] if test_files is not None else []
    all_paths = paths + test_paths
    train_df = _read_all(paths, recipe, 0)
    test_df = _read_all(test_paths, recipe, len(paths)) if test_paths else None
    if test_df is not None and set(test_df.columns) != set(train_df.columns):
        raise ValueError(f"{test_paths[0]}: columns differ from {paths[0]}'s")
    roles = assign_roles(train_df, recipe, paths[0])

    rejects = Rejects(recipe.bad_rows)
    label_expr, label_problem = _labels(recipe)
    num_values, num_problems = _numbers(roles.numerical)
    auto = recipe.also_categorical == AUTO
    explicit_ids = () if auto else recipe.also_categorical
    candidates = [c for c in roles.numerical if f"{c}_id" not in train_df.columns] if auto else []

    def clean(df: pl.DataFrame) -> pl.DataFrame:
        """The good rows, ordered as the recipe says, with the label as 0/1 and numbers as Float64."""
        df = df.with_columns(
            pl.coalesce([label_problem, *num_problems]).alias("__problem"),
            *[pl.col(c).cast(pl.Float64, strict=False).cast(pl.String).alias(f"{c}_id") for c in explicit_ids],
            *[pl.col(c).cast(pl.Float64, strict=False).alias(RAW_PREFIX + c) for c in candidates],
        )  # the ids of a number: its text as a float, so that 2 and 2.0 are one value
        bad = df.filter(pl.col("__problem").is_not_null())
        if len(bad):
            for f, part in bad.group_by(FILE_COL, maintain_order=True):
                rows = part.select(LINE_COL, "__problem").rows()
                rejects.add(str(all_paths[f[0]]), [(line, problem, "") for line, problem in rows])
        df = df.filter(pl.col("__problem").is_null()).with_columns(label_expr.cast(pl.UInt8).alias("__label"),
                                                                   *num_values)  # fmt: skip
        if recipe.order_by is not None:
            df = df.sort(recipe.order_by, maintain_order=True, nulls_last=True)
        elif recipe.shuffle_seed is not None:
            df = df.sample(fraction=1.0, shuffle=True, seed=recipe.shuffle_seed)
        return df

    train_df = clean(train_df)
    if test_df is not None:
        test_df = clean(test_df)
        n_train = len(train_df)
        table = pl.concat([train_df, test_df.select(train_df.columns)], how="vertical_relaxed")
    else:
        table = train_df
        n_train = len(table) - int(round(len(table) * test_fraction))
    del train_df, test_df
    bounds = split_bounds(len(table), n_train, validation_fraction)
    n_fit = bounds[0][2]

    vocabularies: dict[str, pl.DataFrame] = {}
    ids: dict[str, np.ndarray] = {}
    bags: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    columns = tqdm(roles.categorical + roles.multi_hot, desc="preprocess vocabularies", disable=not progress)
    for c in columns:
        if c in roles.categorical:
            text = table[c].cast(pl.String)
            vocabularies[c] = _vocabulary(text[:n_fit], recipe.frequency_threshold)
            ids[c] = _ids(text, vocabularies[c])
        else:
            lists = _as_lists(table, c, recipe.separator)
            lengths = lists.list.len().to_numpy().astype(np.int64)
            flat = lists.explode().drop_nulls()  # empty lists explode to one null
            n_fit_values = int(lengths[:n_fit].sum())
            vocabularies[c] = _vocabulary(flat[:n_fit_values], recipe.frequency_threshold)
            bags[c] = (_ids(flat, vocabularies[c]), lengths)
    id_tests = {}
    if candidates:
        id_tests = _test_value_ids(table, candidates, ids, vocabularies, n_fit,
                                   n_train if validation_fraction else None, recipe.frequency_threshold)  # fmt: skip
        chosen = [f"{c}_id" for c in candidates if id_tests[c].chosen]
        for c in chosen:
            text = table[RAW_PREFIX + c.removesuffix("_id")].cast(pl.String)
            vocabularies[c] = _vocabulary(text[:n_fit], recipe.frequency_threshold)
            ids[c] = _ids(text, vocabularies[c])
        roles = replace(roles, categorical=roles.categorical + tuple(chosen))
    cards = {c: vocab_mod.cardinality(v) for c, v in vocabularies.items()}
    features = {c: Feature(smallest_int_dtype(cards[c]), cards[c]) for c in roles.categorical}
    for c in roles.multi_hot:
        features[c] = Feature(smallest_int_dtype(cards[c]), cards[c], {"multi_hot": True, "combiner": "mean"})
    metadata = {
        "preprocessed_by": "ctrkit preprocess table",
        "label": recipe.label,
        **({"positive": recipe.positive} if recipe.positive is not None else {}),
        **({"label_threshold": recipe.label_threshold} if recipe.label_threshold is not None else {}),
        "frequency_threshold": recipe.frequency_threshold,
        "missing_id": MISSING_ID,
        "rare_id": RARE_ID,
    }
    numerical = table.select(roles.numerical).to_numpy().astype(np.float32) if roles.numerical else None
    labels = table["__label"].to_numpy()
    groups = None
    if recipe.group is not None:  # one id per distinct value: its rank among the values as text
        groups = table[recipe.group].cast(pl.String).fill_null("").rank("dense").to_numpy().astype(np.int64)
    offsets = {c: np.concatenate([[0], np.cumsum(lengths)]) for c, (_, lengths) in bags.items()}
    with atomic_directory(out_dir, overwrite) as tmp:
        group_spec = None
        if groups is not None:
            group_spec = (recipe.group, Feature("int64"), [m for m, _, _ in bounds if m != "train"])
        base = split_binary_spec(features, roles.numerical, recipe.label, [m for m, _, _ in bounds], metadata,
                                 numerical_dtype="float32", group=group_spec)  # fmt: skip
        spec = FeatureSpec(base.feature_spec, base.source_spec, base.channel_spec, base.metadata, tmp)
        for mapping, lo, hi in bounds:
            steps = tqdm(total=hi - lo, unit="row", desc=f"preprocess write {mapping}", disable=not progress)
            with SplitBinaryWriter(spec, mapping) as writer, steps:
                for a in range(lo, hi, WRITE_ROWS):
                    b = min(hi, a + WRITE_ROWS)
                    multi = [(bags[c][0][offsets[c][a] : offsets[c][b]], bags[c][1][a:b]) for c in roles.multi_hot]
                    stored = groups[a:b] if groups is not None and mapping != "train" else None
                    writer.append(None if numerical is None else numerical[a:b],
                                  [ids[c][a:b] for c in roles.categorical], labels[a:b], multi or None,
                                  stored)  # fmt: skip
                    steps.update(b - a)
        spec.to_yaml(tmp / "feature_spec.yaml")
        (tmp / "vocab").mkdir()
        for c, v in vocabularies.items():
            v.write_parquet(tmp / "vocab" / f"{c}.parquet")
        if rejects.kept:
            with open(tmp / "rejects.jsonl", "w") as f:
                for r in rejects.kept:
                    f.write(json.dumps({k: v for k, v in r.items() if k != "line"}) + "\n")
        summary = {
            "recipe": "table",
            **{f"{name}_rows": hi - lo for name, lo, hi in bounds},
            "bad_rows": rejects.count,
            "categorical": list(roles.categorical),
            "multi_hot": list(roles.multi_hot),
            "numerical": list(roles.numerical),
            **({"value_id_tests": {c: t.as_dict() for c, t in id_tests.items()}} if id_tests else {}),
            "cardinalities": cards,
            "clicks": {name: int(labels[lo:hi].sum()) for name, lo, hi in bounds},
            "seconds": round(time.perf_counter() - start, 3),
        }
        (tmp / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary
