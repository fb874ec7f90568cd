"""Option groups shared by the commands, built once; flags generated from the config dataclasses."""

from __future__ import annotations

import argparse
import json
import typing
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any

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


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _scalar_type(hint: Any) -> type:
    """bool, int, float or str from a field's type hint such as ``int | None``."""
    for t in (bool, int, float, str):
        if t in (typing.get_args(hint) or (hint,)):
            return t
    raise TypeError(f"no command-line type for {hint!r}")


def add_config_flags(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    cls: type,
    exclude: tuple[str, ...] = (),
    suppress: bool = False,
) -> None:
    """One flag per field of config dataclass ``cls`` (``--field-name``), typed, with the field's choices
    and help and its default said in the help. With ``suppress``, a flag not given is absent from the
    parsed namespace (so a YAML config can supply it before the default applies)."""
    hints = typing.get_type_hints(cls)
    for f in fields(cls):
        if f.name in exclude:
            continue
        meta = f.metadata
        default = None if f.default is MISSING else f.default
        kind = _scalar_type(hints[f.name])
        said = meta.get("unset") if default is None else (default if kind is not bool else None)
        help_text = meta.get("help", "") + (f" (default: {said})" if said is not None else "")
        kwargs: dict[str, Any] = {"help": help_text.replace("%", "%%"), "default": SUPPRESS if suppress else default}
        if kind is bool:
            kwargs["action"] = "store_true"
        else:
            kwargs["type"] = kind
            if meta.get("choices"):
                kwargs["choices"] = meta["choices"]
        parser.add_argument(flag(f.name), dest=f.name, **kwargs)


def config_values(args: argparse.Namespace, cls: type) -> dict[str, Any]:
    """The fields of ``cls`` present in ``args``."""
    return {f.name: getattr(args, f.name) for f in fields(cls) if hasattr(args, f.name)}


def add_device(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="auto", help="auto (CUDA if present, else CPU), cpu, cuda, cuda:N")


def add_threads(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's choice)")


def add_seed(parser: argparse.ArgumentParser, what: str = "random seed") -> None:
    parser.add_argument("--seed", type=int, default=0, help=f"{what} (default 0)")


def add_overwrite(parser: argparse.ArgumentParser, what: str = "an existing output directory") -> None:
    parser.add_argument("--overwrite", action="store_true", help=f"replace {what}")


def add_output(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--output", type=Path, default=None, help="write the results as JSON here")


def add_no_progress(parser: argparse.ArgumentParser, what: str = "no progress bar") -> None:
    parser.add_argument("--no-progress", action="store_true", help=what)


def add_checkpoint_dataset(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint", required=True, type=Path, help="checkpoint written by `ctrkit train`")
    parser.add_argument("--dataset", required=True, type=Path, help="dataset directory holding feature_spec.yaml")


def write_result(result: dict | list, path: Path | None) -> None:
    """Writes a benchmark result as JSON when ``--output`` was given."""
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
        print(f"wrote {path}")
