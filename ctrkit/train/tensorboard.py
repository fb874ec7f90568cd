"""``train --tensorboard DIR``: the JSON log's scalars as TensorBoard event files.

TensorBoard is an optional extra (``pip install 'ctrkit[tensorboard]'``), imported only when asked for.
Tags: ``train/loss``, ``train/lr``, ``train/samples_per_s`` at each log record; ``validation/auc`` and
``validation/logloss`` at each evaluation; ``test/auc`` and ``test/logloss`` once, at the end; each at the
record's step. A resumed run appends to the same directory.
"""

from __future__ import annotations

import os
from typing import Any

SCALARS = {
    "train": ("loss", "lr", "samples_per_s"),
    "eval": ("auc", "logloss"),
    "test": ("auc", "logloss"),
}


class TensorBoardSink:
    """Writes the scalars of the trainer's log records to ``directory``."""

    def __init__(self, directory: str | os.PathLike):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:  # torch's writer needs the tensorboard package
            raise ValueError(
                "`tensorboard`: writing TensorBoard event files needs the tensorboard package; install it with "
                "pip install 'ctrkit[tensorboard]' (or pip install tensorboard)"
            ) from None
        self.writer = SummaryWriter(log_dir=str(directory))

    def write(self, record: dict[str, Any]) -> None:
        event = record.get("event")
        if event not in SCALARS:
            return
        prefix = "train" if event == "train" else record.get("mapping", event)
        for name in SCALARS[event]:
            if record.get(name) is not None:
                self.writer.add_scalar(f"{prefix}/{name}", float(record[name]), int(record["step"]))
        if event != "train":  # evaluations are rare: on disk at once, even if the run dies later
            self.writer.flush()

    def close(self) -> None:
        self.writer.flush()
        self.writer.close()
