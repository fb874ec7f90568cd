"""The preprocessing a model carries: raw rows of a click log -> the model's inputs.

``ctrkit preprocess table`` and ``preprocess criteo`` write what they did to the columns beside the dataset
(``preprocessing.json``, with the vocabularies in ``vocab/``); ``train`` carries it into the checkpoint, ``export``
into the model repository, and ``predict --input``, ``ctrkit serve`` and the Triton Python-backend model apply it
to new rows. A ``RowTransform`` holds:

* the raw columns a row needs, each with the type it was read as when the dataset was made (text, integers,
  floats, booleans) and its role;
* per categorical feature of the model, in the model's order: its column, how the value becomes text (as read;
  a number's text as a float, for ``--also-categorical`` ids; Criteo's lowercase hexadecimal; a part of a
  timestamp in its format, ``time_parts``) and how the text becomes an id (the vocabulary, or a raw 64-bit id:
  XXH64 of the UTF-8 text, or Criteo's key);
* per numerical feature: its column and its transform (none, or Criteo's log), missing -> 0;
* per multi-hot feature: its column and the separator of its values.

Ids follow the dataset's rule for its test rows: a value of the vocabulary gets its id (a value the training
rows held fewer than ``frequency_threshold`` times the rare id 1), a missing or unseen value 0.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from ctrkit.columns import Role
from ctrkit.data.feature_spec import PREPROCESSING_FILE
from ctrkit.preprocess.criteo import CRITEO_FILE_COLUMNS, CRITEO_SOURCE, FIRST_ID, MISSING_ID
from ctrkit.preprocess.time_parts import PARTS, part_text
from ctrkit.preprocess.values import (
    BadValues,
    bad_numbers,
    hex_bad,
    hex_problem,
    integer_problem,
    number_problem,
    timestamp_problem,
)
from ctrkit.preprocess.vocabulary import ValueIndex, hash_exprs, hex_key_ids, vocabulary_frame, xxh64_ids

RECORD_FILE = PREPROCESSING_FILE
FORMAT = 1
# Polars' names of the types a raw column is read as (a ``Column``'s ``dtype``) -> the types
RAW_TYPES = {"String": pl.String, "Int64": pl.Int64, "Float64": pl.Float64, "Boolean": pl.Boolean}
TEXTS = ("as_read", "number", "hex", *PARTS)  # how a categorical value becomes text (a part of a timestamp: PARTS)
DERIVED_TEXTS = ("number", *PARTS)  # the texts of features read from another column (a number's, a timestamp's)
ID_RULES = ("vocabulary", "xxh64", "hex_key")  # how the text becomes an id
TRANSFORMS = ("none", "criteo_log")
# what a column the model reads means when a file or a request leaves it out: refused, naming it ("error"), or
# missing in every row ("missing"); a column the model does not read is ignored either way (``check_columns``)
MISSING_COLUMNS = ("error", "missing")
# values a model carries at most, over all its vocabularies; a dataset's larger vocabularies are carried without the
# values rarer than its frequency threshold (they would be most of them: Criteo's long tail)
MAX_CARRIED_VALUES = 20_000_000
MISSING_INT64 = -(2**63)  # a missing value in a raw INT64 tensor (a binary tensor holds no null): INT64's minimum


# how each scorer names the setting that scores what a ``RowError`` refuses as missing: the commands' flags
# (``predict``, ``ctrkit serve``), and the parameters of the Triton model's config
CLI_SETTINGS = {"missing_columns": "--missing-columns missing", "bad_values": "--bad-values missing"}
TRITON_SETTINGS = {"missing_columns": 'the config parameter missing_columns "missing"',
                   "bad_values": 'the config parameter bad_values "missing"'}  # fmt: skip
_SETTING_DOES = {"missing_columns": "scores a column left out as missing in every row",
                 "bad_values": "scores a bad value as missing"}  # fmt: skip


class RowError(ValueError):
    """A raw row that cannot be scored: ``what`` names the column and what was expected, ``row`` the row's index
    among those given (None: not one row's fault), ``setting`` the scorer's setting that would score it as missing
    instead (a key of ``CLI_SETTINGS``; None: none). The message numbers the row from 1 and names the setting as the
    commands spell it; ``said`` as another scorer does. A file's reader names the row's line instead (``row`` is
    carried as data for that)."""

    def __init__(self, what: str, row: int | None = None, setting: str | None = None):
        self.what, self.row, self.setting = what, row, setting
        super().__init__(self.said(CLI_SETTINGS))

    def said(self, settings: Mapping[str, str]) -> str:
        """The message, the setting spelled as ``settings`` spells it (left out where it has none)."""
        text = self.what if self.row is None else f"row {self.row + 1}: {self.what}"
        if self.setting in settings:
            text += f" ({settings[self.setting]} {_SETTING_DOES[self.setting]})"
        return text


@dataclass(frozen=True)
class Column:
    """A raw column: its name, the type it was read as (a key of ``RAW_TYPES``), its ``Role``."""

    name: str
    dtype: str
    role: Role

    def __post_init__(self):
        try:
            object.__setattr__(self, "role", Role(self.role))
        except ValueError:
            raise ValueError(f"column '{self.name}': role {self.role!r} is not one of "
                             f"{', '.join(r.value for r in Role)}") from None  # fmt: skip


@dataclass(frozen=True)
class CategoricalInput:
    """One categorical feature of the model: ``feature`` (its name in the dataset) from ``column``."""

    feature: str
    column: str
    text: str = "as_read"
    ids: str = "vocabulary"
    time_format: str = ""  # a time part's (``text`` in ``time_parts.PARTS``): its column's format


@dataclass(frozen=True)
class NumericalInput:
    feature: str
    column: str
    transform: str = "none"


@dataclass(frozen=True)
class MultiHotInput:
    feature: str
    column: str
    separator: str = "|"


class RawColumns:
    """The raw columns a fitted preprocessing reads (``columns``: ``Column``, ``null_values``: texts that mean a
    missing value) and the one rule for a request's or a file's columns, shared by every source's preprocessing
    (``RowTransform``; ``outbrain_transform.OutbrainTransform``)."""

    columns: tuple[Column, ...]
    null_values: tuple[str, ...]

    def input_specs(self) -> list[dict[str, Any]]:
        """The raw inputs, one per column: name, KServe v2 datatype, role (what ``ctrkit_model.json`` and the
        server's metadata list)."""
        out = []
        for c in self.columns:  # integers as INT64 (ids, Criteo's counts), other numbers as FP32 (NaN: missing), text
            kind = "INT64" if c.dtype == "Int64" else "FP32" if c.role == Role.NUMERICAL else "BYTES"
            out.append({"name": c.name, "datatype": kind, "role": c.role.value})
        return out

    @property
    def column_names(self) -> list[str]:
        return [c.name for c in self.columns]

    def check_columns(self, given: Sequence[str], missing_columns: str = "error") -> None:
        """The one column rule of ``predict --input``, ``ctrkit serve`` and the Triton Python-backend model: a column
        this model does not read is ignored (the label, ids to keep); a column it reads that ``given`` lacks is
        refused, naming it, unless ``missing_columns`` is "missing" (then it is missing in every row); none of them
        at all is refused either way."""
        if missing_columns not in MISSING_COLUMNS:
            raise ValueError(f"`missing_columns` must be one of {', '.join(MISSING_COLUMNS)}, got {missing_columns!r}")
        absent = [c for c in self.column_names if c not in given]
        if len(absent) == len(self.column_names):
            raise RowError(f"none of the columns the model reads ({', '.join(self.column_names)})")
        if absent and missing_columns == "error":
            raise RowError(
                f"no column {', '.join(repr(c) for c in absent)}; the model reads {', '.join(self.column_names)} (the "
                "label is not needed, other columns are ignored)",
                setting="missing_columns",
            )

    def _raw_frame(self, values: Mapping[str, Any], rows: int, missing_columns: str) -> pl.DataFrame:
        """The columns given that the model reads, as sent (a column left out is added as missing by
        ``_typed_exprs``, where ``check_columns`` lets it be)."""
        self.check_columns([k for k, v in values.items() if v is not None], missing_columns)
        series = []
        for name, given in values.items():
            if given is None or name not in self.column_names:
                continue
            s = _series(name, given, frozenset(self.null_values))
            if len(s) != rows:
                raise RowError(f"column '{name}' holds {len(s)} values, expected {rows} (one a row)")
            series.append(s)
        return pl.DataFrame(series) if series else pl.DataFrame({"__rows": [None] * rows})

    def features(self) -> dict[str, list[str]]:
        """The model's features of each kind, in order (compared with a checkpoint's spec summary)."""
        raise NotImplementedError

    def check_features(self, summary: Mapping[str, Any], where: str) -> None:
        """Raises ValueError when the model's features (a spec summary) are not those this transform makes."""
        for key, ours in self.features().items():
            theirs = list(summary.get(key, []))
            if theirs != ours:
                raise ValueError(f"{where}: the preprocessing record makes {key} {ours}, the model reads {theirs}")


class RowTransform(RawColumns):
    """Raw rows (a Polars DataFrame of the raw columns) -> the model's numerical, categorical and multi-hot
    inputs, as the dataset the model was trained on made them.

    Args:
        source: what made the dataset (``ctrkit preprocess table``, ``ctrkit preprocess criteo``).
        columns: the raw columns a row needs.
        numerical, categorical, multi_hot: the model's features of each kind, in the model's order.
        vocabularies: feature -> (value, id) of each categorical or multi-hot feature with a vocabulary.
        null_values: texts that mean a missing value (besides the empty one).
        label: the label column of the training rows (never needed to score).
        rare_values: "rare" where the vocabularies hold the values rarer than the frequency threshold (scored as the
            shared rare id, as the dataset's rows), "missing" where a dataset's vocabularies were too large to carry
            whole (``MAX_CARRIED_VALUES``): only the values with a row of their own are carried, and a rare value is
            scored as an unseen one (the missing id 0).
        file_columns, file_separator: the columns of the source's files where they have no header (Criteo's days:
            label, I1..I13, C1..C26, tab-separated; a record may leave the label out), and their separator; ():
            files with a header.
    """

    def __init__(
        self,
        source: str,
        columns: Sequence[Column],
        numerical: Sequence[NumericalInput],
        categorical: Sequence[CategoricalInput],
        multi_hot: Sequence[MultiHotInput],
        vocabularies: Mapping[str, pl.DataFrame],
        null_values: Sequence[str] = (),
        label: str | None = None,
        rare_values: str = "rare",
        file_columns: Sequence[str] = (),
        file_separator: str = ",",
    ):
        self.source = source
        self.columns = tuple(columns)
        self.numerical = tuple(numerical)
        self.categorical = tuple(categorical)
        self.multi_hot = tuple(multi_hot)
        self.vocabularies = dict(vocabularies)
        self.null_values = tuple(null_values)
        self.label = label
        self.rare_values = rare_values  # "rare": carried, scored as the rare id; "missing": left out, scored as 0
        self.file_columns, self.file_separator = tuple(file_columns), file_separator
        self._indexes: dict[str, ValueIndex] = {}
        self._plans: dict[tuple, list[pl.Expr]] = {}  # the transform's query per frame schema (``_plan``)
        self._checks: list | None = None  # ``_value_checks``, made once
        self.validate()

    def validate(self) -> None:
        names = [c.name for c in self.columns]
        for c in self.columns:
            if c.dtype not in RAW_TYPES:
                raise ValueError(f"column '{c.name}': type '{c.dtype}' is not one of {', '.join(RAW_TYPES)}")
        for f in (*self.numerical, *self.categorical, *self.multi_hot):
            if f.column not in names:
                raise ValueError(f"feature '{f.feature}': column '{f.column}' is not among the columns {names}")
        for f in self.categorical:
            if f.text not in TEXTS or f.ids not in ID_RULES:
                raise ValueError(f"feature '{f.feature}': text '{f.text}' / ids '{f.ids}' unknown")
            if (f.text in PARTS) != bool(f.time_format):
                raise ValueError(f"feature '{f.feature}': a time part needs its column's format, and only it has one")
        for f in (*[c for c in self.categorical if c.ids == "vocabulary"], *self.multi_hot):
            if f.feature not in self.vocabularies:
                raise ValueError(f"feature '{f.feature}': no vocabulary")
        for f in self.numerical:
            if f.transform not in TRANSFORMS:
                raise ValueError(f"feature '{f.feature}': transform '{f.transform}' is not one of {TRANSFORMS}")

    def from_request(
        self, values: Mapping[str, Any], rows: int, missing_columns: str = "error", bad: BadValues | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """The model's inputs of ``rows`` rows given as ``values`` (column -> a sequence of ``rows`` values: text,
        bytes, numbers, None for missing; columns left out and extra ones as ``check_columns`` says), each cast to
        the type it was read as when the dataset was made, in one query. A bad value (``values``: a number or a
        timestamp that preprocessing refuses) is refused, or scored as missing and counted in ``bad``."""
        raw = self._raw_frame(values, rows, missing_columns)  # null values already made missing
        return self._inputs(raw, self._plan(raw.schema, typed=False, nulls_done=True, rows=raw.height), bad)

    def raw_rows(
        self, df: pl.DataFrame, bad: BadValues | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """The model's inputs of raw rows as a file holds them (CSV text read with the ``null_values``, as
        preprocessing read it; Parquet's types, whose texts preprocessing took as they are): ``typed`` and the
        transform in one query. Bad values as ``from_request`` says."""
        return self._inputs(df, self._plan(df.schema, typed=False, nulls_done=True, rows=df.height), bad)

    def typed(self, df: pl.DataFrame, nulls_done: bool = False) -> pl.DataFrame:
        """``df``'s raw columns as the types they were read as (text that is one of ``null_values`` is missing,
        unless ``nulls_done``: rows as a file holds them, its reader's business; a value that does not parse is
        missing)."""
        typed = self._typed_exprs(df.schema, nulls_done)
        return df.select(typed[c.name].alias(c.name) for c in self.columns)

    def _typed_exprs(self, schema: Mapping[str, pl.DataType], nulls_done: bool = False) -> dict[str, pl.Expr]:
        """Each raw column as the type it was read as, from a frame of ``schema`` (a column it lacks: missing; with
        ``nulls_done`` its texts among ``null_values`` are missing already)."""
        exprs = {}
        for c in self.columns:
            if c.name not in schema:
                exprs[c.name] = pl.lit(None, RAW_TYPES[c.dtype])
                continue
            col = pl.col(c.name)
            if schema[c.name] == pl.String and self.null_values and not nulls_done:
                col = pl.when(col.is_in(list(self.null_values))).then(None).otherwise(col)
            if c.role == Role.MULTI_HOT and isinstance(schema[c.name], pl.List):
                exprs[c.name] = col.cast(pl.List(pl.String))
            elif c.role == Role.MULTI_HOT:
                exprs[c.name] = col.cast(pl.String)
            elif c.role == Role.NUMERICAL and c.dtype != "String":
                exprs[c.name] = col  # numbers are read by the transform, which refuses text that is none
            elif c.dtype == "Int64" and schema[c.name].is_float():  # 30.0 is 30; 30.9 is no integer: missing
                exprs[c.name] = pl.when(col.round(0) == col).then(col).cast(pl.Int64, strict=False)
            elif c.dtype == "Boolean" and schema[c.name] == pl.String:
                low = col.str.to_lowercase()
                exprs[c.name] = pl.when(low.is_in(["true", "1"])).then(True).when(low.is_in(["false", "0"]))
                exprs[c.name] = exprs[c.name].then(False).otherwise(None)
            else:
                exprs[c.name] = col.cast(RAW_TYPES[c.dtype], strict=False)
        return exprs

    # ---- the transform ----

    def __call__(self, df: pl.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """numerical (B, N) float32, categorical (B, F) int64 and multi-hot (B, Fm, L) int64 (-1 padded; None
        without multi-hot features) of the raw rows ``df`` (``typed`` first)."""
        return self._inputs(df, self._plan(df.schema, typed=True, rows=df.height), None)

    def _plan(
        self, schema: Mapping[str, pl.DataType], typed: bool, nulls_done: bool = False, rows: int = 0
    ) -> list[pl.Expr]:
        """The query of the transform on a frame of ``schema``: of typed columns, or of raw ones (typed in the same
        query; ``nulls_done``: their texts among ``null_values`` are missing already), of ``rows`` rows (which
        vocabularies are joined: ``ValueIndex.by_join``). Kept per schema: building the expressions costs as much as
        running them on one row."""
        joins = tuple(f.ids == "vocabulary" and self._index(f.feature).by_join(rows) for f in self.categorical)
        key = (typed, nulls_done, joins, tuple(schema.items()))
        if key not in self._plans:
            if len(self._plans) >= 64:
                self._plans.clear()
            if typed:
                exprs = {c.name: pl.col(c.name) for c in self.columns}
            else:
                exprs = self._typed_exprs(schema, nulls_done)
            self._plans[key] = self._feature_exprs(exprs, joins)
        return self._plans[key]

    def _feature_exprs(self, col: Mapping[str, pl.Expr], joins: Sequence[bool]) -> list[pl.Expr]:
        """Per numerical feature its number (r, null where missing or unreadable) and whether it was missing (u); per
        timestamp column whether it was missing (v); per categorical feature with a vocabulary its text's two hashes
        (h, g) and whether it is missing (z) (where ``joins`` says so, its text, joined with the vocabulary), else its
        text (t); per multi-hot feature its values (m); ``col`` gives each typed column."""
        exprs = [pl.len().alias("rows")]
        for j, f in enumerate(self.numerical):  # checked and filled in NumPy (``values.bad_numbers``)
            exprs += [
                col[f.column].cast(pl.Float64, strict=False).alias(f"r{j}"),
                col[f.column].is_null().alias(f"u{j}"),
            ]
        for k, (column, _) in enumerate(self._timestamps()):  # given, where a part's text is missing: unreadable
            exprs.append(col[column].is_null().alias(f"v{k}"))
        for j, f in enumerate(self.categorical):
            text = category_text(col[f.column], f.text, f.time_format)
            if f.ids == "vocabulary" and not joins[j]:
                first, second = hash_exprs(text)
                exprs += [first.alias(f"h{j}"), second.alias(f"g{j}"), text.is_null().alias(f"z{j}")]
            else:
                exprs.append(text.alias(f"t{j}"))
        return exprs + [col[f.column].alias(f"m{j}") for j, f in enumerate(self.multi_hot)]

    def encode(self, df: pl.DataFrame) -> tuple[np.ndarray, np.ndarray, list[tuple[np.ndarray, np.ndarray]]]:
        """The model's inputs of raw rows as a file holds them (``raw_rows``), multi-hot features as each one's
        flat ids and values a row (the dataset's form): what ``preprocess table`` writes (its bad rows dropped)."""
        return self._encode(df, self._plan(df.schema, typed=False, nulls_done=True, rows=df.height), None)

    def _timestamps(self) -> list[tuple[str, str]]:
        """The timestamp columns (column, format) whose parts are categorical features, in the features' order."""
        return list(dict.fromkeys((f.column, f.time_format) for f in self.categorical if f.text in PARTS))

    def _inputs(self, rows: pl.DataFrame, plan: list[pl.Expr], bad: BadValues | None
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:  # fmt: skip
        """``_encode``, multi-hot features as (B, Fm, L) ids padded with -1."""
        numerical, categorical, lists = self._encode(rows, plan, bad)
        n = len(categorical)
        bags = None
        if self.multi_hot:
            width = max(1, max((int(lengths.max()) if len(lengths) else 0) for _, lengths in lists))
            bags = np.full((n, len(self.multi_hot), width), -1, np.int64)
            for j, (flat, lengths) in enumerate(lists):
                rows_of = np.repeat(np.arange(n), lengths)
                starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]) if n else np.zeros(0, np.int64)
                place = np.arange(len(flat)) - np.repeat(starts, lengths)
                bags[rows_of, j, place] = flat
        return numerical, categorical, bags

    def _encode(
        self, rows: pl.DataFrame, plan: list[pl.Expr], bad: BadValues | None
    ) -> tuple[np.ndarray, np.ndarray, list[tuple[np.ndarray, np.ndarray]]]:
        """The transform as one eager Polars query (a lazy one's planning costs more than a one-row request's
        work), then NumPy on each kind's columns at once; multi-hot features as (flat ids, values a row). Bad values
        are refused, naming the first (row and column), or (``bad``'s rule "missing") scored as missing, counted."""
        out = rows.select(plan)
        n = int(out["rows"][0]) if len(out) else 0

        def block(prefix: str, indices) -> np.ndarray:
            return np.column_stack([out[f"{prefix}{j}"].to_numpy() for j in indices])

        numerical = np.zeros((n, len(self.numerical)), np.float32)
        checked: list[np.ndarray] = []  # per check of ``_value_checks``, its rows
        if self.numerical:
            every = range(len(self.numerical))
            as_float = block("r", every).astype(np.float64)  # (nulls: NaN)
            unreadable = np.column_stack([out[f"r{j}"].is_null().to_numpy() & ~out[f"u{j}"].to_numpy() for j in every])
            integer = np.array([f.transform == "criteo_log" for f in self.numerical])
            bad_number = bad_numbers(as_float, unreadable, integer)
            checked += list(bad_number.T)
            as_float[bad_number] = np.nan  # (a bad value scored at all: as missing)
            logged = [j for j, f in enumerate(self.numerical) if f.transform == "criteo_log"]
            plain = [j for j, f in enumerate(self.numerical) if f.transform != "criteo_log"]
            if plain:
                numerical[:, plain] = np.nan_to_num(as_float[:, plain], nan=0.0)
            if logged:  # log(max(x, -2) + 3) of the integer, missing as -2 (-> 0)
                from ctrkit.preprocess.criteo import numerical_transform

                numerical[:, logged] = numerical_transform(np.nan_to_num(as_float[:, logged], nan=-2).astype(np.int64))
        categorical = np.zeros((n, len(self.categorical)), np.int64)
        hashed = [j for j in range(len(self.categorical)) if f"h{j}" in out.columns]
        text_missing = {}
        if hashed:
            first, second, missing = block("h", hashed), block("g", hashed), block("z", hashed)
            for k, j in enumerate(hashed):
                index = self._index(self.categorical[j].feature)
                categorical[:, j] = index.lookup(first[:, k], second[:, k], missing[:, k])
                text_missing[j] = missing[:, k]
        for j, f in enumerate(self.categorical):
            if j not in hashed:
                categorical[:, j] = self._ids(f, out[f"t{j}"])
                text_missing[j] = out[f"t{j}"].is_null().to_numpy()
        for k, (column, _) in enumerate(self._timestamps()):  # given, and no part read from it
            part = next(j for j, f in enumerate(self.categorical) if f.text in PARTS and f.column == column)
            checked.append(text_missing[part] & ~out[f"v{k}"].to_numpy())
        for j, f in enumerate(self.categorical):
            if f.text == "hex":  # only a value no vocabulary holds can be no category: those are checked
                checked.append(self._bad_hex(rows, f.column, (categorical[:, j] == MISSING_ID) & ~text_missing[j]))
        for mask, numbers, features in self._bad_values(rows, checked, bad):
            numerical[np.ix_(mask, numbers)] = 0.0  # scored as missing: a number 0, a feature's id the missing one
            categorical[np.ix_(mask, features)] = MISSING_ID
        return numerical, categorical, [self._bag_ids(f, out[f"m{j}"]) for j, f in enumerate(self.multi_hot)]

    @staticmethod
    def _bad_hex(rows: pl.DataFrame, column: str, candidates: np.ndarray) -> np.ndarray:
        """Which rows' ``column`` holds no hexadecimal category (``values.hex_bad``), of the ``candidates``."""
        mask = np.zeros(len(candidates), bool)
        at = np.flatnonzero(candidates)
        if len(at) and column in rows.columns:
            given = rows[column].gather(at).alias("v").to_frame()
            mask[at] = given.select(hex_bad(pl.col("v"))).to_series().to_numpy()
        return mask

    def _bad_values(self, rows: pl.DataFrame, checked: Sequence[np.ndarray], bad: BadValues | None
                    ) -> list[tuple[np.ndarray, list[int], list[int]]]:  # fmt: skip
        """The bad values found (``checked``: per check of ``_value_checks``, its rows), as (rows, numerical
        features, categorical features) to score as missing; raises ``RowError`` for the first (the earliest row,
        then the model's order) unless ``bad`` says "missing", which counts them."""
        if self._checks is None:
            self._checks = self._value_checks()
        found, first = [], None
        for mask, (problem, numbers, features) in zip(checked, self._checks):
            if mask.any():
                i = int(np.argmax(mask))
                if first is None or i < first[0]:
                    first = (i, problem)
                found.append((mask, numbers, features))
        if first is None:
            return []
        i, problem = first
        text = rows[i : i + 1].select(problem()).item()
        if bad is None or bad.rule == "error":
            raise RowError(text, row=i, setting="bad_values")
        bad.add(sum(int(mask.sum()) for mask, _, _ in found), text, row=i)
        return found

    def _value_checks(self) -> list[tuple[Callable[[], pl.Expr], list[int], list[int]]]:
        """Each check ``_encode`` makes, in its order, as (its problem's expression on the raw rows, made only where
        a value is bad; the numerical and categorical features a bad value is missing in)."""
        checks = []
        for j, f in enumerate(self.numerical):
            by_value = [k for k, c in enumerate(self.categorical) if c.text == "number" and c.column == f.column]
            if f.transform == "criteo_log":  # Criteo's integers
                problem = partial(lambda c: pl.coalesce(number_problem(pl.col(c), c), integer_problem(pl.col(c), c)),
                                  f.column)  # fmt: skip
            else:
                problem = partial(lambda c: number_problem(pl.col(c), c), f.column)
            checks.append((problem, [j], by_value))
        for column, time_format in self._timestamps():
            parts = [i for i, c in enumerate(self.categorical) if c.text in PARTS and c.column == column]
            checks.append((partial(lambda c, t: timestamp_problem(pl.col(c), c, t), column, time_format), [], parts))
        for j, f in enumerate(self.categorical):
            if f.text == "hex":  # Criteo's categories
                checks.append((partial(lambda c: hex_problem(pl.col(c), c), f.column), [], [j]))
        return checks

    def index_vocabularies(self) -> None:
        """Builds every vocabulary's lookup index now (each is otherwise built on its first lookup)."""
        for f in [*self.categorical, *self.multi_hot]:
            if getattr(f, "ids", "vocabulary") == "vocabulary":
                self._index(f.feature)

    def _index(self, feature: str) -> ValueIndex:
        if feature not in self._indexes:
            self._indexes[feature] = ValueIndex(self.vocabularies[feature])
        return self._indexes[feature]

    def _ids(self, f: CategoricalInput | MultiHotInput, text: pl.Series) -> np.ndarray:
        rule = getattr(f, "ids", "vocabulary")
        if rule == "xxh64":
            return xxh64_ids(text)
        if rule == "hex_key":
            return hex_key_ids(text)
        return self._index(f.feature)(text)

    def _bag_ids(self, f: MultiHotInput, values: pl.Series) -> tuple[np.ndarray, np.ndarray]:
        """The ids of each row's values (empty values left out) and the number of values a row holds."""
        lists = multi_hot_lists(values, f.separator)
        lengths = lists.list.len().to_numpy().astype(np.int64)
        flat = lists.explode().drop_nulls()
        return self._ids(f, flat.cast(pl.String)), lengths

    # ---- stored forms ----

    def description(self) -> dict[str, Any]:
        """Everything but the vocabularies, as plain values (JSON)."""
        return {
            "format": FORMAT,
            "source": self.source,
            "label": self.label,
            "null_values": list(self.null_values),
            "columns": [{**asdict(c), "role": c.role.value} for c in self.columns],  # plain values: JSON, torch
            "numerical": [asdict(f) for f in self.numerical],
            "categorical": [{k: v for k, v in asdict(f).items() if k != "time_format" or v} for f in self.categorical],
            "multi_hot": [asdict(f) for f in self.multi_hot],
            "rare_values": self.rare_values,
            **({"file_columns": list(self.file_columns), "file_separator": self.file_separator}
               if self.file_columns else {}),
        }  # fmt: skip

    @classmethod
    def from_description(cls, doc: Mapping[str, Any], vocabularies: Mapping[str, pl.DataFrame]) -> RowTransform:
        if doc.get("format") != FORMAT:
            raise ValueError(f"preprocessing record of format {doc.get('format')!r}; this ctrkit reads {FORMAT}")
        return cls(
            doc["source"],
            [Column(**c) for c in doc["columns"]],
            [NumericalInput(**f) for f in doc["numerical"]],
            [CategoricalInput(**f) for f in doc["categorical"]],
            [MultiHotInput(**f) for f in doc["multi_hot"]],
            vocabularies,
            doc.get("null_values") or (),
            doc.get("label"),
            doc.get("rare_values", "rare"),
            doc.get("file_columns") or (CRITEO_FILE_COLUMNS if doc["source"] == CRITEO_SOURCE else ()),
            doc.get("file_separator", "\t" if doc["source"] == CRITEO_SOURCE else ","),
        )  # (a Criteo model's record before file_columns: its files' layout is Criteo's)

    def features(self) -> dict[str, list[str]]:
        """The model's features of each kind, in order (compared with a checkpoint's spec summary)."""
        return {
            "numerical_features": [f.feature for f in self.numerical],
            "categorical_features": [f.feature for f in self.categorical],
            "multi_hot_features": [f.feature for f in self.multi_hot],
        }

    def check_tables(self, num_numerical: int, cardinalities: Sequence[int], multi_hot_cardinalities: Sequence[int],
                     where: str) -> None:  # fmt: skip
        """Raises ValueError when the ids this transform makes do not fit a model's inputs (an export's metadata):
        as many numerical, categorical and multi-hot features, and every vocabulary's ids inside its table."""
        for kind, ours, theirs in (("numerical", len(self.numerical), num_numerical),
                                   ("categorical", len(self.categorical), len(cardinalities)),
                                   ("multi-hot", len(self.multi_hot), len(multi_hot_cardinalities))):  # fmt: skip
            if ours != theirs:
                raise ValueError(f"{where}: the preprocessing makes {ours} {kind} features, the model reads {theirs}: "
                                 "they were not exported together")  # fmt: skip
        tables = [*zip(self.categorical, cardinalities), *zip(self.multi_hot, multi_hot_cardinalities)]
        for f, rows in tables:
            vocab = self.vocabularies.get(f.feature)
            if getattr(f, "ids", "vocabulary") == "vocabulary" and vocab is not None and len(vocab):
                top = int(vocab["id"].max())
                if top >= rows:
                    raise ValueError(f"{where}: the preprocessing gives feature '{f.feature}' ids up to {top}, the "
                                     f"model's table has {rows} rows: they were not exported together")  # fmt: skip

    def to_state(self) -> dict[str, Any]:
        """The checkpoint's form: the description and each vocabulary as tensors (UTF-8 bytes, offsets, ids)."""
        import torch

        vocab = {}
        for feature, v in self.vocabularies.items():
            data, offsets = utf8(v["value"])
            vocab[feature] = {"bytes": torch.from_numpy(data), "offsets": torch.from_numpy(offsets),
                              "ids": torch.from_numpy(v["id"].to_numpy().astype(np.int64))}  # fmt: skip
        return {"description": self.description(), "vocabularies": vocab}

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> RowTransform:
        vocab = {
            feature: vocabulary_frame(strings(v["bytes"].numpy(), v["offsets"].numpy()), v["ids"].numpy())
            for feature, v in state["vocabularies"].items()
        }
        return cls.from_description(state["description"], vocab)

    def write(self, directory: Path) -> list[str]:
        """Writes ``preprocessing.json`` and ``vocabularies.parquet`` (feature, value, id) into ``directory``
        (an export's version); returns the file names."""
        frames = [v.select(pl.lit(f).alias("feature"), "value", "id") for f, v in self.vocabularies.items()]
        table = pl.concat(frames) if frames else pl.DataFrame(schema={"feature": pl.String, "value": pl.String,
                                                                      "id": pl.Int64})  # fmt: skip
        table.write_parquet(directory / "vocabularies.parquet")
        (directory / RECORD_FILE).write_text(json.dumps(self.description(), indent=2) + "\n")
        return [RECORD_FILE, "vocabularies.parquet"]

    @classmethod
    def read(cls, directory: str | os.PathLike) -> RowTransform:
        """The transform ``write`` wrote into ``directory``."""
        directory = Path(directory)
        try:
            doc = json.loads((directory / RECORD_FILE).read_text(encoding="utf-8"))
            table = pl.read_parquet(directory / "vocabularies.parquet")
            parts = table.group_by("feature", maintain_order=True)
            vocab = {str(f[0]): part.select("value", "id") for f, part in parts}
            return cls.from_description(doc, vocab)
        except (OSError, ValueError, KeyError, TypeError, pl.exceptions.PolarsError) as e:
            raise ValueError(f"{directory}: preprocessing record unreadable ({type(e).__name__}: {e})") from None


def from_dataset(directory: str | os.PathLike) -> RowTransform | None:
    """The transform that made the dataset in ``directory`` (its ``preprocessing.json`` and ``vocab/``), or None
    where the dataset has no record (synthetic data, Outbrain, a dataset written by NVIDIA's tools or by an
    older ctrkit)."""
    directory = Path(directory)
    record = directory / RECORD_FILE
    if not record.is_file():
        return None
    try:
        doc = json.loads(record.read_text(encoding="utf-8"))
        with_vocabulary = [f["feature"] for f in doc["categorical"] + doc["multi_hot"]
                           if f.get("ids", "vocabulary") == "vocabulary"]  # fmt: skip
        files = {f: directory / "vocab" / f"{doc['vocab_files'][f]}.parquet" for f in with_vocabulary}
        total = sum(pl.scan_parquet(path).select(pl.len()).collect().item() for path in files.values())
        whole = total <= MAX_CARRIED_VALUES
        vocab = {}
        for feature, path in files.items():
            frame = pl.scan_parquet(path).select("value", "id")
            if not whole:  # the values with a row of their own: as many as the model's table rows
                frame = frame.filter(pl.col("id") >= FIRST_ID)
            v = frame.collect()
            vocab[feature] = vocabulary_frame(v["value"], v["id"])
        doc = {k: v for k, v in doc.items() if k != "vocab_files"}
        return RowTransform.from_description({**doc, "rare_values": "rare" if whole else "missing"}, vocab)
    except (OSError, ValueError, KeyError, TypeError, pl.exceptions.PolarsError) as e:
        raise ValueError(f"{record}: not a preprocessing record ctrkit can read ({type(e).__name__}: {e})") from None


def write_record(directory: Path, transform: RowTransform, vocab_files: Mapping[str, str]) -> None:
    """Writes ``preprocessing.json`` into a dataset directory; ``vocab_files`` names the ``vocab/<name>.parquet``
    file of each feature with a vocabulary."""
    doc = {**transform.description(), "vocab_files": dict(vocab_files)}
    (directory / RECORD_FILE).write_text(json.dumps(doc, indent=2) + "\n")


def multi_hot_lists(values: pl.Series, separator: str) -> pl.Series:
    """A multi-hot column as lists of text values: text split at ``separator`` (or a list column's values as text),
    empty and missing values left out, a missing row an empty list. What the vocabulary is fitted on, and what
    the transform looks up."""
    lists = values.cast(pl.List(pl.String)) if isinstance(values.dtype, pl.List) else values.cast(pl.String)
    lists = lists if isinstance(lists.dtype, pl.List) else lists.str.split(separator)
    return lists.fill_null([]).list.eval(pl.element().filter(pl.element().is_not_null() & (pl.element() != "")))


def category_text(values: pl.Expr, how: str, time_format: str = "") -> pl.Expr:
    """A categorical value as the text its vocabulary holds: as read, a number's text as a float (so that 2 and
    2.0 are one value: ``--also-categorical``), Criteo's lowercase hexadecimal, or a part of a timestamp of
    ``time_format`` (``time_parts``: the hour's "18")."""
    if how in PARTS:
        return part_text(values, how, time_format)
    if how == "number":
        return values.cast(pl.Float64, strict=False).fill_nan(None).cast(pl.String)
    text = values.cast(pl.String)
    return text.str.to_lowercase() if how == "hex" else text


def _series(name: str, given: Any, null_values: frozenset[str]) -> pl.Series:
    """A column's request values as a Series: text (bytes decoded as UTF-8; empty or one of ``null_values``: missing),
    numbers (MISSING_INT64 in an integer tensor: missing), or lists."""
    if isinstance(given, pl.Series):
        return given.alias(name)
    if isinstance(given, np.ndarray) and given.dtype.kind in "fiub":
        series = pl.Series(name, given)
        return series.set(series == MISSING_INT64, None) if given.dtype == np.int64 else series
    values = list(given.tolist() if isinstance(given, np.ndarray) else given)
    try:
        values = [
            None if v in null_values or v == "" else v  # (an empty text: missing, as a file's empty field)
            for v in (v.decode("utf-8") if isinstance(v, (bytes, bytearray)) else v for v in values)
        ]
    except UnicodeDecodeError:
        raise RowError(f"column '{name}': a value is not UTF-8 text") from None
    except TypeError:  # an unhashable value (a list: a multi-hot column's values)
        pass
    try:
        return pl.Series(name, values, strict=False)
    except (TypeError, ValueError, pl.exceptions.PolarsError):
        return pl.Series(name, [None if v is None else str(v) for v in values], dtype=pl.String)


def utf8(values: pl.Series) -> tuple[np.ndarray, np.ndarray]:
    """A String Series as its UTF-8 bytes (uint8) and the (n + 1,) int64 offsets of each value."""
    text = values.fill_null("")
    lengths = text.str.len_bytes().to_numpy().astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    data = "".join(text.to_list()).encode("utf-8")
    return np.frombuffer(data, np.uint8).copy(), offsets


def strings(data: np.ndarray, offsets: np.ndarray) -> pl.Series:
    """The String Series ``utf8`` encoded."""
    raw = data.tobytes()
    if b"\0" not in raw and len(offsets) > 1:  # split in Polars: NUL-separated, every value's end a NUL
        ends = np.asarray(offsets[1:], np.int64)
        marked = np.insert(np.frombuffer(raw, np.uint8), ends[:-1], 0)
        text = marked.tobytes().decode("utf-8")
        values = pl.Series([text]).str.split("\0").explode()
    else:
        values = pl.Series([raw[a:b].decode("utf-8") for a, b in zip(offsets[:-1], offsets[1:])], dtype=pl.String)
    return values.cast(pl.String).alias("value")
