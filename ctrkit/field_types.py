"""Values from YAML or Python checked against a config dataclass's field types, each mismatch one line naming the
field, what it holds and what it takes (rather than a TypeError deep in training).

Understood: bool, int, float (an int is a float too), str, Path (text), ``X | None``, ``tuple[X, ...]`` and lists,
dicts, ``Any``; a field of another type is not checked.
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any


@cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def conforms(value: Any, hint: Any) -> bool:
    """Whether ``value`` is of the type ``hint`` (as the module's docstring says)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(conforms(value, a) for a in args)
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:  # a finite number: no field means NaN or the infinities
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if hint is str:
        return isinstance(value, str)
    if hint is Path:
        return isinstance(value, (str, Path))
    if origin in (tuple, list) or hint in (tuple, list):
        if not isinstance(value, (list, tuple)):
            return False
        if len(args) == 2 and args[1] is Ellipsis or origin is list and len(args) == 1:
            return all(conforms(v, args[0]) for v in value)
        return not args or len(args) == len(value) and all(conforms(v, a) for v, a in zip(value, args))
    if origin is dict or hint is dict:
        return isinstance(value, dict)
    return True


def describe(hint: Any) -> str:
    """``hint`` in words: "an integer", "a list of numbers", "text or nothing"."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        kinds = [describe(a) for a in args if a is not type(None)]
        return " or ".join(kinds) + (" or nothing (null)" if type(None) in args else "")
    if origin in (tuple, list) and args:
        return f"a list of {_plural(describe(args[0]))}"
    names = {bool: "true or false", int: "an integer", float: "a finite number", str: "text", Path: "a path",
             dict: "a mapping", tuple: "a list", list: "a list"}  # fmt: skip
    return names.get(hint, getattr(hint, "__name__", str(hint)))


def _plural(kind: str) -> str:
    return {"an integer": "integers", "a finite number": "finite numbers", "text": "texts", "a path": "paths"}.get(
        kind, kind
    )


def check_fields(cls: type, values: dict[str, Any], where: str) -> None:
    """A one-line ValueError for the first of ``values`` that is not of its field's type in dataclass ``cls``, or
    outside its stated ``bounds`` (``Range``; unknown keys are left to the caller)."""
    hints = _hints(cls)
    fields_of = {f.name: f for f in dataclasses.fields(cls)}
    known = set(fields_of)
    for key, value in values.items():
        if key in known and not conforms(value, hints[key]):
            note = ""
            if isinstance(value, str) and conforms(1.5, hints[key]):
                try:
                    float(value)
                    note = " (YAML reads a number such as 1e-3 as text: write 1.0e-3)"
                except ValueError:
                    pass
            raise ValueError(f"{where}: '{key}' holds {_shown(value)}; expected {describe(hints[key])}{note}")
        bounds = fields_of[key].metadata.get("bounds") if key in known else None
        if bounds is not None and isinstance(value, (int, float)) and not isinstance(value, bool):
            if not bounds.holds(value):
                integer = isinstance(value, int) and not conforms(1.5, hints[key])
                raise ValueError(f"{where}: '{key}' holds {_shown(value)}; expected {bounds.words(integer)}")


def _shown(value: Any) -> str:
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


INT64_MAX = 2**63 - 1


@dataclass(frozen=True)
class Range:
    """The values a numeric setting may take, stated beside its field (``config.option``'s ``bounds``): from ``lo`` to
    ``hi``, each end included unless ``lo_open`` / ``hi_open``. The command line's flags (``cli/options.py``) and
    every config's ``check_ranges`` read it, so a range is stated once."""

    lo: float
    hi: float
    lo_open: bool = False
    hi_open: bool = False
    unit: str = ""  # what a value counts, said in the refusal ("seconds", "MB")

    def holds(self, value: float) -> bool:
        above = value > self.lo if self.lo_open else value >= self.lo
        below = value < self.hi if self.hi_open else value <= self.hi
        return bool(above and below)

    def words(self, integer: bool) -> str:
        """The range in words: "an integer from 1 to 4096", "a number above 0 and at most 86400 (seconds)"."""
        kind = "an integer" if integer else "a number"
        low = f"above {_number(self.lo)}" if self.lo_open else f"from {_number(self.lo)}"
        high = f"below {_number(self.hi)}" if self.hi_open else f"to {_number(self.hi)}"
        if self.lo_open and not self.hi_open:
            high = f"and at most {_number(self.hi)}"
        elif self.hi_open and self.lo_open:
            high = f"and below {_number(self.hi)}"
        return f"{kind} {low} {high}" + (f" ({self.unit})" if self.unit else "")

    def check(self, name: str, value: float, integer: bool = True) -> None:
        """A one-line ValueError where ``value`` of the setting ``name`` lies outside the range: ``check_ranges``'
        check of a config's fields, and a library function's or recipe's that a caller may reach without a config."""
        number = isinstance(value, int) if integer else isinstance(value, (int, float))
        if isinstance(value, bool) or not number or not (math.isfinite(value) and self.holds(value)):
            raise ValueError(f"`{name}`: expected {self.words(integer)}, got {value!r}")


def _number(value: float) -> str:
    if value == INT64_MAX:
        return "2^63-1"
    if float(value).is_integer() and abs(value) < 1e16:
        return f"{int(value)}"
    return f"{value:g}"


# ranges shared by many settings
COUNT = Range(1, INT64_MAX)  # a number of rows, steps, items: at least one, as many as an int64 holds
NON_NEGATIVE = Range(0, INT64_MAX)
SEED = Range(0, 2**32 - 1)  # every generator ctrkit seeds takes these
FRACTION = Range(0.0, 1.0, lo_open=True, hi_open=True)  # a share strictly between none and all
SHARE = Range(0.0, 1.0)  # a share, none and all included
THREADS = Range(1, 4096)
SECONDS = Range(0.0, 7 * 86400.0, lo_open=True, unit="seconds")  # a timeout: above 0, at most a week
FREQUENCY_THRESHOLD = Range(1, 2**31 - 1)  # a recipe's FL: rarer values share one id (every source's recipe)
CTR_FOLDS = Range(2, 1000)  # Outbrain's CTR statistics: the training displays' folds
ROW_BLOCK = Range(1, 2**31 - 1)  # rows worked on at a time (a block's row index fits an int32)


def check_ranges(config: Any) -> None:
    """A one-line ValueError for the first numeric field of the config dataclass ``config`` outside its stated
    ``bounds`` (None: unset, not checked)."""
    for f in dataclasses.fields(config):
        bounds = f.metadata.get("bounds")
        value = getattr(config, f.name)
        if bounds is None or value is None:
            continue
        integer = not conforms(1.5, _hints(type(config))[f.name])  # type: ignore[arg-type]  # (a class is hashable)
        bounds.check(f.name, value, integer)
