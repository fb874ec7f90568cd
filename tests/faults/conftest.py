"""Helpers of the fault-injection suite: what a user sees when something goes wrong."""

from __future__ import annotations

import hashlib
from pathlib import Path


def one_line_error(stderr: str, command: str, *needles: str) -> str:
    """Asserts ``stderr`` ends in one ``ctrkit COMMAND: error: ...`` line with every needle, and holds no
    traceback; returns the line."""
    assert "Traceback" not in stderr, stderr
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    assert lines, "nothing on stderr"
    line = lines[-1]
    assert line.startswith(f"ctrkit {command}: error: "), stderr
    for needle in needles:
        assert needle in line, (needle, line)
    return line


def digest(path: Path) -> dict[str, str]:
    """Content hashes of a file or of every file under a directory (to show nothing was changed)."""
    path = Path(path)
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    return {str(p.relative_to(path.parent)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def hidden_temporaries(directory: Path) -> list[str]:
    return sorted(p.name for p in Path(directory).iterdir() if p.name.startswith(".") and ".tmp-" in p.name)
