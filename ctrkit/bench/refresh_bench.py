"""``ctrkit bench refresh``: the daily loop on day-by-day CSV logs, run as a cron line would run ``ctrkit refresh``:
clean logs (every day should be published: a refusal is a false one) and a log with broken days (shuffled labels, a
renamed column, a column all missing: each should be refused). Two families of logs (``FAMILIES``): ``stream``, text
columns of ids born and fading every day with drifting effects (``table_stream.write_text_days``), and ``shop``, an
e-commerce log with a timestamp, a multi-valued column and a known best AUC (``synthetic_shop.shop_log``) cut into
days. Per day: the verdict, the served model's AUC on the day before training on it (progressive), the gate's
figures and the seconds; on clean days, beside it, a model retrained on all days so far and a tuned logistic
regression on the same dataset (its time parts included), and the day's steps run by hand."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from ctrkit.bench.table_stream import LABEL, write_text_days

BREAKS = ("shuffled", "renamed", "missing")


@dataclass(frozen=True)
class Family:
    """A family of day-by-day logs: ``write(out, days, rows, seed)`` writes the day files, ``flags`` are refresh's
    table flags for them (``preprocess table``'s), ``renamed`` the column a broken day renames, ``emptied`` the
    numerical column it leaves all missing."""

    write: Callable[[Path, int, int, int], list[Path]]
    flags: dict[str, Any]
    renamed: str
    emptied: str


def shop_days(out: Path, days: int, rows: int, seed: int) -> list[Path]:
    """``days`` CSV files of ``synthetic_shop.shop_log``'s seed ``seed``, ``rows`` rows each (consecutive rows: at 20 s
    apart, 4,320 rows are a day)."""
    from ctrkit.data.synthetic_shop import shop_log

    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for day in range(days):
        frame, _ = shop_log(rows, seed, first_row=day * rows)
        paths.append(out / f"day_{day + 1}.csv")
        frame.write_csv(paths[-1])
    return paths


def stream_family(vocabularies: Sequence[int]) -> Family:
    names = [f"cat{i}" for i in range(len(vocabularies))]
    write = lambda out, days, rows, seed: write_text_days(out, days, rows, vocabularies, seed)  # noqa: E731
    return Family(write, {"label": LABEL, "categorical": tuple(names),
                          "numerical": tuple(f"num{j}" for j in range(4))}, names[1], "num0")  # fmt: skip


SHOP = Family(shop_days, {"label": "clicked", "order_by": "ts", "categorical": ("user", "category", "device"),
                          "multi_hot": ("tags",), "numerical": ("price", "position")}, "category", "price")  # fmt: skip


def broken_day(day: Path, out: Path, how: str, family: Family, seed: int = 0) -> Path:
    """``day`` broken as ``how`` says: its labels shuffled, ``family``'s ``renamed`` column renamed, or its ``emptied``
    column all missing; written to ``out``."""
    rows = pl.read_csv(day, infer_schema=False)
    label = family.flags["label"]
    if how == "shuffled":
        rows = rows.with_columns(pl.Series(label, np.random.default_rng(seed).permutation(rows[label].to_numpy())))
    elif how == "renamed":
        rows = rows.rename({family.renamed: family.renamed + "_renamed"})
    elif how == "missing":
        rows = rows.with_columns(pl.lit(None, pl.String).alias(family.emptied))
    else:
        raise ValueError(f"unknown break {how!r}; expected one of {', '.join(BREAKS)}")
    rows.write_csv(out)
    return out


def run_stream(files: Sequence[Path], work: Path, flags: dict[str, Any], options: dict[str, Any],
               log: Callable[[str], None] = print, compare: bool = False,
               settings: dict[str, Any] | None = None) -> list[dict[str, Any]]:  # fmt: skip
    """``ctrkit refresh`` of each day of ``files`` in turn into a new repository in ``work`` (``settings``: refresh's
    settings beside its defaults, as ``RefreshSettings``' fields); the day records. With
    ``compare``, each later day also gets the seconds of its steps run by hand (``by_hand``, on the checkpoint served
    before it) and the baselines' AUCs on it (``baselines``)."""
    from ctrkit.refresh.loop import Refresh, RefreshSettings, Refused

    refresh_settings = RefreshSettings(work / "repo", "ctr", train_options=options, **(settings or {}))
    records = []
    for i, f in enumerate(files):
        store = Refresh(refresh_settings, {}, lambda line: None).store
        state = store.read()
        served = store.checkpoint(state.served.checkpoint) if state is not None and state.served else None
        if compare and served is not None:  # before the refresh: its checkpoint may be pruned after
            shutil.copyfile(served, work / "served-before.pt")
        try:
            record = Refresh(refresh_settings, flags if i == 0 else {}, lambda line: None).run([f])
        except Refused:
            record = Refresh(refresh_settings, {}, lambda line: None).store.history()[-1]
        keep = ("day", "verdict", "reason", "progressive", "gate", "candidates", "candidate", "seconds", "version")
        records.append({k: record.get(k) for k in keep})
        if compare and served is not None:
            hand = by_hand(f, work / "served-before.pt", work / "hand", flags, options)
            records[-1].update(hand_seconds=round(hand, 3), **baselines(files, i + 1, work, flags, options))
        auc = (record.get("progressive") or {}).get("auc")
        log(f"day {record['day']}: {record['verdict']}" + (f", progressive AUC {auc:.4f}" if auc else "")
            + f" ({record['seconds']:.1f} s)")  # fmt: skip
    return records


def by_hand(day: Path, served: Path, work: Path, flags: dict[str, Any], options: dict[str, Any]) -> float:
    """Seconds of the day's steps run by hand as the README's by-hand flow runs them: `preprocess table --like` the
    served checkpoint (its last 10% as test), `train --continue-from` it, `export` into a repository."""
    import time

    from ctrkit.checkpoint import load_checkpoint
    from ctrkit.export.exporter import export_checkpoint
    from ctrkit.preprocess.table import preprocess_table
    from ctrkit.preprocess.table_recipe import TableRecipe
    from ctrkit.train.run import train

    started = time.perf_counter()
    like = load_checkpoint(served, mmap=True, assemble=False).like(str(served))
    recipe = TableRecipe(label=flags["label"], order_by=flags.get("order_by"))
    preprocess_table([day], work / "data", recipe, like=like, overwrite=True)
    train(work / "data", progress=False, save_checkpoint=work / "hand.pt", continue_from=served, **options)
    export_checkpoint(work / "hand.pt", work / "repo", "triton", "ctr")
    return time.perf_counter() - started


def baselines(files: Sequence[Path], k: int, work: Path, flags: dict[str, Any], options: dict[str, Any]
              ) -> dict[str, float]:  # fmt: skip
    """Day ``k``'s (1-based) rows scored by a model retrained from scratch on days 1..k-1 (the preprocessing fitted
    on them, their last 10% its validation rows) and by a logistic regression on the same dataset (C tuned on the
    validation rows): the test AUCs."""
    from ctrkit.data.dataset import SplitBinaryDataset
    from ctrkit.data.feature_spec import FeatureSpec
    from ctrkit.eval.baselines import logistic_regression
    from ctrkit.eval.evaluator import Scoring
    from ctrkit.preprocess.table import preprocess_table
    from ctrkit.refresh.loop import table_recipe
    from ctrkit.train.run import train

    recipe, _ = table_recipe(flags, like=False)
    data = work / f"retrain-{k}"
    preprocess_table(files[: k - 1], data, recipe, test_files=[files[k - 1]], validation_fraction=0.1, overwrite=True)
    train(data, progress=False, save_checkpoint=work / f"retrain-{k}.pt", **options)
    retrain = Scoring.load(work / f"retrain-{k}.pt", data, mapping="test").evaluate()["auc"]
    spec = FeatureSpec.from_yaml(data)
    lr = logistic_regression(*(SplitBinaryDataset(spec, m) for m in ("train", "validation", "test")))["auc"]
    return {"retrain_auc": round(float(retrain), 5), "logistic_auc": round(float(lr), 5)}


def swaps(stream: Path, day: Path, work: Path, log: Callable[[str], None] = print) -> dict[str, Any]:
    """The versions a stream's refresh kept (``stream``'s state), exported for each server and placed one after
    another in a repository that ``ctrkit serve --poll-s`` and, where installed, real Triton in POLL mode serve to 4
    clients (``swap_latency.run_swaps``); per server its result."""
    from ctrkit.bench.swap_latency import run_swaps, triton_available
    from ctrkit.export.exporter import export_checkpoint
    from ctrkit.refresh.store import RefreshStore
    from ctrkit.serve.predictor import Predictor

    store = RefreshStore(stream / "repo", "ctr")
    state = store.read()
    kept = [store.checkpoint(v.checkpoint) for v in (*state.earlier, state.served)]
    kept = [c for c in kept if c.is_file()]
    specs = Predictor.from_checkpoint(kept[-1]).transform.input_specs()
    rows = pl.read_csv(day, infer_schema=False).head(8)
    out = {}
    for backend, server in (("onnx", "ctrkit"), ("python", "triton")):
        if server == "triton" and not triton_available():
            out[server] = {"skipped": "no Triton here: `make triton`"}
            continue
        staging = work / f"staging-{backend}"
        shutil.rmtree(staging, ignore_errors=True)
        for i, c in enumerate(kept, start=1):
            export_checkpoint(c, staging, "triton", "ctr", backend, version=i)
        versions = [staging / "ctr" / str(i) for i in range(1, len(kept) + 1)]
        out[server] = run_swaps(versions, staging / "ctr" / "config.pbtxt", rows, specs, work, server)
        r = out[server]
        log(f"{server}: {r['swaps']} swaps, {r['failed']} failed requests, p99 {r['steady'].get('p99_ms')} ms steady, "
            f"{r['swap'].get('p99_ms')} ms around the swaps")  # fmt: skip
    return out


def run_refresh_bench(work: Path, family: Family, days: int, rows: int, clean_seeds: Sequence[int],
                      broken_seed: int, options: dict[str, Any], log: Callable[[str], None] = print,
                      serve_swaps: bool = True, settings: dict[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
    """Clean streams of ``clean_seeds`` and a stream of ``broken_seed`` whose days 4, 5 and 6 are broken (``BREAKS``);
    each ``days`` days of ``rows`` rows. Returns each stream's day records and the counts the targets read, and
    with ``serve_swaps`` the first clean stream's versions served across swaps (``swaps``)."""
    if days < 6:
        raise ValueError(f"`days`: the broken stream breaks days 4 to 6; expected at least 6, got {days}")
    streams: dict[str, Any] = {}
    for seed in clean_seeds:
        files = family.write(work / f"clean-{seed}" / "days", days, rows, seed)
        log(f"clean log, seed {seed}")
        streams[f"clean-{seed}"] = run_stream(files, work / f"clean-{seed}", family.flags, options, log, compare=True,
                                              settings=settings)  # fmt: skip
    files = family.write(work / f"broken-{broken_seed}" / "days", days, rows, broken_seed)
    breaks = {4: "shuffled", 5: "renamed", 6: "missing"}
    files = [broken_day(f, f.with_name(f"{breaks[i]}_{f.name}"), breaks[i], family, broken_seed) if i in breaks
             else f for i, f in enumerate(files, start=1)]  # fmt: skip
    log(f"log with broken days 4-6 ({', '.join(breaks.values())}), seed {broken_seed}")
    streams[f"broken-{broken_seed}"] = run_stream(files, work / f"broken-{broken_seed}", family.flags, options, log,
                                                  settings=settings)  # fmt: skip
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
        "clean_after_breaks": [r["verdict"] for r in streams[f"broken-{broken_seed}"] if r["day"] > max(breaks)],
        "mean_progressive_auc_clean": round(float(np.mean(aucs)), 5) if aucs else None,
        "mean_day_seconds": round(float(np.mean([r["seconds"] for r in clean])), 2),
        "mean_retrain_auc": _mean([r.get("retrain_auc") for r in clean]),
        "mean_logistic_auc": _mean([r.get("logistic_auc") for r in clean]),
        "fresh_taken": sum(r.get("candidate") == "fresh" for r in clean),
        "median_time_ratio": round(
            float(np.median([r["seconds"] / r["hand_seconds"] for r in clean if r.get("hand_seconds")])), 3
        )
        if any(r.get("hand_seconds") for r in clean)
        else None,
    }
    result = {"streams": streams, "breaks": {str(k): v for k, v in breaks.items()}, "summary": summary}
    if serve_swaps:
        first = clean_seeds[0]
        result["swaps"] = swaps(work / f"clean-{first}", work / f"clean-{first}" / "days" / f"day_{days}.csv",
                                work / "swaps", log)  # fmt: skip
    return result


def _mean(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return round(float(np.mean(known)), 5) if known else None
