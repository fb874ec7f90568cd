"""A run's records: the JSON-lines log (``--log-path``) and its scalars in TensorBoard (``--tensorboard``)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from ctrkit.data.atomic import append_text
from ctrkit.train.tensorboard import TensorBoardSink


def process_seconds() -> float | None:
    """Seconds since this process started (from /proc; None where there is none)."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])  # field 22: starttime
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return round(uptime - ticks / os.sysconf("SC_CLK_TCK"), 2)


class RunLog:
    """Appends a run's records, each with ``time`` (seconds since the log was made) and, in a seed ensemble,
    ``member``. Only the reporting process writes (``main``).

    Args:
        path: the JSON-lines file, or None.
        tensorboard_dir: also write the records' scalars as TensorBoard event files here, or None.
        main: this process reports (rank 0, or the only process).
    """

    def __init__(self, path: str | os.PathLike | None, tensorboard_dir: str | os.PathLike | None, main: bool):
        self.started = time.perf_counter()
        self.main = main
        self.path = Path(path) if path else None
        self.board = TensorBoardSink(tensorboard_dir) if tensorboard_dir is not None and main else None
        self.member: int | None = None  # a seed ensemble's member whose records these are

    def seconds(self) -> float:
        """Seconds since the log was made."""
        return time.perf_counter() - self.started

    def unix_start(self) -> float:
        """The wall-clock time the log was made (its records' time 0)."""
        return time.time() - self.seconds()

    def start(self, **fields: Any) -> None:
        """The run's ``start`` record: ``fields`` (its step, total steps, samples, model, config, device), with the
        wall-clock time of the log's start and the process's threads."""
        import torch

        self.write({"event": "start", "unix_time": round(self.unix_start(), 3), **fields,
                    "threads": torch.get_num_threads()})  # fmt: skip

    def write(self, record: dict[str, Any]) -> None:
        record = {**record, "time": round(self.seconds(), 3)}
        if self.member is not None:
            record = {**record, "member": self.member}
        if self.path is not None and self.main:
            append_text(self.path, json.dumps(record) + "\n")
        if self.board is not None:
            self.board.write(record)

    def use_board(self, directory: str | os.PathLike | None) -> None:
        """Writes TensorBoard scalars to ``directory`` from now on (None: nowhere), closing the previous one."""
        self.close()
        self.board = TensorBoardSink(directory) if directory is not None and self.main else None

    def close(self) -> None:
        if self.board is not None:
            self.board.close()
            self.board = None
