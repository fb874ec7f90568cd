"""The table recipe (TableRecipe: what ctrkit preprocess table is told) and the column roles it gives: which
columns are the label, categorical, numerical, multi-hot or dropped (named, else by type), and the label and number
columns read and checked."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from ctrkit.columns import label_of
from ctrkit.config import VALIDATION_FRACTION
from ctrkit.data.feature_spec import check_capacity
from ctrkit.field_types import FREQUENCY_THRESHOLD
from ctrkit.preprocess.criteo import BAD_ROW_POLICIES
from ctrkit.preprocess.pooling import COMBINERS
from ctrkit.preprocess.table_reader import separator_char
from ctrkit.preprocess.time_parts import (
    DEFAULT_PARTS,
    INTEGER_FORMATS,
    PARTS,
    UNIX_FORMATS,
    check_format,
    choose_format,
    formats_seen,
    reads,
    unit_problem,
)
from ctrkit.preprocess.values import number_problem

FILE_COL, LINE_COL = "__ctrkit_file", "__ctrkit_line"  # where each row came from, for error messages
TRAIN_VALIDATION_FRACTION = VALIDATION_FRACTION  # the tail `train` holds out by default


NUMERIC_TEXT_FRACTION = 0.9  # a text column this often numeric is refused unless named
DISTINCT_FRACTION, DISTINCT_MIN_ROWS = 0.9, 1000  # an unnamed text column this distinct (in as many rows) is refused
# an unnamed text column whose values hold LIST_SEPARATOR this often is a list of values, refused unless named
LIST_SEPARATOR, LISTED_FRACTION = "|", 0.2


DEFAULT_NULL_VALUES = ("NA", "NaN", "nan", "null", "NULL")


INTEGER_ROLES = ("error", "categorical", "numerical")


RESERVED = ("label", "numerical")  # the dataset's own file names


AUTO = "auto"  # TableRecipe.also_categorical: chosen by the held-out test of ``value_ids``; .time: timestamps


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
        raw_ids: categorical columns kept as raw 64-bit ids (dynamic features, ``models/dynamic.py``): XXH64 of the
            value's UTF-8 text (seed 0) as int64, 0 for a missing value (``table.raw_ids``).
        capacity: rows of each raw-id column's table (None: its vocabulary's cardinality at ``frequency_threshold``).
        order_by: sort the rows by this column (stable) before splitting; it is not a feature unless named (or, as a
            timestamp, read as parts of time: ``time``).
        time: timestamp columns read as parts of time (``time_parts``), each part a categorical feature
            ``<column>_<part>``; "auto" (the default): every text, date or datetime column named nowhere else (the
            ``order_by`` column too) whose first value is a timestamp of one of ``time_parts.FORMATS``; () for none.
        time_parts: the parts of each timestamp read (``time_parts.PARTS``).
        combiner: how each multi-hot feature's values are pooled in the models, written to the feature spec:
            "sum", "mean", or "auto" (the default): the one whose additive logistic regression predicts held-out
            training rows better (``pooling``).
        time_format: the timestamps' format (a strftime pattern, or "unix"/"unix_ms" for integer columns); "": the
            first of ``time_parts.FORMATS`` that reads a column's first value.
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
    separator: str = LIST_SEPARATOR
    frequency_threshold: int = 3
    order_by: str | None = None
    group: str | None = None
    integers: str = "error"
    shuffle_seed: int | None = None
    null_values: tuple[str, ...] = DEFAULT_NULL_VALUES
    csv_separator: str = ","
    bad_rows: str = "error"
    raw_ids: tuple[str, ...] = ()
    capacity: int | None = None
    time: tuple[str, ...] | str = AUTO
    time_parts: tuple[str, ...] = DEFAULT_PARTS
    time_format: str = ""
    combiner: str = AUTO

    def validate(self) -> None:
        if not self.label:
            raise ValueError("`label`: name the label column")
        check_capacity(self.capacity)
        if self.positive is not None and self.label_threshold is not None:
            raise ValueError("give at most one of `positive` and `label_threshold`")
        if self.order_by is not None and self.shuffle_seed is not None:
            raise ValueError("give at most one of `order_by` and `shuffle_seed`")
        if isinstance(self.also_categorical, str) and self.also_categorical != AUTO:
            raise ValueError(f"`also_categorical`: expected columns or '{AUTO}', got {self.also_categorical!r}")
        if isinstance(self.time, str) and self.time != AUTO:
            raise ValueError(f"`time`: expected columns or '{AUTO}', got {self.time!r}")
        unknown = [p for p in self.time_parts if p not in PARTS]
        if unknown or not self.time_parts or len(set(self.time_parts)) < len(self.time_parts):
            raise ValueError(f"`time_parts`: expected distinct parts of {', '.join(PARTS)}, got "
                             f"{', '.join(self.time_parts) or 'none'}")  # fmt: skip
        check_format(self.time_format)
        if self.combiner not in (AUTO, *COMBINERS):
            raise ValueError(f"`combiner` must be one of {AUTO}, {', '.join(COMBINERS)}, got {self.combiner!r}")
        FREQUENCY_THRESHOLD.check("frequency_threshold", self.frequency_threshold)
        if not self.separator:
            raise ValueError("`separator` must not be empty")
        separator_char(self.csv_separator, "`csv_separator`")
        if self.integers not in INTEGER_ROLES:
            raise ValueError(f"`integers` must be one of {', '.join(INTEGER_ROLES)}, got {self.integers!r}")
        if self.bad_rows not in BAD_ROW_POLICIES:
            raise ValueError(f"`bad_rows` must be one of {', '.join(BAD_ROW_POLICIES)}, got {self.bad_rows!r}")
        roles = [("label", (self.label,)), ("categorical", self.categorical), ("numerical", self.numerical),
                 ("multi_hot", self.multi_hot), ("drop", self.drop),
                 ("group", (self.group,) if self.group else ()),
                 ("time", () if self.time == AUTO else self.time)]  # fmt: skip
        seen: dict[str, str] = {}
        for role, names in roles:
            for name in names:
                if name in seen:
                    raise ValueError(f"column '{name}' is given two roles: `{seen[name]}` and `{role}`")
                seen[name] = role


@dataclass(frozen=True)
class Derived:
    """A categorical feature read from another column: ``column``'s values as text by ``text`` (``transform``'s
    rule: "number" for a number identified by value, ``<column>_id``; a time part, ``<column>_<part>``, of a
    timestamp of ``time_format``)."""

    feature: str
    column: str
    text: str
    time_format: str = ""


@dataclass(frozen=True)
class Roles:
    """The columns of each role: the named ones in the order given, then the others in table order (integer
    columns, under `integers`, last); ``derived``: the categorical features read from another column (their
    columns are numerical, or timestamps, ``time``)."""

    categorical: tuple[str, ...]
    numerical: tuple[str, ...]
    multi_hot: tuple[str, ...]
    derived: tuple[Derived, ...] = ()

    @property
    def time(self) -> dict[str, str]:
        """The timestamp columns, in order, each with its format."""
        return {d.column: d.time_format for d in self.derived if d.time_format}

    def derived_by_feature(self) -> dict[str, Derived]:
        return {d.feature: d for d in self.derived}


@dataclass(frozen=True)
class ColumnFacts:
    """What the roles read of a column's training values (``assign_roles``): ``values`` not missing; the first value
    (as text); for a text column, how many of them are numbers, the first that is not one as (file index, line,
    value), the distinct values (counted where ``values`` >= DISTINCT_MIN_ROWS, else 0), and how many hold
    ``LIST_SEPARATOR`` (a list of values, as a multi-hot column's are) with the first of them."""

    values: int
    numbers: int = 0
    other: tuple[int, int, str] | None = None
    first: str | None = None
    distinct: int = 0
    listed: int = 0
    first_listed: str | None = None

    @classmethod
    def of(cls, df: pl.DataFrame, column: str, distinct: bool = True) -> ColumnFacts:
        """The facts of ``column`` in ``df`` (rows in file order, with FILE_COL and LINE_COL); ``distinct``: count
        the distinct values (an engine that counts them over all its parts says False)."""
        values = df.select(pl.col(column), pl.col(FILE_COL), pl.col(LINE_COL)).drop_nulls(column)
        if not len(values):
            return cls(0)
        if df.schema[column] != pl.String:
            return cls(len(values), first=str(values[column][0]))
        numbers = values[column].cast(pl.Float64, strict=False).is_not_null()
        others = values.filter(~numbers)
        other = None
        if len(others):
            value, file, line = others.row(0)
            other = (int(file), int(line), value)
        n = len(values)
        count = values[column].n_unique() if distinct and n >= DISTINCT_MIN_ROWS else 0
        listed = values[column].filter(values[column].str.contains(LIST_SEPARATOR, literal=True))
        return cls(n, int(numbers.sum()), other, values[column][0], count, len(listed),
                   listed[0] if len(listed) else None)  # fmt: skip

    @classmethod
    def merge(cls, parts: Sequence[ColumnFacts], distinct: int) -> ColumnFacts:
        """The facts of parts read in file order, with the ``distinct`` values counted over all of them."""
        given = [p for p in parts if p.values]
        others = [p.other for p in given if p.other is not None]
        listed = [p.first_listed for p in given if p.first_listed is not None]
        return cls(sum(p.values for p in given), sum(p.numbers for p in given), min(others) if others else None,
                   given[0].first if given else None, distinct, sum(p.listed for p in given),
                   listed[0] if listed else None)  # fmt: skip


def assign_roles(
    schema: Mapping[str, pl.DataType], recipe: TableRecipe, paths: Sequence[Path], facts: Callable[[str], ColumnFacts]
) -> Roles:
    """Checks that every named column of the table (``schema``, the columns of ``paths``) exists and gives the
    others a role by their type and ``facts`` of their training values."""
    where = paths[0]
    columns = [c for c in schema if c not in (FILE_COL, LINE_COL)]
    named = {"label": (recipe.label,), "categorical": recipe.categorical, "numerical": recipe.numerical,
             "multi_hot": recipe.multi_hot, "drop": recipe.drop,
             "order_by": (recipe.order_by,) if recipe.order_by else (),
             "group": (recipe.group,) if recipe.group else (),
             "time": () if recipe.time == AUTO else recipe.time}  # fmt: skip
    for role, names in named.items():
        for name in names:
            if name not in columns:
                raise ValueError(f"`{role}`: {where} has no column '{name}' (columns: {', '.join(columns)})")
    taken = {n for names in named.values() for n in names}
    times = _time_columns(schema, columns, recipe, taken, facts, where)
    taken |= set(times)
    cats, nums, multi = list(recipe.categorical), list(recipe.numerical), list(recipe.multi_hot)
    integers = []
    for c in columns:
        if c in taken:
            continue
        dtype = schema[c]
        if dtype == pl.String:
            known = facts(c)
            _check_not_numbers(known, c, paths)
            _check_not_lists(known, c, where)
            if c not in recipe.raw_ids:
                _check_not_distinct(known, c, where)
            cats.append(c)
        elif dtype in (pl.Boolean, pl.Categorical) or isinstance(dtype, pl.Enum):
            cats.append(c)
        elif dtype.is_float():
            nums.append(c)
        elif isinstance(dtype, pl.List):
            multi.append(c)
        elif dtype.is_integer():
            integers.append(c)
        elif dtype == pl.Null or not facts(c).values:
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
    derived = []
    for c in () if recipe.also_categorical == AUTO else recipe.also_categorical:
        if c not in nums:
            raise ValueError(f"`also_categorical`: '{c}' is not a numerical column (numerical: {', '.join(nums)})")
        if f"{c}_id" in columns:
            raise ValueError(f"`also_categorical`: '{c}_id' is a column already; rename it")
        derived.append(Derived(f"{c}_id", c, "number"))
    for c, time_format in times.items():
        for part in recipe.time_parts:
            if f"{c}_{part}" in columns or f"{c}_{part}" in cats:
                raise ValueError(f"`time`: '{c}_{part}' (the {part} of '{c}') is a column already; rename it")
            derived.append(Derived(f"{c}_{part}", c, part, time_format))
    cats += [d.feature for d in derived]
    if not cats and not multi:
        raise ValueError(f"{where}: no categorical column; the models need at least one")
    return Roles(tuple(cats), tuple(nums), tuple(multi), tuple(derived))


def _time_columns(schema: Mapping[str, pl.DataType], columns: Sequence[str], recipe: TableRecipe, taken: set[str],
                  facts: Callable[[str], ColumnFacts], where: Path) -> dict[str, str]:  # fmt: skip
    """The timestamp columns read as parts of time, each with its format: the named ones (refused where their first
    value is no timestamp), or under "auto" every text, date or datetime column named nowhere else, the ``order_by``
    column too, whose first value is one. Under "auto" a text column whose first value looks like a date of none of
    the formats tried is refused, naming the formats it looks like (at any size of table: as text, each of its values
    would be an id of its own)."""
    if recipe.time != AUTO:
        out = {}
        for c in recipe.time:
            dtype = schema[c]
            first = facts(c).first if dtype == pl.String or dtype.is_integer() else None
            found = choose_format(first, dtype, recipe.time_format)
            if found is None:
                raise ValueError(f"`time`: {where}: column '{c}' is not a timestamp: {_no_format(first, dtype)}")
            if found in UNIX_FORMATS and (problem := unit_problem(first, found)) is not None:
                raise ValueError(f"`time`: {where}: column '{c}': {problem}")
            out[c] = found
        return out
    out = {}
    for c in columns:
        dtype = schema[c]
        timelike = dtype in (pl.String, pl.Date) or isinstance(dtype, pl.Datetime)
        if (c in taken and c != recipe.order_by) or not timelike:
            continue
        first = facts(c).first if dtype == pl.String else None
        found = choose_format(first, dtype, recipe.time_format)
        if found is not None and (dtype != pl.String or (first is not None and reads(first, found))):
            out[c] = found
        elif dtype == pl.String and first is not None and formats_seen(first):
            raise ValueError(f"{where}: column '{c}' holds dates such as '{first}' in none of the formats tried: "
                             f"{_no_format(first, dtype)}, or name it in `drop` or `categorical`")  # fmt: skip
    return out


def _no_format(first: object, dtype: pl.DataType) -> str:
    """What a message says of a timestamp column whose first value ``first`` no format reads."""
    if dtype.is_integer():
        return (
            f"its first value {first!r} is an integer: give --time-format unix (seconds since 1970), unix_ms "
            f"(milliseconds), or a pattern of its digits such as {' or '.join(map(repr, INTEGER_FORMATS))}"
        )
    seen = formats_seen(str(first)) if first is not None else []
    if seen:
        return f"its first value {first!r} looks like {' or '.join(map(repr, seen))}: give --time-format"
    return f"its first value {first!r} is none of the formats tried; give --time-format"


def _check_not_numbers(facts: ColumnFacts, column: str, paths: Sequence[Path]) -> None:
    """Refuses a text column whose values are nearly all numbers: a numerical column with a few bad values,
    which taken as categorical would silently give every number its own id."""
    if facts.values and facts.numbers / facts.values >= NUMERIC_TEXT_FRACTION:
        where, here = str(paths[0]), ""
        if facts.other is not None:
            file, line, value = facts.other
            where, here = f"{paths[file]}:{line}", f" (here '{value}')"
        raise ValueError(
            f"{where}: column '{column}' holds text, but {facts.numbers:,} of its {facts.values:,} values are "
            f"numbers{here}: name it in `numerical` (its other values then are bad rows) or in `categorical`"
        )


def _check_not_lists(facts: ColumnFacts, column: str, where: Path) -> None:
    """Refuses an unnamed text column whose values are often lists (``LIST_SEPARATOR``): as one categorical feature
    each combination of values would be an id of its own, and no value would be learnt apart from the others."""
    if facts.values and facts.listed >= LISTED_FRACTION * facts.values:
        raise ValueError(
            f"{where}: column '{column}' holds lists of values such as '{facts.first_listed}' ({facts.listed:,} of "
            f"{facts.values:,} values hold '{LIST_SEPARATOR}'): name it in --multi-hot (each value an id, "
            "--separator splits them) or in --categorical (each combination one value)"
        )


def _check_not_distinct(facts: ColumnFacts, column: str, where: Path) -> None:
    """Refuses an unnamed text column whose values are nearly all distinct (a timestamp, a request id): as a
    categorical feature every value is seen once, so every id is the rare one and no test row shares it."""
    if facts.values >= DISTINCT_MIN_ROWS and facts.distinct >= DISTINCT_FRACTION * facts.values:
        raise ValueError(
            f"{where}: column '{column}' holds {facts.distinct:,} distinct values in {facts.values:,} rows (such as "
            f"'{facts.first}'): a time or an id of each row, which a model cannot learn from; name it in `order_by` "
            "(a time), `drop` it, or name it in `categorical` to keep it"
        )


def label_values(recipe: TableRecipe) -> tuple[pl.Expr, pl.Expr]:
    """The label as 0/1 and the problem of each row whose label is not one (null where fine)."""
    col = pl.col(recipe.label)
    name = recipe.label
    if recipe.positive is not None:
        label = col.cast(pl.String) == recipe.positive
        return label, pl.when(col.is_null()).then(pl.lit(f"{name}: missing label"))
    if recipe.label_threshold is not None:
        number = col.cast(pl.Float64, strict=False)
        problem = (
            pl.when(col.is_null())
            .then(pl.lit(f"{name}: missing label"))
            .when(number.is_null())
            .then(pl.format(f"{name}: '{{}}' is not a number (label_threshold compares numbers)", col.cast(pl.String)))
        )
        return number >= recipe.label_threshold, problem
    return label_of(col, name, " (`positive` or `label_threshold` turn other values into clicks)")


def number_problems(names: Sequence[str]) -> list[pl.Expr]:
    """Each numerical column's problem (null where fine: ``values.number_problem``). The numbers themselves are the
    fitted transform's (missing -> 0)."""
    return [number_problem(pl.col(n), n) for n in names]


def recipe_of(cfg: Any) -> TableRecipe:
    """The recipe of ``preprocess table``'s flags (a ``data_config.TablePreprocessConfig``), as ``preprocess table``
    and ``refresh`` take them."""
    return TableRecipe(
        label=cfg.label, categorical=cfg.categorical, numerical=cfg.numerical, multi_hot=cfg.multi_hot,
        drop=cfg.drop, also_categorical=auto_or_names(cfg.also_categorical, "--also-categorical"),
        positive=cfg.positive, label_threshold=cfg.label_threshold, separator=cfg.separator,
        frequency_threshold=cfg.frequency_threshold, order_by=cfg.order_by, shuffle_seed=cfg.shuffle_seed,
        group=cfg.group, integers=cfg.integers,
        null_values=cfg.null_values, csv_separator=cfg.csv_separator, bad_rows=cfg.bad_rows,
        raw_ids=cfg.raw_ids, capacity=cfg.capacity, time=auto_or_names(cfg.time, "--time"),
        time_parts=cfg.time_parts, time_format=cfg.time_format or "", combiner=cfg.combiner,
    )  # fmt: skip


def auto_or_names(names: tuple[str, ...], flag: str) -> tuple[str, ...] | str:
    """--also-categorical or --time as the recipe takes it: 'auto' alone, 'none' alone (no column), or column
    names."""
    words = {"auto", "none"} & set(names)
    if words and len(names) > 1:
        raise ValueError(f"{flag}: '{sorted(words)[0]}' stands alone, not beside column names")
    return "auto" if names == ("auto",) else () if names == ("none",) else names
