"""Option groups shared by the commands, built once; flags generated from the config dataclasses."""

from __future__ import annotations

import argparse
import inspect
import json
import math
import typing
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any

from ctrkit.field_types import Range, check_ranges

SUPPRESS = argparse.SUPPRESS


def int_list(text: str) -> tuple[int, ...]:
    """argparse type: comma-separated integers."""
    try:
        values = tuple(int(x) for x in text.replace(" ", "").split(",") if x)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got '{text}'") from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one integer")
    return values


def name_list(text: str) -> tuple[str, ...]:
    """argparse type: comma-separated names."""
    values = tuple(x.strip() for x in text.split(",") if x.strip())
    if not values:
        raise argparse.ArgumentTypeError("expected at least one name")
    return values


def names_or_none(text: str) -> tuple[str, ...]:
    """argparse type: comma-separated names, or ``none`` for none."""
    return () if text.strip() == "none" else name_list(text)


def table_sizes(text: str) -> tuple[int, ...]:
    """argparse type: comma-separated cardinalities, or the name of a preset (``TABLE_PRESETS``)."""
    from ctrkit.data.synthetic import TABLE_PRESETS

    if text in TABLE_PRESETS:
        return TABLE_PRESETS[text]
    if text and not text.replace(",", "").replace(" ", "").isdigit():
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers or one of {', '.join(TABLE_PRESETS)}, got '{text}'"
        )
    return int_list(text)


PARSERS = {"int_list": int_list, "name_list": name_list, "names_or_none": names_or_none, "table_sizes": table_sizes}


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _scalar_type(hint: Any) -> type:
    """bool, int, float, str or Path from a field's type hint such as ``int | None`` (the items' type
    for ``tuple[Path, ...]``, a flag taking several values)."""
    given = typing.get_args(hint) if typing.get_origin(hint) is not tuple else (hint,)
    options = [typing.get_args(o)[0] if typing.get_origin(o) is tuple else o for o in given or (hint,)]
    for t in (bool, int, float, str, Path):
        if t in options:
            return t
    raise TypeError(f"no command-line type for {hint!r}")


def finite_number(text: str) -> float:
    """Every float flag's value: a finite number. NaN and the infinities are refused here, for every flag at once (no
    flag means them; a window or timeout of NaN hung the server)."""
    value = float(text)  # a ValueError: argparse's "invalid finite_number value"
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def bounded(kind: type, bounds: Range) -> Any:
    """argparse type: an integer (``kind`` int) or a finite number within ``bounds``, refused in one line saying the
    range (the field's ``bounds``, ``config.option``)."""

    def parse(text: str) -> Any:
        try:
            value = int(text) if kind is int else finite_number(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {bounds.words(kind is int)}, got {text!r}") from None
        if not bounds.holds(value):
            raise argparse.ArgumentTypeError(f"expected {bounds.words(kind is int)}, got {text!r}")
        return value

    parse.__name__ = "int" if kind is int else "number"
    parse.bounds = bounds  # type: ignore[attr-defined]  # read by the test that every numeric flag has a range
    return parse


def _said(value: Any) -> str:
    return ",".join(map(str, value)) if isinstance(value, tuple) else str(value)


def add_config_flags(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    cls: type,
    exclude: tuple[str, ...] = (),
    suppress: bool = False,
) -> None:
    """One argument per field of config dataclass ``cls`` (``--field-name``), typed, with the field's
    choices and help and its default said in the help (see ``config.option`` for the spellings a field
    may ask for). With ``suppress``, a flag not given is absent from the parsed namespace (so a YAML
    config can supply it before the default applies)."""
    hints = typing.get_type_hints(cls)
    groups: dict[str, Any] = {}
    paths = dict(parser.get_default(PATHS) or {})  # dest -> what the command does with the path (``check_paths``)
    for f in fields(cls):
        if f.name in exclude:
            continue
        meta = f.metadata
        default = None if f.default is MISSING else f.default
        kind = PARSERS[meta["parse"]] if "parse" in meta else _scalar_type(hints[f.name])
        if kind is Path:
            paths[f.name] = meta.get("writes") or "reads"
        said = meta.get("shown") or (meta.get("unset") if default is None else None)
        if said is None and default not in (None, ()) and kind is not bool and not meta.get("required"):
            said = _said(default)
        help_text = meta.get("help", "") + (f" (default: {said})" if said is not None else "")
        kwargs: dict[str, Any] = {"help": argparse.SUPPRESS if meta.get("hidden") else help_text.replace("%", "%%")}
        kwargs["default"] = SUPPRESS if suppress or meta.get("suppress") else default
        if kind is bool:  # on by default: --name / --no-name
            kwargs["action"] = argparse.BooleanOptionalAction if default is True else "store_true"
        else:
            kwargs["type"] = finite_number if kind is float else kind
            if meta.get("bounds") is not None and kind in (int, float):
                kwargs["type"] = bounded(kind, meta["bounds"])
            if meta.get("choices"):
                kwargs["choices"] = meta["choices"]
            if meta.get("nargs"):
                kwargs["nargs"] = meta["nargs"]
        target = parser
        if meta.get("exclusive"):
            if meta["exclusive"] not in groups:
                required = any(g.metadata.get("exclusive") == meta["exclusive"] and g.metadata.get("required")
                               for g in fields(cls))  # fmt: skip
                groups[meta["exclusive"]] = parser.add_mutually_exclusive_group(required=required)
            target = groups[meta["exclusive"]]
        elif meta.get("required"):
            kwargs["required"] = True
        if meta.get("positional"):
            kwargs.setdefault("nargs", "?")
            if kwargs["nargs"] == "+":
                kwargs.pop("default")
            target.add_argument(f.name, **kwargs)
        else:
            target.add_argument(flag(f.name), dest=f.name, **kwargs)
    parser.set_defaults(**{PATHS: paths})


PATHS = "_paths"  # the parsed arguments' record of each path flag's role


def check_paths(args: argparse.Namespace) -> None:
    """Refuses, in one line, a path the command writes (a field's ``writes``) that names one of its inputs: the same
    file, or a directory an input lies in (``atomic.check_output``); a resumed run may save over the checkpoint it
    resumed from (an input whose field ``writes`` "over")."""
    from ctrkit.data.atomic import check_output

    roles: dict[str, str] = getattr(args, PATHS, None) or {}

    def given(dest: str) -> list[Path]:
        value = getattr(args, dest, None)
        values = value if isinstance(value, (tuple, list)) else [value]
        return [Path(v) for v in values if isinstance(v, (str, Path))]

    for dest, role in roles.items():
        if role in ("file", "directory"):
            inputs = [p for name, kind in roles.items() if kind == "reads" or kind == "over" and role == "directory"
                      for p in given(name)]  # fmt: skip
            for out in given(dest):
                try:
                    check_output(out, inputs)
                except ValueError as e:
                    raise ValueError(f"`{dest}` {e}") from None


def config_from(args: argparse.Namespace, cls: type) -> Any:
    """The config ``cls`` of the parsed arguments (fields not given keep their defaults), validated."""
    cfg = cls(**config_values(args, cls))
    check_ranges(cfg)
    if hasattr(cfg, "validate"):
        cfg.validate()
    return cfg


def config_values(args: argparse.Namespace, cls: type) -> dict[str, Any]:
    """The fields of ``cls`` present in ``args``."""
    return {f.name: getattr(args, f.name) for f in fields(cls) if hasattr(args, f.name)}


def write_result(result: dict | list, path: Path | None) -> None:
    """Writes a benchmark result as JSON when ``--output`` was given."""
    if path is not None:
        from ctrkit.data.atomic import atomic_file

        with atomic_file(path) as tmp:
            tmp.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
        print(f"wrote {path}")


def add_command(
    sub: argparse._SubParsersAction,
    name: str,
    handler: Any,
    configs: tuple[type, ...],
    exclude: tuple[str, ...] = (),
) -> argparse.ArgumentParser:
    """A subcommand whose arguments are the fields of ``configs``, run by ``handler``; the handler's
    docstring is its help (the first line) and description (the rest)."""
    doc = inspect.cleandoc(handler.__doc__ or "")
    summary, _, details = doc.partition("\n\n")
    # argparse %-formats a help string ("5%" would fail): a literal percent sign is written twice
    parser = sub.add_parser(name, help=summary.replace("%", "%%"), description=" ".join(details.split()) or None)
    for cls in configs:
        add_config_flags(parser, cls, exclude)
    parser.set_defaults(handler=handler)
    return parser
