"""A model's day (``ctrkit refresh``): validate, score, train, evaluate against the served model, publish.

The first day of a model (no state yet): the day is read, its last ``holdout_fraction`` of rows (in time order)
held out, the rest preprocessed with the table flags and trained on, and the model published as the repository's
first version of ``name``.

Each later day, with the same command line:

1. **checks**: the day's columns, missing shares, unseen values, numbers' PSI and click rate against the served
   model's reference day (``checks``); a failure refuses the day unless ``force``;
2. **scored before trained**: the served model scores every row of the day from its raw values (what it really
   meets: progressive validation), and that AUC is checked against its recent days';
3. **trained on whole**: the rows the served model has not trained on yet (the last published day's held-out tail)
   and the day's rows before its own tail are written ``--like`` the served model and trained on, continuing it;
   the day's tail is the validation rows (selection, early stopping, the gate), and is trained on the next day;
   where the days so far are small (the newest whole days kept, at most ``fresh_rows`` rows with the day's), a
   second candidate is trained from scratch on them and the day's rows before its tail, its preprocessing fitted
   afresh: a continued model learns each day from that day alone, a fresh one from all of them;
4. **the gate** (``gate``): the candidates scored on the tail, the better one kept, and it and the served model
   compared there; the candidate published only if it is not worse beyond the tolerances;
5. **publishing**: the candidate's checkpoint kept, its export placed in the repository as the next version (whole,
   in one rename), the state written; a server polling the repository (``ctrkit serve --poll-s``, Triton's POLL
   mode) or told (``notify``) loads it while the old version answers; the versions beyond ``keep_versions`` removed.

Every day ends ``published``, ``kept`` (the served version stays) or ``refused`` (a check failed), in one line and
one JSON record in ``history.jsonl``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from ctrkit.refresh.checks import (
    Check,
    Profile,
    Thresholds,
    UnseenCount,
    check_columns,
    check_day,
    profile,
    reason,
    typed_rows,
)
from ctrkit.refresh.day import Day, read_day, score_day
from ctrkit.refresh.gate import Scores, compare
from ctrkit.refresh.store import RefreshStore, State, Version

FIRST_MODEL = "dlrm"  # the model a first day trains where --model names none
CHECKPOINT = "model.pt"  # each version's checkpoint: checkpoints/vN/model.pt
RECENT_DAYS = 7  # the days whose scores and unseen shares a new day is set beside
CARRY_DAYS = 3  # at most this many days' rows carried while the gate keeps the served version
CONTINUED, FRESH = "continued", "fresh"  # a later day's candidates: the served model continued, one trained afresh
DAY_COLUMN = "__ctrkit_day"  # the day a carried row came from
PUBLISHED, KEPT, REFUSED, ROLLED_BACK = "published", "kept", "refused", "rolled back"
# the table flags that say how a model reads its log (refused when changed later); the engine's are free to change
ENGINE_FLAGS = ("engine", "spark_master")


class Refused(ValueError):
    """A day refused by its checks: nothing published, the record written."""


@dataclass(frozen=True)
class RefreshSettings:
    """A refresh's settings (``ctrkit refresh``'s flags but the table flags): see ``RefreshConfig``."""

    repository: Path
    name: str
    state_dir: Path | None = None
    model: str | None = None
    holdout_fraction: float = 0.1
    backend: str = "onnx"
    keep_versions: int = 3
    thresholds: Thresholds = field(default_factory=Thresholds)
    auc_tolerance: float = 0.002
    logloss_tolerance: float = 0.002
    bootstrap_rounds: int = 200
    force: bool = False
    train_options: dict[str, Any] = field(default_factory=dict)
    nproc_per_node: int = 1
    notify: str | None = None
    progress: bool = False
    fresh_rows: int = 50_000

    def validate(self) -> None:
        if not 0 < self.holdout_fraction < 0.5:
            raise ValueError(f"`holdout_fraction`: expected a share in (0, 0.5), got {self.holdout_fraction}")
        if self.keep_versions < 1:
            raise ValueError(f"`keep_versions`: expected an integer >= 1, got {self.keep_versions}")
        if not 0 <= self.auc_tolerance < 1 or not 0 <= self.logloss_tolerance < 10:
            raise ValueError("`auc_tolerance` and `logloss_tolerance`: expected small numbers >= 0")
        if self.bootstrap_rounds < 20:
            raise ValueError(f"`bootstrap_rounds`: expected at least 20, got {self.bootstrap_rounds}")
        if self.nproc_per_node < 1:
            raise ValueError(f"`nproc_per_node`: expected an integer >= 1, got {self.nproc_per_node}")
        if self.fresh_rows < 0:
            raise ValueError(f"`fresh_rows`: expected an integer >= 0, got {self.fresh_rows}")
        self.thresholds.validate()


def table_recipe(flags: dict[str, Any], like: bool):
    """The ``TableRecipe`` of the table flags ``flags`` (``TablePreprocessConfig``'s fields, as given); with ``like``
    only what a later day takes (the label's rule, the order, the frequency threshold, the reading of the file)."""
    from ctrkit.data_config import TablePreprocessConfig
    from ctrkit.preprocess.table_recipe import recipe_of

    names = {f.name for f in fields(TablePreprocessConfig)}
    values = {k: v for k, v in flags.items() if k in names}
    if like:
        keep = ("label", "positive", "label_threshold", "order_by", "shuffle_seed", "frequency_threshold", "bad_rows",
                "csv_separator", "null_values", "separator", *ENGINE_FLAGS)  # fmt: skip
        values = {k: v for k, v in values.items() if k in keep}
    cfg = TablePreprocessConfig(raw=(), out=Path("."), **values)
    return recipe_of(cfg), cfg


def check_flags(given: dict[str, Any], state: State) -> None:
    """Table flags given on a later day must say what the first day's did (the model reads its log one way)."""
    from ctrkit.data_config import TablePreprocessConfig

    defaults = {f.name: f.default for f in fields(TablePreprocessConfig)}
    for k, v in given.items():
        if k in ENGINE_FLAGS:
            continue
        was = state.flags.get(k, defaults.get(k))
        if _jsonable(v) != _jsonable(was):
            flag = "--" + k.replace("_", "-")
            raise ValueError(f"{flag}: {_said(v)} differs from the model's ({_said(was)}, given on its first day); "
                             f"give the same value or leave {flag} out")  # fmt: skip


def _jsonable(v: Any) -> Any:
    return json.loads(json.dumps(v, default=str))


def _said(v: Any) -> str:
    return ",".join(map(str, v)) if isinstance(v, (tuple, list)) else str(v)


class Refresh:
    """One refresh of model ``settings.name`` (see the module's docstring); ``log`` gets its progress lines."""

    def __init__(self, settings: RefreshSettings, flags: dict[str, Any], log: Callable[[str], None] = print):
        settings.validate()
        self.settings, self.flags, self.log = settings, flags, log
        self.store = RefreshStore(settings.repository, settings.name, settings.state_dir)
        self.times: dict[str, float] = {}
        self.notes: list[str] = []  # what the day did otherwise than asked, and why (in its record)
        self.started = time.perf_counter()

    def _timed(self, step: str, started: float) -> None:
        self.times[step] = round(time.perf_counter() - started, 3)

    def run(self, files: Sequence[str | os.PathLike]) -> dict[str, Any]:
        """Refreshes the model with the day of ``files``; returns the day's record (``Refused`` where a check
        failed, after recording it)."""
        self.started = time.perf_counter()
        with self.store.locked():
            self.recover()
            state = self.store.read()
            work = Path(tempfile.mkdtemp(dir=self.store.root, prefix="work-"))
            try:
                if state is None:
                    return self._first_day([Path(f) for f in files], work)
                return self._next_day([Path(f) for f in files], state, work)
            finally:
                shutil.rmtree(work, ignore_errors=True)

    # -- the first day --

    def _first_day(self, files: list[Path], work: Path) -> dict[str, Any]:
        s = self.settings
        if "label" not in self.flags or not self.flags["label"]:
            raise ValueError("`label`: the model's first day names its label column")
        started = time.perf_counter()
        recipe, cfg = table_recipe(self.flags, like=False)
        day = read_day(files, recipe)
        head, tail = day.split(s.holdout_fraction)
        basic = Profile(len(day), float(day.labels.mean()) if len(day) else 0.0, {}, {})
        checks = check_day(basic, None, s.thresholds)
        self._timed("read and check", started)
        record = self._record(1, files, checks)
        if not all(c.passed for c in checks) and not s.force:
            return self._refuse(record, checks)
        started = time.perf_counter()
        data = self._preprocess(head.raw(), tail.raw(), work / CONTINUED, recipe, cfg, None, record)
        self._timed("preprocess", started)
        started = time.perf_counter()
        candidate = self._train(data, s.model or FIRST_MODEL, None, work / CONTINUED)
        self._timed("train", started)
        predictor, transform = predictor_of(candidate)
        held = Scores.of(tail.labels, score_day(predictor, transform, tail))
        record["holdout"] = held.as_dict()
        # (no seen shares: within a day nearly every value is seen; a day's next-day shares are the reference)
        record["profile"] = {"click_rate": float(tail.labels.mean())}
        reference = profile(day.rows, day.labels, transform, unseen={})  # (a reference's are read nowhere)
        state = State(flags=_jsonable(self.flags), days=0)
        carry = carry_rows(None, tail, 1, 0)
        self.store.keep_days(days_kept(None, day, 1, s.fresh_rows))
        return self._publish(state, candidate, record, reference, carry, f"the first day of '{s.name}'")

    # -- a later day --

    def _next_day(self, files: list[Path], state: State, work: Path) -> dict[str, Any]:
        s = self.settings
        check_flags(self.flags, state)
        if state.served is None:
            raise ValueError(f"{self.store.state_file}: no served version; publish a first day again")
        served_path = self.store.checkpoint(state.served.checkpoint)
        started = time.perf_counter()
        engine = {k: v for k, v in self.flags.items() if k in ENGINE_FLAGS}  # this day's, where given
        recipe, cfg = table_recipe({**state.flags, **engine}, like=True)
        predictor, transform = predictor_of(served_path)
        served_model = predictor.meta["model_name"]
        if s.model is not None and s.model != served_model:
            raise ValueError(f"`model`: {s.model}, where the served model is {served_model} (later days continue it); "
                             "leave --model out or give its name")  # fmt: skip
        recipe = model_reading(recipe, transform)
        day = read_day(files, recipe)
        record = self._record(state.days + 1, files, [])
        record["served_before"] = state.served.number
        age = state.days + 1 - state.served.day
        judged = judge_day(day, predictor, transform, reference_of(state), s.thresholds, self.store.history(), age)
        checks = judged.checks
        record["checks"] = [_check_dict(c) for c in checks]
        if judged.progressive is None:  # the model's columns are not all there: nothing to score
            self._timed("read and check", started)
            if not s.force:
                return self._refuse(record, checks)
            raise ValueError(f"{files[0]}: {checks[0].name}: --force cannot take a day without the model's columns")
        p, progressive, today = judged.scores, judged.progressive, judged.profile
        assert p is not None and today is not None  # judged with the model's columns (progressive is not None)
        record["progressive"] = progressive.as_dict()
        record["profile"] = {"missing": today.missing, "unseen": today.unseen, "click_rate": today.click_rate}
        self._timed("read, check and score", started)
        self.log(f"day {record['day']}: the served version {state.served.number} scores it at AUC "
                 f"{progressive.auc:.4f}, log loss {progressive.logloss:.4f} ({len(day):,} rows)")  # fmt: skip
        if not all(c.passed for c in checks):
            if not s.force:
                return self._refuse(record, checks)
            record["forced"] = reason(checks)
        head, tail = day.split(s.holdout_fraction)
        carried = self.store.carried()
        before = None if carried is None else carried.drop(DAY_COLUMN).select(head.columns)
        train_rows = head.raw() if before is None else pl.concat([before, head.raw()], how="vertical_relaxed")
        record["trained_rows"] = {"carried": 0 if carried is None else carried.height, "day": len(head),
                                  "held_out": len(tail)}  # fmt: skip
        started = time.perf_counter()
        like = _like(served_path)
        data = self._preprocess(train_rows, tail.raw(), work / CONTINUED, recipe, cfg, like, record)
        self._timed("preprocess", started)
        started = time.perf_counter()
        candidates = {CONTINUED: self._train(data, served_model, served_path, work / CONTINUED)}
        self._timed("train", started)
        kept_days = self.store.days()
        fresh_rows = fresh_training_rows(kept_days, head, record["day"], s.fresh_rows)
        if fresh_rows is not None:
            started = time.perf_counter()
            record["trained_rows"][FRESH] = fresh_rows.height
            fresh_recipe, fresh_cfg = table_recipe({**state.flags, **engine}, like=False)
            data = self._preprocess(fresh_rows, tail.raw(), work / FRESH, fresh_recipe, fresh_cfg, None, record)
            candidates[FRESH] = self._train(data, served_model, None, work / FRESH)
            self._timed("fresh candidate", started)
        started = time.perf_counter()
        candidate, cand_transform, cand_p = self._choose(candidates, tail, record)
        gate = compare(tail.labels, p[len(head):], cand_p, s.auc_tolerance, s.logloss_tolerance,
                       s.bootstrap_rounds)  # fmt: skip
        record["gate"] = gate.as_dict()
        record["holdout"] = gate.candidate.as_dict()
        self._timed("gate", started)
        self.store.keep_days(days_kept(kept_days, day, record["day"], s.fresh_rows))
        if not gate.blessed:  # (the candidates go with the work directory)
            # the served model has learnt none of the day: all of it carried, with the rows carried already
            self.store.carry(carry_rows(carried, day, record["day"], CARRY_DAYS))
            record.update(verdict=KEPT, reason=gate.reason, served_after=state.served.number)
            return self._finish(record, replace_days(state, record["day"]))
        new_reference = profile(day.rows, day.labels, cand_transform, unseen={})  # (a reference's are read nowhere)
        carry = carry_rows(None, tail, record["day"], 0)
        return self._publish(state, candidate, record, new_reference, carry, gate.reason)

    # -- the steps --

    def _choose(self, candidates: dict[str, Path], tail: Day, record: dict[str, Any]) -> tuple:
        """The candidate that scores ``tail`` best (AUC; ``CONTINUED`` on a tie): its checkpoint, carried
        preprocessing and probabilities of the tail; with two candidates, each one's figures and the one taken go
        into ``record``."""
        scored = {}
        for name, checkpoint in candidates.items():
            predictor, transform = predictor_of(checkpoint)
            scored[name] = (checkpoint, transform, score_day(predictor, transform, tail))
        figures = {name: Scores.of(tail.labels, p) for name, (_, _, p) in scored.items()}
        chosen = max(figures, key=lambda n: (figures[n].auc if np.isfinite(figures[n].auc) else -1.0, n == CONTINUED))
        if len(candidates) > 1:
            record["candidates"] = {name: f.as_dict() for name, f in figures.items()}
            record["candidate"] = chosen
            self.log(f"day {record['day']}: candidates on the held-out rows: "
                     + ", ".join(f"{n} AUC {f.auc:.4f}" for n, f in figures.items()) + f"; {chosen} taken")  # fmt: skip
        return scored[chosen]

    def _preprocess(self, train_rows: pl.DataFrame, held: pl.DataFrame, work: Path, recipe, cfg, like,
                    record: dict[str, Any]) -> Path:  # fmt: skip
        """The day's dataset: ``train_rows`` trained on, ``held`` its validation rows; fitted with the table flags,
        or written ``like`` the served model; the engine that wrote it goes into ``record``."""
        from ctrkit.preprocess.table import preprocess_table

        work.mkdir(parents=True, exist_ok=True)
        train_file, held_file, out = work / "train.parquet", work / "held.parquet", work / "data"
        train_rows.write_parquet(train_file)
        held.write_parquet(held_file)
        summary = preprocess_table([train_file], out, recipe, validation_files=[held_file], like=like,
                                   progress=self.settings.progress, engine=cfg.engine,
                                   master=cfg.spark_master)  # fmt: skip
        record["engine"] = summary["engine"]
        return out

    def _train(self, data: Path, model: str, continue_from: Path | None, work: Path) -> Path:
        """The candidate's checkpoint in ``work``: ``model`` trained on ``data`` (continuing ``continue_from``), in
        this process or under torchrun (``nproc_per_node``)."""
        s = self.settings
        (work / "candidate").mkdir()
        out = work / "candidate" / CHECKPOINT  # (under torchrun: with its rank files beside it)
        options = dict(s.train_options)
        if s.nproc_per_node > 1 and continue_from is not None:
            self.log(f"warning: --nproc-per-node {s.nproc_per_node}: a continued day trains in one process (train "
                     "--continue-from starts one process from a one-file checkpoint)")  # fmt: skip
            self.notes.append("trained in one process: train --continue-from runs one process")
        if s.nproc_per_node > 1 and continue_from is None:
            command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                       f"--nproc-per-node={s.nproc_per_node}", "-m", "ctrkit", "train", "--dataset", str(data),
                       "--model", model, "--save-checkpoint", str(out), "--no-progress"]  # fmt: skip
            for k, v in options.items():
                command += ["--" + k.replace("_", "-"), str(v)]
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode != 0:  # the ranks' own one-line error, else the last line torchrun printed
                lines = done.stderr.strip().splitlines() or ["(no output)"]
                said = next((line for line in lines if line.startswith("ctrkit train: error:")), lines[-1])
                raise ValueError(f"training under torchrun ({s.nproc_per_node} processes) failed: {said}")
            # its rank files as one file with whole tables, which the next day continues in one process
            whole = work / "candidate" / "whole.pt"
            done = subprocess.run([sys.executable, "-m", "ctrkit", "convert-checkpoint", "--checkpoint", str(out),
                                   "--out", str(whole)], capture_output=True, text=True)  # fmt: skip
            if done.returncode != 0:
                raise ValueError(f"the torchrun checkpoint {out} did not convert to one file: {done.stderr.strip()}")
            os.replace(whole, out)
            shutil.rmtree(out.with_name(out.name + ".shards"), ignore_errors=True)
            return out
        from ctrkit.train.run import train

        extra = {"continue_from": continue_from} if continue_from is not None else {}
        train(data, model, save_checkpoint=out, progress=s.progress, **options, **extra)
        return out

    def _publish(self, state: State, candidate: Path, record: dict[str, Any], reference: Profile,
                 carry: pl.DataFrame, why: str) -> dict[str, Any]:  # fmt: skip
        """Places ``candidate`` as the repository's next version and makes it the served one (see ``recover`` for a
        refresh killed on the way)."""
        from ctrkit.export.exporter import export_checkpoint

        s = self.settings
        started = time.perf_counter()
        number = max([*self.store.versions(), *(v.number for v in (state.served, *state.earlier) if v)], default=0) + 1
        checkpoint = f"v{number}/{CHECKPOINT}"
        self.store.checkpoint(checkpoint).parent.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(self.store.checkpoint(checkpoint).parent, ignore_errors=True)  # a stopped refresh's, unserved
        os.replace(candidate.parent, self.store.checkpoint(checkpoint).parent)  # its directory: rank files and all
        carry_next = self.store.root / "carried.next.parquet"
        carry.write_parquet(carry_next)
        record.update(verdict=PUBLISHED, reason=why, version=number, served_after=number)
        self.store.begin({"version": number, "checkpoint": checkpoint, "day": record["day"], "flags": state.flags,
                          "reference": reference.as_dict(), "record": record})  # fmt: skip
        export_checkpoint(self.store.checkpoint(checkpoint), s.repository, "triton", s.name, s.backend,
                          version=number)  # fmt: skip
        self._timed("publish", started)
        record["times"] = dict(self.times)
        state = self._commit(state, number, checkpoint, record["day"], reference.as_dict(), record)
        gone = self.store.prune(s.keep_versions, state)
        if gone:
            self.log(f"removed versions {', '.join(map(str, gone))} (--keep-versions {s.keep_versions})")
        if s.notify:
            self._notify(record, s.notify)
        return record

    def _commit(self, state: State, number: int, checkpoint: str, day: int, reference: dict[str, Any],
                record: dict[str, Any]) -> State:  # fmt: skip
        """The state after version ``number`` is whole in the repository: served, its rows carried, recorded."""
        state = replace_days(state.publish(Version(number, checkpoint, day), reference), day)
        self.store.write(state)
        carry_next = self.store.root / "carried.next.parquet"
        if carry_next.is_file():
            os.replace(carry_next, self.store.carried_file)
        self._finish(record, None)
        self.store.done()
        return state

    def _finish(self, record: dict[str, Any], state: State | None) -> dict[str, Any]:
        if state is not None:
            self.store.write(state)
        record.setdefault("times", dict(self.times))
        if self.notes:
            record["notes"] = list(self.notes)
        record["seconds"] = round(time.perf_counter() - self.started, 3)  # the day's whole wall time
        self.store.record(record)
        from ctrkit.refresh.history_page import write_page

        write_page(self.store)
        return record

    def _refuse(self, record: dict[str, Any], checks: Sequence[Check]) -> dict[str, Any]:
        record.update(verdict=REFUSED, reason=reason(checks), checks=[_check_dict(c) for c in checks])
        state = self.store.read()
        if state is not None:
            record["served_after"] = state.served.number if state.served else None
            state = replace_days(state, record["day"])
        self._finish(record, state)
        raise Refused(f"day {record['day']} refused, nothing published: {record['reason']} (--force takes it anyway)")

    def _notify(self, record: dict[str, Any], notify: str) -> None:
        """Asks the server at ``notify`` to load the model (the repository extension's load: ``ctrkit serve``, or
        Triton in EXPLICIT mode); the answer goes into the record."""
        url = f"{notify.rstrip('/')}/v2/repository/models/{self.settings.name}/load"
        request = urllib.request.Request(url, data=b"{}", method="POST", headers={"content-type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=120) as answer:
                record["notified"] = {"url": url, "status": answer.status}
        except OSError as e:
            record["notified"] = {"url": url, "error": str(e)}
            self.log(f"warning: {url}: {e}; the version is in the repository, and a polling server loads it")

    def _record(self, day: int, files: Sequence[Path], checks: Sequence[Check]) -> dict[str, Any]:
        return {"day": day, "files": [str(f) for f in files], "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
                "checks": [_check_dict(c) for c in checks]}  # fmt: skip

    def recover(self) -> None:
        """Finishes a refresh stopped between placing a version and writing the state (the version is whole in the
        repository: it becomes the served one, and its day is recorded), or drops one stopped before placing it
        (nothing of it is served: its checkpoint and carried rows go)."""
        pending = self.store.pending()
        if pending is not None and pending["version"] in self.store.versions():
            state = self.store.read()
            base = state if state is not None else State(flags=pending["flags"])  # a first day's
            self.log(f"finishing the refresh that placed version {pending['version']} before it was stopped")
            self._commit(base, pending["version"], pending["checkpoint"], pending["day"], pending["reference"],
                         pending["record"])  # fmt: skip
            return
        if pending is not None:
            shutil.rmtree(self.store.checkpoint(pending["checkpoint"]).parent, ignore_errors=True)
        (self.store.root / "carried.next.parquet").unlink(missing_ok=True)
        self.store.done()


@dataclass(frozen=True)
class Judged:
    """A day judged against the served model: its ``checks``, and (where its columns are the model's) the served
    model's probabilities of its rows (``scores``), their ``progressive`` figures and the day's ``profile``."""

    checks: list[Check]
    scores: np.ndarray | None = None
    progressive: Scores | None = None
    profile: Profile | None = None


def reference_of(state: State) -> Profile | None:
    return Profile.from_dict(state.reference) if state.reference else None


def judge_day(day: Day, predictor, transform, reference: Profile | None, thresholds: Thresholds,
              history: Sequence[dict[str, Any]], served_age: int = 1) -> Judged:  # fmt: skip
    """``day`` checked against the served model (``predictor`` and its ``transform``): its columns, then every row
    scored before any training (progressive validation), the day's profile against ``reference`` (the rows the
    model last trained on), and its AUC and unseen shares against the recent days of ``history`` (``refresh``'s
    records, oldest first; where none has met a day yet, the served version's held-out AUC). The seen shares are
    judged only where the served version was published the day before (``served_age`` 1), as the recent days'
    were: an older model knows fewer of a churning log's values without anything being wrong with the day."""
    columns = check_columns(day.columns, transform, str(day.files[0]))
    if not columns.passed:
        return Judged([columns])
    count, typed = UnseenCount(transform), typed_rows(day.rows, transform)
    p = score_day(predictor, transform, day, each=lambda lo, x: count.add(typed[lo : lo + len(x[0])], x[1], x[2]))
    progressive = Scores.of(day.labels, p)
    today = profile(day.rows, day.labels, transform, reference, count.shares())
    recent = [r for r in history if r.get("verdict") in (PUBLISHED, KEPT)][-RECENT_DAYS:]
    aucs = [r["progressive"]["auc"] for r in recent if (r.get("progressive") or {}).get("auc") is not None]
    if not aucs and recent and (recent[-1].get("holdout") or {}).get("auc") is not None:
        aucs = [recent[-1]["holdout"]["auc"]]  # the first version's held-out score, until it has met a day
    unseen: dict[str, list[float]] = {}
    for r in recent:
        for f, share in ((r.get("profile") or {}).get("unseen") or {}).items():
            unseen.setdefault(f, []).append(share)
    auc = progressive.auc if np.isfinite(progressive.auc) else None
    checks = [columns, *check_day(today, reference, thresholds, auc, aucs, unseen if served_age <= 1 else None)]
    return Judged(checks, p, progressive, today)


def carry_rows(carried: pl.DataFrame | None, rows: Day, day: int, days: int) -> pl.DataFrame:
    """The rows the next day trains on before its own: day ``day``'s ``rows`` (its held-out tail once published; all of
    it where the gate kept the served model, which learnt none of it), after the rows ``carried`` (with their
    ``DAY_COLUMN``) of the last ``days`` days (``day`` included; 0: none of them)."""
    parts = [] if carried is None else [carried.filter(pl.col(DAY_COLUMN) > day - days)]
    parts.append(rows.raw().with_columns(pl.lit(day, pl.Int32).alias(DAY_COLUMN)))
    return pl.concat([p.select(parts[-1].columns) for p in parts], how="vertical_relaxed")


def newest_days(kept: pl.DataFrame | None, day: int, room: int) -> pl.DataFrame | None:
    """The rows of ``kept`` (raw rows with their ``DAY_COLUMN``) of the newest whole days before day ``day`` that hold
    at most ``room`` rows together; None where not one day fits. A day's own rows and later ones (left by a run of
    the day that stopped before its verdict was committed) are not among them."""
    if kept is None or room <= 0:
        return None
    earlier = kept.filter(pl.col(DAY_COLUMN) < day)
    sizes = earlier.group_by(DAY_COLUMN).len().sort(DAY_COLUMN, descending=True)
    first, total = None, 0
    for d, n in sizes.iter_rows():
        if total + n > room:
            break
        first, total = d, total + n
    return None if first is None else earlier.filter(pl.col(DAY_COLUMN) >= first)


def days_kept(kept: pl.DataFrame | None, rows: Day, day: int, limit: int) -> pl.DataFrame | None:
    """The days kept for a fresh candidate once day ``day``'s ``rows`` are added to ``kept``: the newest whole days,
    ``day``'s among them, holding at most ``limit`` rows; None where ``day`` alone holds more."""
    if len(rows) > limit:
        return None
    today = rows.raw().with_columns(pl.lit(day, pl.Int32).alias(DAY_COLUMN))
    before = newest_days(kept, day, limit - len(rows))
    return today if before is None else pl.concat([before, today], how="diagonal_relaxed")


def fresh_training_rows(kept: pl.DataFrame | None, head: Day, day: int, limit: int) -> pl.DataFrame | None:
    """The rows a fresh candidate of day ``day`` trains on: the newest whole days of ``kept`` before it, then the
    day's ``head`` (its rows before the held-out tail), at most ``limit`` rows in all; None where not one earlier
    day fits beside the head (a model trained on the day alone is what the continued candidate improves on)."""
    before = newest_days(kept, day, limit - len(head))
    if before is None:
        return None
    return pl.concat([before.drop(DAY_COLUMN), head.raw()], how="diagonal_relaxed").select(head.columns)


def replace_days(state: State, day: int) -> State:
    from dataclasses import replace

    return replace(state, days=max(state.days, day))


def rollback(settings: RefreshSettings, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Serves the version published before the served one again, as the repository's next version (a version
    number only grows, so Triton's ``latest`` policy and ``ctrkit serve`` both take it)."""
    from ctrkit.export.exporter import export_checkpoint

    store = RefreshStore(settings.repository, settings.name, settings.state_dir)
    with store.locked():
        state = store.read()
        if state is None or state.served is None or not state.earlier:
            raise ValueError(f"{store.state_file}: no earlier version to roll back to")
        back = state.earlier[-1]
        if not store.checkpoint(back.checkpoint).is_file():
            raise ValueError(f"{store.checkpoint(back.checkpoint)}: the checkpoint of version {back.number} is gone")
        started = time.perf_counter()
        number = max([*store.versions(), state.served.number, *(v.number for v in state.earlier)]) + 1
        export_checkpoint(store.checkpoint(back.checkpoint), settings.repository, "triton", settings.name,
                          settings.backend, version=number)  # fmt: skip
        from dataclasses import replace

        new = replace(state, served=Version(number, back.checkpoint, state.days), earlier=state.earlier[:-1],
                      reference=state.reference)  # fmt: skip
        store.write(new)
        record = {"day": state.days, "verdict": ROLLED_BACK, "version": number, "served_before": state.served.number,
                  "served_after": number, "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
                  "reason": f"version {back.number}'s model served again as version {number}",
                  "seconds": round(time.perf_counter() - started, 3)}  # fmt: skip
        store.record(record)
        from ctrkit.refresh.history_page import write_page

        write_page(store)
        store.prune(settings.keep_versions, new)
        return record


def predictor_of(checkpoint: Path):
    """The checkpoint's model as the server runs it, and the preprocessing it carries (a model without one: refused)."""
    from ctrkit.serve.predictor import Predictor

    predictor = Predictor.from_checkpoint(checkpoint)
    if predictor.transform is None:
        raise ValueError(f"{checkpoint}: carries no preprocessing; refresh takes models made by `preprocess table`")
    return predictor, predictor.transform


def _like(checkpoint: Path):
    from ctrkit.checkpoint import load_checkpoint

    return load_checkpoint(checkpoint, mmap=True, assemble=False).like(str(checkpoint))


def model_reading(recipe, transform):
    """``recipe`` reading a day's files as the model reads them (its null values)."""
    from dataclasses import replace

    return replace(recipe, null_values=tuple(transform.null_values))


def _check_dict(c: Check) -> dict[str, Any]:
    doc = {"name": c.name, "figure": c.figure, "reference": c.reference, "threshold": c.threshold, "passed": c.passed}
    return {k: (round(v, 6) if isinstance(v, float) and np.isfinite(v) else v) for k, v in doc.items()}
