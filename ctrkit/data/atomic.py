"""Files and directories that appear only when complete (temp beside the target, then rename), and a
lock file that keeps two live processes from writing the same path.

Temporary names carry the writer's pid (``.NAME.tmp-PID-XXXX``); a later write to the same target
removes the ones whose process is gone (a killed writer cannot clean up after itself). Pids are this
machine's: on a filesystem shared between machines, remove stale temporaries by hand.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

# errors of the disk, not of the data: the write cannot succeed there, whatever is written
DISK_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EFBIG}
# the same errors as libraries word them without an errno (torch.save's writer, Polars' and Arrow's Rust I/O)
DISK_MESSAGES = {
    "No space left on device": "no space left on device",
    "os error 28": "no space left on device",
    "unexpected pos": "no space left on device",  # torch.save's zip writer when a write came up short
    "Read-only file system": "read-only file system",
    "os error 30": "read-only file system",
    "Permission denied": "permission denied",
    "Disk quota exceeded": "disk quota exceeded",
}


class DiskError(ValueError):
    """A write that failed for lack of space or permission; says which file, what it needed and what was kept."""


def _reason(e: BaseException) -> str | None:
    if isinstance(e, OSError) and e.errno in DISK_ERRNOS:
        return (e.strerror or os.strerror(e.errno)).lower()
    text = str(e)
    return next((why for needle, why in DISK_MESSAGES.items() if needle in text), None)


def _size(path: Path) -> int:
    try:
        if path.is_dir():
            return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
        return path.stat().st_size
    except OSError:
        return 0


def free_bytes(path: Path) -> int | None:
    """Bytes free to this user on the file system holding ``path`` (or its nearest existing parent)."""
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def _mib(n: int) -> str:
    """``n`` bytes for people: KiB below a MiB, GiB from one GiB."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20)):
        if n >= size:
            return f"{n / size:,.1f} {unit}"
    return f"{n / 2**10:,.0f} KiB"


def disk_error(e: BaseException, target: Path, written: int, needs: int | None) -> DiskError | None:
    """``e`` as a one-line DiskError naming ``target`` when it is a disk's error (full, read-only, no
    permission), else None. ``written``: bytes the failed write had put down; ``needs``: its estimate."""
    reason = _reason(e)
    if reason is None:
        return None
    kept = f"; the previous {target.name} is intact" if target.exists() else ""
    if reason not in ("no space left on device", "disk quota exceeded", "file too large"):
        return DiskError(f"{target}: cannot write it: {reason}{kept}")
    free = free_bytes(target.parent)
    need = f"it needs about {_mib(needs)}" if needs else f"it had written {_mib(written)} when the write failed"
    room = f", {_mib(free)} free there" if free is not None else ""
    return DiskError(f"{target}: cannot write it: {reason} ({need}{room}){kept}; free some space or write elsewhere")


def check_room(target: Path, needs: int | None) -> None:
    """Refuses, before writing, a write of about ``needs`` bytes where the disk has less free."""
    free = free_bytes(Path(target).parent)
    if needs and free is not None and free < needs:
        kept = f"; the previous {Path(target).name} is intact" if Path(target).exists() else ""
        raise DiskError(
            f"{target}: cannot write it: not enough space (it needs about {_mib(needs)}, {_mib(free)} free there)"
            f"{kept}; free some space or write elsewhere"
        )


def check_new_directory(out: Path, overwrite: bool) -> None:
    """Refuses an output directory that exists and is not empty unless ``overwrite`` (a ValueError naming it): what
    a long write checks before its work, and ``atomic_directory`` again at its start."""
    if out.exists() and not out.is_dir() and not overwrite:
        raise ValueError(f"{out}: is a file, not a directory; name a directory to create (or set `overwrite` to "
                         "replace the file)")  # fmt: skip
    if out.exists() and out.is_dir() and any(out.iterdir()) and not overwrite:
        raise ValueError(f"{out}: directory exists and is not empty; set `overwrite` to replace it")
    here, target = Path.cwd().resolve(), out.resolve()
    if out.exists() and (target == here or target in here.parents):
        raise ValueError(f"{out}: is the current directory or holds it; replacing it would delete it (and whatever "
                         "else it holds): name a new directory")  # fmt: skip


@contextmanager
def atomic_directory(out_dir: str | os.PathLike, overwrite: bool = False, needs: int | None = None) -> Iterator[Path]:
    """Yields a temporary directory beside ``out_dir`` and renames it to ``out_dir`` on success.

    An interrupted or failed write leaves no directory that looks complete: the temporary one is
    removed, and an existing ``out_dir`` is replaced only at the end (and only with ``overwrite``): a
    directory that another process made meanwhile is never removed without ``overwrite``.
    A full, read-only or forbidden disk is a ``DiskError`` naming ``out_dir`` and what it needed
    (``needs``, an estimate in bytes, is also checked against the free space before anything is written).

    Raises:
        ValueError: ``out_dir`` exists, is not empty, and ``overwrite`` is False.
        DiskError: the disk refused the write.
    """
    out = Path(out_dir)
    check_new_directory(out, overwrite)
    check_room(out, needs)
    tmp = _temporary(out, lambda: Path(tempfile.mkdtemp(dir=out.parent, prefix=temporary_prefix(out))))
    try:
        yield tmp
        os.chmod(tmp, 0o755)  # mkdtemp creates 0700
        if out.exists() and overwrite:
            shutil.rmtree(out)
        try:
            os.replace(tmp, out)  # fails on a directory that is not empty: one that appeared meanwhile
        except OSError as e:
            if e.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
                raise
            raise ValueError(
                f"{out}: appeared while this was written (another process?); it is left as it is and this "
                "result discarded; set `overwrite` to replace it, or write elsewhere"
            ) from None
    except BaseException as e:
        written = _size(tmp)
        shutil.rmtree(tmp, ignore_errors=True)
        problem = disk_error(e, out, written, needs)
        if problem is not None:
            raise problem from None
        raise


@contextmanager
def atomic_file(path: str | os.PathLike, needs: int | None = None) -> Iterator[Path]:
    """Yields a temporary path beside ``path``; when the block succeeds, fsyncs it and renames it to
    ``path`` (mode 0644). On failure the temporary file is removed and ``path`` is untouched; a full,
    read-only or forbidden disk is a ``DiskError`` as for ``atomic_directory``."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{path}: is a directory; expected the path of a file to write")
    check_room(path, needs)

    def make() -> Path:
        fd, name = tempfile.mkstemp(dir=path.parent, prefix=temporary_prefix(path))
        os.close(fd)
        return Path(name)

    tmp = _temporary(path, make)
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp creates 0600
        os.replace(tmp, path)
    except BaseException as e:
        written = _size(tmp)
        tmp.unlink(missing_ok=True)
        problem = disk_error(e, path, written, needs)
        if problem is not None:
            raise problem from None
        raise


def append_text(path: str | os.PathLike, text: str) -> None:
    """Appends ``text`` to ``path`` (a log: each record whole on its own line); a full, read-only or
    forbidden disk is a DiskError naming the file."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as f:
            f.write(text)
    except OSError as e:
        problem = disk_error(e, path, 0, None)
        if problem is not None:
            raise problem from None
        raise


NAME_BYTES = 255  # the longest file name the file systems take
TEMPORARY_BYTES = 48  # what a temporary's name adds around its target's: ".", ".tmp-PID-", the random part, "parts-"


def check_target_name(target: Path) -> None:
    """Refuses a target whose temporaries' names could not be made (a name of more than NAME_BYTES -
    TEMPORARY_BYTES bytes), in words naming it, rather than an error naming a temporary."""
    size = len(target.name.encode("utf-8", "surrogateescape"))
    if size > NAME_BYTES - TEMPORARY_BYTES:
        raise ValueError(f"{target}: its name is {size} bytes; at most {NAME_BYTES - TEMPORARY_BYTES} are taken (its "
                         f"temporary's name, {TEMPORARY_BYTES} bytes longer, must fit the file system's "
                         f"{NAME_BYTES}): choose a shorter name")  # fmt: skip


def _temporary(target: Path, make) -> Path:
    """``make()``'s temporary beside ``target`` (its parent created), a disk's refusal as a DiskError."""
    check_target_name(target)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(target)
        return make()
    except OSError as e:
        problem = disk_error(e, target, 0, None)
        if problem is not None:
            raise problem from None
        raise


def temporary_prefix(target: Path) -> str:
    """How a temporary of ``target`` written by this process is named (``remove_stale_temporaries`` reads it back)."""
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
    removed: list[Path] = []
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
        for _ in range(2):
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
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
            except OSError as e:  # a read-only or full disk
                problem = disk_error(e, self.target, 0, None)
                raise problem if problem is not None else e from None
            try:
                with os.fdopen(fd, "w") as f:
                    f.write(f"{os.getpid()}\n")
            except OSError as e:  # a full disk: no lock left behind, the target named
                self.path.unlink(missing_ok=True)
                problem = disk_error(e, self.target, 0, None)
                raise problem if problem is not None else e from None
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


def check_output(out: Path, inputs: Iterable[Path]) -> None:
    """Raises ValueError where writing ``out`` (a file, or a directory a command replaces) would overwrite or
    delete one of ``inputs``: the same file, or a directory that holds it."""
    target = Path(os.path.abspath(out))
    for given in inputs:
        source = Path(os.path.abspath(given))
        same = source == target or (out.exists() and source.exists() and os.path.samefile(source, out))
        if same or target in source.parents:
            what = "is" if same else "holds"
            raise ValueError(f"{out}: the output {what} the input {given}; writing it would destroy the input: "
                             "choose another output path")  # fmt: skip
