"""``ctrkit bench refresh``: the daily loop on drifting day-by-day CSV logs (``table_stream.write_text_days``: ids born
and fading every day), run as a cron line would run ``ctrkit refresh``: clean streams (every day should be
published: a refusal is a false one) and a stream with broken days (shuffled labels, a renamed column, a column
all missing: each should be refused). Per day: the verdict, the served model's AUC on the day before training on it
(progressive), the gate's figures and the seconds."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from ctrkit.bench.table_stream import LABEL, write_text_days

BREAKS = ("shuffled", "renamed", "missing")


def broken_day(day: Path, out: Path, how: str, seed: int = 0) -> Path:
    """``day`` broken as ``how`` says: its labels shuffled, its second column renamed, or its first numerical column
    all missing; written to ``out``."""
    rows = pl.read_csv(day, infer_schema=False)
    if how == "shuffled":
        rows = rows.with_columns(pl.Series(LABEL, np.random.default_rng(seed).permutation(rows[LABEL].to_numpy())))
    elif how == "renamed":
        rows = rows.rename({rows.columns[1]: rows.columns[1] + "_renamed"})
    elif how == "missing":
        number = next(c for c in rows.columns if c.startswith("num"))
        rows = rows.with_columns(pl.lit(None, pl.String).alias(number))
    else:
        raise ValueError(f"unknown break {how!r}; expected one of {', '.join(BREAKS)}")
    rows.write_csv(out)
    return out


def run_stream(files: Sequence[Path], work: Path, options: dict[str, Any], log: Callable[[str], None] = print
               ) -> list[dict[str, Any]]:  # fmt: skip
    """``ctrkit refresh`` of each day of ``files`` in turn into a new repository in ``work``; the day records."""
    from ctrkit.refresh.loop import Refresh, RefreshSettings, Refused

    columns = pl.read_csv(files[0], n_rows=1).columns
    flags = {"label": LABEL, "categorical": tuple(c for c in columns if c.startswith("cat")),
             "numerical": tuple(c for c in columns if c.startswith("num"))}  # fmt: skip
    settings = RefreshSettings(work / "repo", "ctr", train_options=options)
    records = []
    for i, f in enumerate(files):
        try:
            record = Refresh(settings, flags if i == 0 else {}, lambda line: None).run([f])
        except Refused:
            record = Refresh(settings, {}, lambda line: None).store.history()[-1]
        keep = ("day", "verdict", "reason", "progressive", "gate", "seconds", "version")
        records.append({k: record.get(k) for k in keep})
        auc = (record.get("progressive") or {}).get("auc")
        log(f"day {record['day']}: {record['verdict']}" + (f", progressive AUC {auc:.4f}" if auc else "")
            + f" ({record['seconds']:.1f} s)")  # fmt: skip
    return records


def run_refresh_bench(work: Path, days: int, rows: int, vocabularies: Sequence[int], clean_seeds: Sequence[int],
                      broken_seed: int, options: dict[str, Any], log: Callable[[str], None] = print
                      ) -> dict[str, Any]:  # fmt: skip
    """Clean streams of ``clean_seeds`` and a stream of ``broken_seed`` whose days 4, 5 and 6 are broken (``BREAKS``);
    each ``days`` days of ``rows`` rows. Returns each stream's day records and the counts the targets read."""
    if days < 6:
        raise ValueError(f"`days`: the broken stream breaks days 4 to 6; expected at least 6, got {days}")
    streams: dict[str, Any] = {}
    for seed in clean_seeds:
        files = write_text_days(work / f"clean-{seed}" / "days", days, rows, vocabularies, seed)
        log(f"clean stream, seed {seed}")
        streams[f"clean-{seed}"] = run_stream(files, work / f"clean-{seed}", options, log)
    files = write_text_days(work / f"broken-{broken_seed}" / "days", days, rows, vocabularies, broken_seed)
    breaks = {4: "shuffled", 5: "renamed", 6: "missing"}
    files = [broken_day(f, f.with_name(f"{breaks[i]}_{f.name}"), breaks[i], broken_seed) if i in breaks else f
             for i, f in enumerate(files, start=1)]  # fmt: skip
    log(f"stream with broken days 4-6 ({', '.join(breaks.values())}), seed {broken_seed}")
    streams[f"broken-{broken_seed}"] = run_stream(files, work / f"broken-{broken_seed}", options, log)
    clean = [r for name, s in streams.items() if name.startswith("clean") for r in s]
    broken = [r for r in streams[f"broken-{broken_seed}"] if r["day"] in breaks]
    aucs = [r["progressive"]["auc"] for r in clean if r.get("progressive")]
    summary = {
        "clean_days": len(clean),
        "false_refusals": sum(r["verdict"] == "refused" for r in clean),
        "clean_kept": sum(r["verdict"] == "kept" for r in clean),
        "broken_days": len(broken),
        "broken_refused": sum(r["verdict"] == "refused" for r in broken),
        "broken_published": sum(r["verdict"] == "published" for r in broken),
        "mean_progressive_auc_clean": round(float(np.mean(aucs)), 5) if aucs else None,
        "mean_day_seconds": round(float(np.mean([r["seconds"] for r in clean])), 2),
    }
    return {"streams": streams, "breaks": {str(k): v for k, v in breaks.items()}, "summary": summary}
