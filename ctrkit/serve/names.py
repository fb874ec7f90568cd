"""The names of a Triton-layout model repository, checked where export writes and serve reads: a model name, a
version and an export's file name are single path components (Triton's rule): no ``/`` or ``\\``, not ``.`` or
``..``, no NUL or other control character, no double quote (``config.pbtxt`` quotes a name); a version is a number
from 1 to Triton's largest int64, spelled one way: its decimal digits without leading zeros (``version_number``, the
one parser of version names: a directory ``01`` is no version, a request for ``01`` is refused). Every file read or
written is resolved and must lie inside the repository, so neither a request nor a file in the repository reaches
outside it.
"""

from __future__ import annotations

import os
from pathlib import Path

MAX_VERSION = 2**63 - 1  # Triton's versions are int64


def check_name(name: str, what: str = "model name") -> str:
    """``name`` when it is one path component; a one-line ValueError saying what is wrong otherwise."""
    if not name:
        raise ValueError(f"{what} is empty; expected a name such as 'dlrm'")
    bad = next((c for c in name if ord(c) < 32 or ord(c) == 127), None)
    if bad is not None:
        raise ValueError(f"{what} {name!r} holds the control character {bad!r}; expected one path component")
    if "/" in name or "\\" in name or name in (".", ".."):
        raise ValueError(f"{what} {name!r} is not one path component (no '/', '\\', '.' or '..')")
    if '"' in name:
        raise ValueError(f"{what} {name!r} holds a double quote, which config.pbtxt's quoted name cannot hold")
    if name.startswith("."):
        raise ValueError(f"{what} {name!r} starts with '.': a hidden name, and the form ctrkit's temporary files take "
                         "(a stale one is removed); name it without the dot")  # fmt: skip
    return name


def version_number(name: str) -> int | None:
    """The version a name spells (a directory's, a request's), or None where it spells none: decimal digits
    without leading zeros, from 1 to Triton's largest (an int64)."""
    if not name.isascii() or not name.isdigit() or name[0] == "0" or len(name) > len(str(MAX_VERSION)):
        return None
    number = int(name)
    return number if number <= MAX_VERSION else None


def check_version(version: str) -> str:
    """``version`` when it spells a version (``version_number``), else a one-line ValueError."""
    if version_number(version) is None:
        raise ValueError(f"model version {version!r} is not a version number (expected 1 to {MAX_VERSION} in digits "
                         "without leading zeros, such as '1')")  # fmt: skip
    return version


def version_dirs(folder: Path) -> dict[int, Path]:
    """A model directory's versions: number -> directory, for the subdirectories whose names spell one."""
    found = {}
    for p in folder.iterdir():
        number = version_number(p.name)
        if number is not None and p.is_dir():
            found[number] = p
    return dict(sorted(found.items()))


def inside(root: Path, path: Path) -> Path:
    """``path`` resolved, when it lies inside ``root`` (resolved); a one-line ValueError otherwise (a
    symbolic link or a name leading out of the repository)."""
    resolved, top = path.resolve(), root.resolve()
    if resolved != top and top not in resolved.parents:
        raise ValueError(f"{path}: resolves to {resolved}, outside the model repository {top}")
    return resolved


def find_model_dir(model_dir: str | os.PathLike) -> Path:
    """The directory holding ``ctrkit_model.json`` in an export (itself, or the one model of a Triton repo)."""
    root = Path(model_dir)
    if (root / "ctrkit_model.json").exists():
        return root
    found = sorted(p.parent for p in root.glob("*/ctrkit_model.json"))
    if len(found) != 1:
        raise ValueError(
            f"{root}: expected an export written by `ctrkit export` (ctrkit_model.json here or in one model "
            f"directory), found {len(found)}"
        )
    return found[0]
