"""Files and directories that appear only when complete (temp beside the target, then rename)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_directory(out_dir: str | os.PathLike, overwrite: bool = False) -> Iterator[Path]:
    """Yields a temporary directory beside ``out_dir`` and renames it to ``out_dir`` on success.

    An interrupted or failed write leaves no directory that looks complete: the temporary one is
    removed, and an existing ``out_dir`` is replaced only at the end (and only with ``overwrite``).

    Raises:
        ValueError: ``out_dir`` exists, is not empty, and ``overwrite`` is False.
    """
    out = Path(out_dir)
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise ValueError(f"{out}: directory exists and is not empty; set `overwrite` to replace it")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.tmp-"))
    try:
        yield tmp
        os.chmod(tmp, 0o755)  # mkdtemp creates 0700
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


@contextmanager
def atomic_file(path: str | os.PathLike) -> Iterator[Path]:
    """Yields a temporary path beside ``path``; when the block succeeds, fsyncs it and renames it to
    ``path`` (mode 0644). On failure the temporary file is removed and ``path`` is untouched."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp creates 0600
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
