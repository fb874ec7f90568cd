"""What ``refresh`` keeps of a model between days, in its state directory (beside the model repository, never in it:
Triton polls a model's directory and would reload it for any change there):

* ``state.json``: the table flags the model was made with, the served version (its number and checkpoint), the
  versions published before it (for ``--rollback``), the reference profile of the rows it last trained on, and the
  days seen; replaced atomically, after the repository's version is whole;
* ``checkpoints/vN/``: each published version's checkpoint (``model.pt``, and its rank files where trained under
  torchrun);
* ``carried.parquet``: the raw rows the served model has not trained on yet (the last published day's held-out
  tail), trained on with the next day;
* ``days.parquet``: the raw rows of the newest whole days that hold at most ``fresh_rows`` rows (each with its day),
  which a fresh candidate trains on beside the continued one (see ``loop``);
* ``history.jsonl``: a JSON line a day (the checks, the scores, the gate, the verdict, the versions, the times), and
  ``history.html``, the page of it;
* ``pending.json``: written just before a version is placed in the repository and removed once the state says it:
  a refresh killed between the two is finished by the next one (the version is whole in the repository, or absent).

One refresh at a time holds the directory's lock (``refresh.lock``: a second one is refused, naming the holder).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import polars as pl

from ctrkit.data.atomic import PathLock, append_text, atomic_file
from ctrkit.serve.names import check_name, version_dirs

STATE_FORMAT = 1


@dataclass(frozen=True)
class Version:
    """A published version: its ``number`` in the repository, its ``checkpoint`` (a path in ``checkpoints/``) and
    the ``day`` it was published on."""

    number: int
    checkpoint: str
    day: int


@dataclass(frozen=True)
class State:
    """``state.json``: see the module's docstring. ``flags`` are the table flags of the first day (as given);
    ``reference`` the profile (``checks.Profile.as_dict``) of the rows the served version last trained on."""

    flags: dict[str, Any]
    served: Version | None = None
    earlier: tuple[Version, ...] = ()
    reference: dict[str, Any] | None = None
    days: int = 0
    format: int = STATE_FORMAT

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, doc: dict[str, Any], where: str) -> State:
        if doc.get("format") != STATE_FORMAT:
            raise ValueError(f"{where}: state format {doc.get('format')!r}; this ctrkit reads format {STATE_FORMAT}")
        served = Version(**doc["served"]) if doc.get("served") else None
        return cls(dict(doc["flags"]), served, tuple(Version(**v) for v in doc.get("earlier", [])),
                   doc.get("reference"), int(doc.get("days", 0)))  # fmt: skip

    def publish(self, version: Version, reference: dict[str, Any] | None) -> State:
        earlier = self.earlier + ((self.served,) if self.served is not None else ())
        return replace(self, served=version, earlier=earlier, reference=reference)


def default_state_dir(repository: Path, name: str) -> Path:
    """``REPOSITORY.refresh/NAME`` beside the model repository."""
    return repository.parent / f"{repository.name}.refresh" / name


class RefreshStore:
    """The state directory of model ``name`` of ``repository`` (see the module's docstring)."""

    def __init__(self, repository: str | os.PathLike, name: str, root: str | os.PathLike | None = None):
        check_name(name, "`name`")
        self.repository = Path(repository)
        self.name = name
        self.root = Path(root) if root is not None else default_state_dir(self.repository, name)
        if self.root.resolve().is_relative_to(self.repository.resolve() / name):
            raise ValueError(f"`state_dir` {self.root}: lies in the model's directory, which Triton polls; choose "
                             "one outside it")  # fmt: skip

    @property
    def state_file(self) -> Path:
        return self.root / "state.json"

    @property
    def history_file(self) -> Path:
        return self.root / "history.jsonl"

    @property
    def carried_file(self) -> Path:
        return self.root / "carried.parquet"

    @property
    def days_file(self) -> Path:
        return self.root / "days.parquet"

    @property
    def pending_file(self) -> Path:
        return self.root / "pending.json"

    def checkpoint(self, name: str) -> Path:
        return self.root / "checkpoints" / name

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Holds the directory's lock: one refresh (or rollback) of this model at a time."""
        self.root.mkdir(parents=True, exist_ok=True)
        with PathLock(self.root / "refresh", "model's refresh state"):
            yield

    def read(self) -> State | None:
        """The state, None before the first day."""
        if not self.state_file.is_file():
            return None
        try:
            doc = json.loads(self.state_file.read_text())
        except (ValueError, UnicodeDecodeError) as e:
            raise ValueError(
                f"{self.state_file}: not a refresh state ({e}); restore it or start a new --state-dir"
            ) from None
        return State.from_dict(doc, str(self.state_file))

    def write(self, state: State) -> None:
        with atomic_file(self.state_file) as tmp:
            tmp.write_text(json.dumps(state.as_dict(), indent=2) + "\n")

    def record(self, line: dict[str, Any]) -> None:
        """Appends a day's record to ``history.jsonl`` (whole lines only)."""
        append_text(self.history_file, json.dumps(line, sort_keys=True) + "\n")

    def history(self) -> list[dict[str, Any]]:
        """Every day's record, oldest first (a line cut short by a kill is left out)."""
        if not self.history_file.is_file():
            return []
        out = []
        for line in self.history_file.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out

    def carried(self) -> pl.DataFrame | None:
        return pl.read_parquet(self.carried_file) if self.carried_file.is_file() else None

    def carry(self, rows: pl.DataFrame | None) -> None:
        """Keeps ``rows`` (raw) for the next day's training (None: nothing carried)."""
        if rows is None or not rows.height:
            self.carried_file.unlink(missing_ok=True)
            return
        with atomic_file(self.carried_file) as tmp:
            rows.write_parquet(tmp)

    def days(self) -> pl.DataFrame | None:
        """The raw rows of the days kept for a fresh candidate (with their day), None where none are."""
        return pl.read_parquet(self.days_file) if self.days_file.is_file() else None

    def keep_days(self, rows: pl.DataFrame | None) -> None:
        """Keeps ``rows`` (raw, with their day) as the days a fresh candidate trains on (None: none), atomically. A day
        is written before its verdict is committed: a day run again replaces its own rows (``loop.days_kept``)."""
        if rows is None or not rows.height:
            self.days_file.unlink(missing_ok=True)
            return
        with atomic_file(self.days_file) as tmp:
            rows.write_parquet(tmp)

    def versions(self) -> list[int]:
        """The model's version numbers in the repository, oldest first."""
        folder = self.repository / self.name
        return sorted(version_dirs(folder)) if folder.is_dir() else []

    def prune(self, keep: int, state: State) -> list[int]:
        """Removes the repository's versions older than the newest ``keep`` (a version policy: Triton's ``latest``
        serves the newest; ``ctrkit serve`` every one left), and the checkpoints of versions no longer in the state's
        reach beyond ``keep`` earlier ones; returns the versions removed."""
        numbers = self.versions()
        gone = numbers[:-keep] if keep < len(numbers) else []
        folder = self.repository / self.name
        for v in gone:
            target = folder / str(v)
            aside = folder.parent / f".{self.name}.{v}.removed.{os.getpid()}"
            os.replace(target, aside)  # gone from the model's directory in one step
            shutil.rmtree(aside, ignore_errors=True)
        kept = {Path(v.checkpoint).parts[0] for v in (state.served, *state.earlier[-keep:]) if v is not None}
        folder = self.root / "checkpoints"
        if folder.is_dir():
            for p in folder.iterdir():
                if p.name not in kept:
                    shutil.rmtree(p) if p.is_dir() else p.unlink(missing_ok=True)
        return gone

    def begin(self, pending: dict[str, Any]) -> None:
        with atomic_file(self.pending_file) as tmp:
            tmp.write_text(json.dumps(pending, indent=2) + "\n")

    def pending(self) -> dict[str, Any] | None:
        if not self.pending_file.is_file():
            return None
        try:
            return json.loads(self.pending_file.read_text())
        except ValueError:
            return None

    def done(self) -> None:
        self.pending_file.unlink(missing_ok=True)
