"""A real memory cgroup (v1 or v2) for measuring and testing runs under a memory limit: made, used, removed.

Making one needs root (or a delegated cgroup tree); ``MemoryCgroup`` raises PermissionError where the machine has
no memory controller and OSError where it may not make one, so callers can skip.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
import uuid
from pathlib import Path


class Measured(subprocess.CompletedProcess):
    """A command run in a memory cgroup (``run``), with the group's ``peak_bytes`` (page cache included; None where
    the kernel keeps no peak) and ``peak_anonymous_bytes`` (sampled)."""

    peak_bytes: int | None = None
    peak_anonymous_bytes: int = 0


class MemoryCgroup:
    """A memory cgroup of ``limit`` bytes, removed by ``close``; ``timeout``: the seconds a ``run`` may take unless
    it says otherwise (None: no limit).

    Attributes:
        dir: the group's directory.
    """

    def __init__(self, limit: int, prefix: str = "ctrkit", timeout: float | None = None):
        self.timeout = timeout
        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        v2 = Path("/sys/fs/cgroup/cgroup.controllers")
        if Path("/sys/fs/cgroup/memory").is_dir():
            self.dir, self.limit_file, self.peak_file = (Path("/sys/fs/cgroup/memory") / name, "memory.limit_in_bytes",
                                                         "memory.max_usage_in_bytes")  # fmt: skip
        elif v2.exists() and "memory" in v2.read_text():
            self.dir, self.limit_file, self.peak_file = Path("/sys/fs/cgroup") / name, "memory.max", "memory.peak"
        else:
            raise PermissionError("no memory cgroup controller here")
        self.dir.mkdir()
        try:
            (self.dir / self.limit_file).write_text(str(limit))
        except OSError:
            self.dir.rmdir()
            raise

    def anonymous(self) -> int:
        """The group's anonymous memory now (v1's ``total_rss``, v2's ``anon``): what it holds beyond the page cache."""
        for line in (self.dir / "memory.stat").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key in ("total_rss", "anon"):
                return int(value)
        return 0

    def run(self, cmd: list[str], timeout: float | None = None) -> Measured:
        """Runs ``cmd`` inside the group; the result also has ``peak_bytes`` (the group's peak, page cache included;
        v1's counter reset first) and ``peak_anonymous_bytes`` (sampled every 0.2 s)."""
        if self.peak_file == "memory.max_usage_in_bytes":
            (self.dir / self.peak_file).write_text("0")
        procs = self.dir / "cgroup.procs"
        join = lambda: procs.write_text(str(os.getpid()))  # noqa: E731
        child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=join)
        anonymous, done = [0], threading.Event()

        def sample() -> None:
            while not done.wait(0.2):
                anonymous[0] = max(anonymous[0], self.anonymous())

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        try:
            out, err = child.communicate(timeout=timeout if timeout is not None else self.timeout)
        except subprocess.TimeoutExpired:
            child.kill()
            child.communicate()
            raise
        finally:
            done.set()
            sampler.join()
        result = Measured(cmd, child.returncode, out, err)
        peak = self.dir / self.peak_file
        result.peak_bytes = int(peak.read_text()) if peak.exists() else None
        result.peak_anonymous_bytes = anonymous[0]
        return result

    def close(self) -> None:
        """Removes the group (waiting for its processes' memory to be uncharged)."""
        for _ in range(50):
            try:
                self.dir.rmdir()
                return
            except OSError:
                time.sleep(0.2)
