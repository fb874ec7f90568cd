"""Files and directories that appear only when complete (temp beside the target, then rename), and a
lock file that keeps two live processes from writing the same path.

Temporary names carry the writer's pid (``.NAME.tmp-PID-XXXX``); a later write to the same target
removes the ones whose process is gone (a killed writer cannot clean up after itself). Pids are this
machine's: on a filesystem shared between machines, remove stale temporaries by hand.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
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
    remove_stale_temporaries(out)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=_prefix(out)))
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
    remove_stale_temporaries(path)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=_prefix(path))
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


def _prefix(target: Path) -> str:
    return f".{target.name}.tmp-{os.getpid()}-"


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid runs on this machine."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def remove_stale_temporaries(target: Path) -> list[Path]:
    """Removes the temporaries that writers of ``target`` left when they were killed; returns them."""
    removed = []
    pattern = re.compile(re.escape(f".{target.name}.tmp-") + r"(\d+)-")
    try:
        siblings = list(target.parent.iterdir())
    except OSError:
        return removed
    for p in siblings:
        m = pattern.match(p.name)
        if m and not pid_alive(int(m[1])):
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
            removed.append(p)
    return removed


class PathLock:
    """``PATH.lock`` holding the pid of the live process that writes ``PATH``: a second process asking
    for it gets a ValueError naming the holder; a lock whose process is gone is taken over.

    Use as a context manager, or ``acquire()`` / ``release()``.
    """

    def __init__(self, path: str | os.PathLike, what: str = "file"):
        self.target = Path(path)
        self.path = self.target.with_name(self.target.name + ".lock")
        self.what = what
        self.held = False

    def acquire(self) -> PathLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                holder = self._holder()
                if holder is None and self._young():
                    holder = -1  # just created, its pid not yet written: held
                if holder == -1 or holder is not None and pid_alive(holder) and holder != os.getpid():
                    raise ValueError(
                        f"{self.target}: another live process (pid {holder if holder > 0 else '?'}) is writing "
                        f"this {self.what}; "
                        f"wait for it, stop it, or choose another path (lock: {self.path})"
                    ) from None
                self.path.unlink(missing_ok=True)  # its holder is gone: take the lock over
                continue
            with os.fdopen(fd, "w") as f:
                f.write(f"{os.getpid()}\n")
            self.held = True
            return self
        raise ValueError(f"{self.target}: could not take the lock {self.path}; another process keeps taking it")

    def _holder(self) -> int | None:
        try:
            return int(self.path.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None  # being written, or garbage: treated as stale

    def _young(self, seconds: float = 5.0) -> bool:
        try:
            return time.time() - self.path.stat().st_mtime < seconds
        except OSError:
            return False

    def release(self) -> None:
        if self.held:
            self.held = False
            if self._holder() == os.getpid():
                self.path.unlink(missing_ok=True)

    def __enter__(self) -> PathLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
