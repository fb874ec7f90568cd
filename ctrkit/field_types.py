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
    """A one-line ValueError for the first of ``values`` that is not of its field's type in dataclass ``cls``
    (unknown keys are left to the caller)."""
    hints = _hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
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


def _shown(value: Any) -> str:
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
