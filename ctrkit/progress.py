"""Progress as a user sees it: tqdm's bar on a terminal; where the output is not one (a log file, a pipe, CI), a plain
line now and then (every LOG_INTERVAL_S seconds, and the last state), never a bar redrawn with carriage returns
that floods the log. Every progress bar of ctrkit is this module's ``tqdm``."""

from __future__ import annotations

import sys
from typing import Any

from tqdm.auto import tqdm as _tqdm

LOG_INTERVAL_S = 30.0  # where the output is not a terminal: one line this often at most


def is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or closed
        return False


class LogLines:
    """A stream that writes each of tqdm's redraws as one line of its own (carriage returns dropped)."""

    def __init__(self, stream: Any):
        self.stream = stream

    def write(self, text: str) -> int:
        line = text.replace("\r", "").strip("\n")
        if line.strip():
            self.stream.write(line + "\n")
        return len(text)

    def flush(self) -> None:
        self.stream.flush()


class tqdm(_tqdm):  # noqa: N801 (tqdm's own name, so that call sites read as tqdm)
    """``tqdm.auto.tqdm``; where its stream (stderr unless ``file``) is not a terminal, a line every
    LOG_INTERVAL_S seconds instead of a bar."""

    def __init__(self, *args: Any, **kwargs: Any):
        stream = kwargs.get("file") or sys.stderr
        if not kwargs.get("disable") and not is_terminal(stream):
            kwargs["file"] = LogLines(stream)
            kwargs.setdefault("mininterval", LOG_INTERVAL_S)
            kwargs.setdefault("maxinterval", LOG_INTERVAL_S)
            kwargs.setdefault("ascii", True)
        super().__init__(*args, **kwargs)
