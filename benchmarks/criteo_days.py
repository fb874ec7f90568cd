"""Criteo one day at a time: does a model continued on each next day written `--like` it (its vocabularies extended by
the values it has not seen) score the following day at least as well as one whose vocabulary was fixed on the first
day (the same loop, every new value the shared rare id: `--like` with a frequency threshold no value reaches)?

Each log is cut into days. Day 0 is preprocessed and trained on once; then, for each later day and each way, the
current model scores the day's raw rows (`predict --input`, the day file as it is: what it would have served), and the
day is written `--like` the model and trained on (`train --continue-from`, one epoch). The result lists each way's AUC
and log loss on every day it scored, their means, and each day's vocabulary growth.

Logs: a generated one (`ctrkit synth`'s raw Criteo TSV, power-law values: new values keep arriving) and, where the
project's shared data holds it, the first 10,000 rows of Criteo's Kaggle training file (cut into 4 days).

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/criteo_days.py
        -> benchmarks/results/criteo-days/<machine kind>.json
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import polars as pl
from sklearn.metrics import log_loss, roc_auc_score

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from collect import machine_kind  # noqa: E402

from ctrkit.bench.peak import machine  # noqa: E402
from ctrkit.cli import main as cli_main  # noqa: E402
from ctrkit.data.synthetic import write_criteo_tsv  # noqa: E402

REAL = ROOT.parent / "shared" / "data" / "criteo_kaggle" / "train_head_10k.txt"
WAYS = {"like": 3, "fixed": 10**9}  # --frequency-threshold of each later day: the recipe's, or one nothing reaches
GENERATED = (1460, 583, 30000, 20000, 305, 24, 12517, 633, 3, 9300, 5683, 25000, 3194, 27, 14992, 25000, 10, 5652,
             2173, 4, 25000, 18, 15, 28600, 105, 14200)  # fmt: skip


def ctrkit(*args) -> None:
    """Runs a ctrkit command in this process (its output kept back); a failure stops the benchmark, saying why."""
    said, errors = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(said), contextlib.redirect_stderr(errors):
        code = cli_main([str(a) for a in args])
    if code:
        raise SystemExit(f"ctrkit {' '.join(map(str, args))}: {errors.getvalue().strip()[-2000:]}")


def cut_days(lines: list[bytes], days: int, work: Path) -> list[Path]:
    size = len(lines) // days
    paths = []
    for d in range(days):
        path = work / f"day_{d}.tsv"
        path.write_bytes(b"".join(lines[d * size : (d + 1) * size]))
        paths.append(path)
    return paths


def score(model: Path, day: Path, work: Path) -> dict:
    """The model's AUC and log loss on a day's raw rows (``predict --input`` of the day file)."""
    out = work / "scores.csv"
    ctrkit("predict", "--checkpoint", model, "--input", day, "--out", out, "--keep", "label", "--no-progress")
    table = pl.read_csv(out)
    y, p = table["label"].to_numpy(), np.clip(table["probability"].to_numpy(), 1e-7, 1 - 1e-7)
    return {"auc": float(roc_auc_score(y, p)), "logloss": float(log_loss(y, p)), "rows": len(y)}


def run_log(name: str, days: list[Path], work: Path, train_flags: list[str]) -> dict:
    first = work / "m0.pt"
    ctrkit("preprocess", "criteo", days[0], "--out", work / "d0", "--no-progress")
    ctrkit("train", "--dataset", work / "d0", "--save-checkpoint", first, *train_flags)
    out: dict = {"log": name, "days": len(days), "rows_per_day": sum(1 for _ in open(days[0], "rb")), "ways": {}}
    for way, threshold in WAYS.items():
        model, scored = first, []
        for d in range(1, len(days)):
            start = time.perf_counter()
            result = score(model, days[d], work)
            data, nxt = work / f"{way}_d{d}", work / f"{way}_m{d}.pt"
            ctrkit("preprocess", "criteo", days[d], "--like", model, "--frequency-threshold", threshold, "--out", data,
                   "--no-progress")  # fmt: skip
            ctrkit("train", "--dataset", data, "--continue-from", model, "--save-checkpoint", nxt, *train_flags)
            summary = json.loads((data / "summary.json").read_text())
            result.update(day=d, table_rows=sum(summary["cardinalities"].values()),
                          seconds=round(time.perf_counter() - start, 1))  # fmt: skip
            scored.append(result)
            model = nxt
        out["ways"][way] = {
            "per_day": scored,
            "mean_auc": float(np.mean([r["auc"] for r in scored])),
            "mean_logloss": float(np.mean([r["logloss"] for r in scored])),
        }
    out["like_minus_fixed_auc"] = out["ways"]["like"]["mean_auc"] - out["ways"]["fixed"]["mean_auc"]
    print(f"{name}: mean next-day AUC like {out['ways']['like']['mean_auc']:.4f}, fixed on day 0 "
          f"{out['ways']['fixed']['mean_auc']:.4f} ({out['like_minus_fixed_auc']:+.4f})", flush=True)  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=ROOT / "build" / "bench" / "criteo-days")
    parser.add_argument("--output", type=Path, default=None, help="default: benchmarks/results/criteo-days/KIND.json")
    parser.add_argument("--days", type=int, default=6, help="days of the generated log")
    parser.add_argument("--rows", type=int, default=60_000, help="rows of each generated day")
    parser.add_argument("--steps", type=int, default=None, help="train --max-steps per day (default: one epoch)")
    parser.add_argument("--no-real", action="store_true", help="leave out the shared Criteo sample")
    args = parser.parse_args(argv)
    train_flags = ["--no-progress", "--batch-size", "512", "--seed", "0"]
    train_flags += ["--max-steps", str(args.steps)] if args.steps else ["--epochs", "1"]
    logs = []
    work = args.work / "generated"
    work.mkdir(parents=True, exist_ok=True)
    log = write_criteo_tsv(work / "log.tsv", args.days * args.rows, GENERATED, seed=11, overwrite=True,
                           progress=False)  # fmt: skip
    logs.append(run_log("generated", cut_days(log.read_bytes().splitlines(keepends=True), args.days, work), work,
                        train_flags))  # fmt: skip
    if REAL.exists() and not args.no_real:
        work = args.work / "criteo-kaggle-head"
        work.mkdir(parents=True, exist_ok=True)
        logs.append(run_log("criteo-kaggle-head", cut_days(REAL.read_bytes().splitlines(keepends=True), 4, work),
                            work, train_flags))  # fmt: skip
    where = machine()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    rows = []  # the page's table (``benchmarks/render.py``): each day scored, then each way's means
    for log in logs:
        for way, done in log["ways"].items():
            rows += [[log["log"], r["day"], way, round(r["auc"], 5), round(r["logloss"], 5), r["table_rows"],
                      r["seconds"]] for r in done["per_day"]]  # fmt: skip
        rows += [[log["log"], "mean", way, round(done["mean_auc"], 5), round(done["mean_logloss"], 5), "", ""]
                 for way, done in log["ways"].items()]  # fmt: skip
    doc = {"suite": "criteo-days", "machine_kind": machine_kind(where), "machine": where,
           "date": time.strftime("%Y-%m-%d"), "commit": commit.stdout.strip(),
           "command": "OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/criteo_days.py",
           "columns": ["log", "day scored", "vocabulary", "AUC", "log loss", "table rows", "seconds"], "rows": rows,
           "train_flags": train_flags, "logs": logs}  # fmt: skip
    output = args.output or ROOT / "benchmarks" / "results" / "criteo-days" / f"{machine_kind(where)}.json"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
