"""The names of a Triton-layout model repository, checked where export writes and serve reads: a model name, a
version and an export's file name are single path components (Triton's rule): no ``/`` or ``\\``, not ``.`` or
``..``, no NUL or other control character, no double quote (``config.pbtxt`` quotes a name); a version is digits, at
most Triton's int64. Every file read or written is resolved and must lie inside the repository, so neither a request
nor a file in the repository reaches outside it.
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
    return name


def check_version(version: str) -> str:
    """``version`` when it is a version number (digits, at most Triton's int64), else a one-line ValueError."""
    if not version.isascii() or not version.isdigit():
        raise ValueError(f"model version {version!r} is not a version number (expected digits, such as '1')")
    if int(version) > MAX_VERSION:
        raise ValueError(f"model version {version} is beyond Triton's largest ({MAX_VERSION}, an int64)")
    return version


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
