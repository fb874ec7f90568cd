"""Condense one benchmark run's raw JSON into the suite's result file for its machine kind.

    python benchmarks/collect.py SUITE RAW_DIR_OR_FILE [--kind KIND] [--command CMD] [--date D] [--commit C]

writes ``benchmarks/results/SUITE/KIND.json``: the machine, the date, the commit, the command, and a table
(``columns`` and ``rows``) that ``benchmarks/render.py`` turns into the benchmarks page. The raw files stay
where the script wrote them (under ``build/``); only the condensed result is kept in the repository. The
kind is read from the raw files' ``machine`` record unless ``--kind`` names it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import statistics
import subprocess
from collections.abc import Callable
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
SUITES: dict[str, Callable[[list[tuple[str, dict]]], tuple[list[str], list[list]]]] = {}


def suite(name: str):
    def register(fn):
        SUITES[name] = fn
        return fn

    return register


def machine_kind(machine: dict) -> str:
    """A short name for the kind of machine a run used: ``gpu-h100``, ``cpu-amx``, ``cpu-avx512``, ``cpu-avx2``."""
    if machine.get("cuda"):
        return "gpu-" + re.sub(r"[^a-z0-9]+", "-", str(machine["cuda"]).lower().replace("nvidia ", "")).split("-")[0]
    features = set(machine.get("cpu_features") or ())
    if "amx_bf16" in features:
        return "cpu-amx"
    if machine.get("capability") == "AVX512":
        return "cpu-avx512"
    return "cpu-" + str(machine.get("capability", "unknown")).lower()


def _median(values: list[float]) -> float:
    return statistics.median(values)


def _grouped(raw: list[tuple[str, dict]]) -> dict[str, list[dict]]:
    """Files named ``VARIANT_ROUND.json`` grouped by variant, rounds in order."""
    groups: dict[str, list[tuple[int, dict]]] = {}
    for stem, data in raw:
        variant, _, rnd = stem.rpartition("_")
        if not rnd.isdigit():
            variant, rnd = stem, "1"
        groups.setdefault(variant, []).append((int(rnd), data))
    return {k: [d for _, d in sorted(v, key=lambda x: x[0])] for k, v in sorted(groups.items())}


def _precision(run: dict) -> str:
    return run.get("amp_dtype") or "fp32"


@suite("train")
@suite("train-models")
@suite("flops")
@suite("train-cuda")
@suite("disk-tables")
def train_rows(raw):
    """``ctrkit bench train`` runs, one variant per file stem, interleaved rounds: medians and each round."""
    columns = [
        "variant",
        "model",
        "precision",
        "embedding gradients",
        "batch",
        "samples/s (median)",
        "ms/step",
        "per round",
        "fraction of matmul peak",
    ]
    rows = []
    for variant, runs in _grouped(raw).items():
        r = runs[0]
        cfg = r.get("config", {})
        sps = [x["samples_per_s"] for x in runs]
        frac = [x["fraction_of_peak"] for x in runs if x.get("fraction_of_peak") is not None]
        rows.append(
            [
                variant,
                cfg.get("model", "dlrm"),
                _precision(r),
                "dense" if cfg.get("dense_gradients") else "sparse",
                cfg.get("batch_size"),
                round(_median(sps)),
                round(_median([x["ms_per_step"] for x in runs]), 1),
                ", ".join(f"{v:,.0f}" for v in sps),
                f"{_median(frac):.0%}" if frac else "",
            ]
        )
    return columns, rows


@suite("breakdown")
def breakdown_rows(raw):
    """``ctrkit bench train --breakdown``: milliseconds a step by part."""
    columns = ["model", "precision", "total ms", "forward", "backward", "optimizers", "matmul ms"]
    rows = []
    for _, r in sorted(raw):
        b = r["breakdown"]
        ms = b["ms"]
        opt = sum(v for k, v in ms.items() if k not in ("forward", "backward"))
        rows.append(
            [
                r["config"]["model"],
                _precision(r),
                round(b["total_ms"], 1),
                round(ms["forward"], 1),
                round(ms["backward"], 1),
                round(opt, 1),
                round(b.get("matmul_ms", 0.0), 1),
            ]
        )
    return columns, rows


@suite("compare")
def compare_rows(raw):
    """``benchmarks/compare_train.py``: ctrkit against plain PyTorch and TorchRec on the same shape."""
    columns = ["implementation", "samples/s", "fraction of fp32 matmul peak", "ctrkit's speed-up"]
    rows = []
    for _, r in raw[-1:]:
        for name, sps in r["samples_per_s"].items():
            frac = r.get("fraction_of_fp32_peak", {}).get(name)
            speedup = r.get("ctrkit_speedup", {}).get(name)
            rows.append([name, round(sps), f"{frac:.0%}" if frac else "", f"{speedup:.2f}x" if speedup else ""])
    return columns, rows


@suite("gpu")
def gpu_rows(raw):
    """``benchmarks/run_gpu.sh``: the step against plain PyTorch, the run end to end against its step, the start,
    the loader, the loop's host synchronisations and the host-memory tier, on one GPU; the accuracy panel's test AUC
    in each precision against the first (fp32), and its training time's ratio."""
    columns = ["check", "precision", "value", "against", "ratio", "target"]
    parts = dict(raw)
    rows = []
    step = parts.get("step")
    if step:
        for p, r in step["samples_per_s"].items():
            rows.append(["step: ctrkit (samples/s) against plain PyTorch", p, round(r["ctrkit"]),
                         round(r["plain_pytorch"]), f"{r['ctrkit'] / r['plain_pytorch']:.2f}x", ""])  # fmt: skip
    for p, run in (parts.get("e2e") or {}).get("runs", {}).items():
        if "error" in run:
            rows.append(["end to end: train --recipe nvidia", p, "failed: " + " ".join(run["error"]), "", "", ""])
            continue
        alone = step["samples_per_s"].get(p, {}).get("ctrkit") if step else None
        rows.append(["end to end (samples/s) against the step alone", p, round(run["samples_per_s"]),
                     round(alone) if alone else "", f"{run['samples_per_s'] / alone:.0%}" if alone else "",
                     ">= 90%"])  # fmt: skip
        rows.append(["start to the first step (s)", p, run["start_to_first_step_s"], "", "", "<= 10"])
    loader = parts.get("loader")
    if loader:
        m = loader["median_samples_per_s"]
        rows.append(["loader fed to the GPU (samples/s) against the loader alone", "", round(m["loader_and_copy"]),
                     round(m["loader"]), f"{m['loader_and_copy'] / m['loader']:.0%}", ""])  # fmt: skip
        if "wide_pageable_copy" in m:
            rows.append(["wide batches copied from pageable memory (samples/s)", "", round(m["wide_pageable_copy"]),
                         round(m["loader"]), f"{m['wide_pageable_copy'] / m['loader']:.0%}", ""])  # fmt: skip
    syncs = parts.get("syncs")
    if syncs:
        where = "; ".join(f"{k.split('site-packages/')[-1]} x{v}" for k, v in syncs["where"].items())
        rows.append(["host synchronisations a step (feed and step)", "fp32", syncs["per_step"], where, "", "0"])
    host = parts.get("host")
    if host:
        r = host["samples_per_s"]
        rows.append([f"tables in host memory, the GPU capped at {host['cap_of_tables']:.0%} of their bytes (samples/s; "
                     f"a cache of {host['cache_rows'] / host['table_rows']:.0%} of the rows, hit rate "
                     f"{host['cache']['hit_rate']:.0%}) against on the GPU", "fp32",
                     round(r["tables_in_host_memory"]), round(r["tables_on_gpu"]), f"{host['host_of_gpu']:.2f}x",
                     ">= 0.5x"])  # fmt: skip
    resume = parts.get("resume")
    if resume:
        if "error" in resume:
            rows.append(["start to the first step, resumed", "", "failed: " + " ".join(resume["error"]), "", "", ""])
        else:
            rows.append([f"start to the first step (s), resumed from a checkpoint of "
                         f"{resume['checkpoint_bytes'] / 2**30:.1f} GiB, against a fresh start", "default",
                         resume["resumed"]["start_to_first_step_s"], resume["fresh"]["start_to_first_step_s"], "",
                         "<= 10"])  # fmt: skip
    for row in (parts.get("accuracy") or {}).get("rows", []):
        reference, *others = row["precisions"]  # the first precision given is the one the others are set against
        runs = {(r["model"], r["precision"]): r for r in row["results"].values() if r.get("precision")}
        models = dict.fromkeys(m for m, _ in runs)
        for model, p in ((m, p) for m in models for p in others if (m, p) in runs and (m, reference) in runs):
            r, first = runs[model, p], runs[model, reference]
            rows.append([f"test AUC of {model} on {row['dataset']} against {reference} (time ratio)",
                         r["computed_in"], round(r["auc"], 4), round(first["auc"], 4),
                         f"{r['seconds'] / first['seconds']:.2f}x", ""])  # fmt: skip
    return columns, rows


@suite("preprocess")
def preprocess_rows(raw):
    """``ctrkit bench preprocess``: end to end as a child process, interpreter start included."""
    columns = ["engine", "rows", "seconds (median)", "rows/s", "peak RSS MB", "repeats"]
    rows = [
        [
            r["engine"] + (f" {r['spark_master']}" if r.get("spark_master") else ""),
            r["rows"],
            round(r["seconds"], 1),
            round(r["rows_per_s"]),
            round(r["peak_rss_mb"]),
            r.get("repeats", 1),
        ]
        for _, r in sorted(raw, key=lambda x: (x[1]["engine"] != "polars", x[1]["rows"]))
    ]
    return columns, rows


@suite("scale")
def scale_rows(raw):
    """``ctrkit bench scale``: Merlin Distributed-Embeddings' synthetic models scaled down, per world size."""
    columns = [
        "model",
        "scale",
        "tables",
        "embeddings MiB",
        "ranks",
        "threads a rank",
        "ms/step",
        "largest rank's peak MiB",
    ]
    rows = []
    for _, data in raw:
        for r in data if isinstance(data, list) else [data]:
            rows.append(
                [
                    r["model"],
                    f"1/{r['scale']:g}",
                    r["tables"],
                    round(r["embedding_mib"], 1),
                    r["world_size"],
                    r["threads_per_rank"],
                    round(r["ms_per_step"], 1),
                    round(r["largest_rank_peak_rss_mib"]),
                ]
            )
    return columns, rows


@suite("inference")
def inference_rows(raw):
    """``ctrkit bench inference``: in process per runtime and batch, and through a real ``ctrkit serve``."""
    columns = ["where", "runtime", "batch", "clients", "samples/s", "p50 ms", "p99 ms"]
    rows = []
    for stem, data in sorted(raw):
        for r in data["results"]:
            where = "in process" if r["mode"] == "in-process" else "server"
            runtime = r.get("runtime") or stem.removeprefix("server_").rsplit("_batch", 1)[0]
            rows.append(
                [
                    where,
                    runtime,
                    r["batch_size"],
                    r.get("concurrency", ""),
                    round(r["samples_per_s"]),
                    round(r["p50_ms"], 3),
                    round(r["p99_ms"], 3),
                ]
            )
    return columns, rows


def _cell(res: dict | None) -> list[float] | None:
    return None if res is None else [res["auc"], res["logloss"]]


@suite("accuracy")
@suite("accuracy-independent")
@suite("accuracy-sizes")
def accuracy_rows(raw):
    """``ctrkit bench accuracy``: test AUC (log loss) of each model with its defaults and of the baselines;
    a cell is ``[auc, logloss]`` at full precision."""
    columns = [
        "data set",
        "train / validation / test",
        "Bayes AUC",
        "logistic regression",
        "LightGBM",
        "DLRM",
        "DCNv2",
        "Wide & Deep",
    ]
    rows = []
    for _, data in raw:
        for row in data["rows"]:
            res, n = row["results"], row["rows"]
            sizes = " / ".join(f"{n[k]:,}" for k in ("train", "validation", "test") if k in n)
            bayes = round(row["bayes_auc"], 4) if row.get("bayes_auc") else ""
            rows.append(
                [row["dataset"], sizes, bayes]
                + [_cell(res.get(m)) for m in ("logistic", "lightgbm", "dlrm", "dcnv2", "wide_deep")]
            )
    return columns, rows


@suite("ablation")
def ablation_rows(raw):
    """``ctrkit bench ablation``: per mechanism and data set, what the mechanism earns on the mean over training
    seeds (test AUC with it minus without; log loss without minus with, so positive is a gain either way), the
    worst seed's AUC gain, the recipe's seed spread (max - min test AUC) and the verdict over all data sets."""
    from ctrkit.bench.ablation import summarize

    summary = summarize([r for _, data in raw for r in data])
    columns = ["mechanism", "data set", "seeds", "AUC earned", "log loss earned", "worst seed", "seed spread",
               "verdict"]  # fmt: skip
    rows = []
    for name, row in summary["mechanisms"].items():
        for dataset, c in row["datasets"].items():
            earned = ["unused", "unused", "unused"] if c["unused"] else [
                round(c["auc"], 5), round(c["logloss"], 5), round(c["worst_auc"], 5)]  # fmt: skip
            spread = summary["spread"][dataset]
            rows.append([name, dataset, c["seeds"], *earned, None if spread is None else round(spread, 5),
                         row["verdict"]])  # fmt: skip
    return columns, rows


@suite("checkpoint")
def checkpoint_rows(raw):
    """``ctrkit bench checkpoint``: a checkpoint's save, load and memory-mapped open, without and with its digest
    (medians of interleaved rounds), and the digest's share."""
    columns = ["size (MiB)", "operation", "without digest (s)", "with digest (s)", "difference", "digest alone (s)",
               "digest alone / without", "rounds"]  # fmt: skip
    rows = []
    for _, data in raw:
        m = data["median_seconds"]
        for op, share in (("save", data["save_overhead"]), ("load", data["load_overhead"])):
            rows.append([data["size_mb"], op, round(m[op], 3), round(m[f"{op}_digest"], 3), f"{share:+.1%}",
                         round(m["digest"], 3), f"{m['digest'] / m[op]:.1%}", data["rounds"]])  # fmt: skip
        if "mmap" in m:  # a memory-mapped open reads nothing: its check's cost, in seconds and against a load
            extra = m["mmap_digest"] - m["mmap"]
            rows.append([data["size_mb"], "memory-mapped open", round(m["mmap"], 3), round(m["mmap_digest"], 3),
                         f"+{extra:.3f} s ({extra / m['load']:.1%} of a load)", round(m["digest"], 3),
                         f"{m['digest'] / m['load']:.1%} of a load", data["rounds"]])  # fmt: skip
    return columns, rows


@suite("epoch")
def epoch_rows(raw):
    """``ctrkit bench epoch``: per 5% of the epoch, samples/s and resident memory; then the phases' seconds."""
    columns = ["rows", "part", "samples/s", "resident memory (GiB)", "anonymous memory (GiB)", "phase", "seconds",
               "the phase's peak anonymous memory (GiB)"]  # fmt: skip
    gib = lambda b: None if b is None else round(b / 2**30, 2)  # noqa: E731
    rows = []
    for _, data in raw:
        peaks = dict(data.get("peak_anon_bytes_by_phase") or {})
        phases = []
        for name, seconds in data["phases_seconds"].items():
            key = next((k for k in peaks if name.split(" (")[0] == k.split(" (")[0]), None)
            phases.append((name, seconds, peaks.pop(key) if key else None))
        phases += [(name, None, peak) for name, peak in peaks.items()]  # before the first step, after the last
        for k, share in enumerate(data["shares"]):
            phase, seconds, peak = phases[k] if k < len(phases) else ("", None, None)
            rate, rss, anon = share["samples_per_s"], share["rss_bytes"], share.get("anon_bytes")
            rows.append([data["rows"], share["share"], None if rate is None else round(rate), gib(rss), gib(anon),
                         phase, None if seconds is None else round(seconds, 1), gib(peak)])  # fmt: skip
    return columns, rows


@suite("fl15-cgroup")
def fl15_cgroup_rows(raw):
    """benchmarks/fl15_cgroup.py: each phase of the seeds' DLRM on FL15 tables inside a memory cgroup."""
    columns = ["phase", "exit status", "seconds", "cgroup peak, page cache included (GiB)",
               "peak anonymous memory (GiB)", "cgroup limit (GiB)"]  # fmt: skip
    rows = []
    for _, data in raw:
        for phase, r in data["phases"].items():
            anon = r.get("peak_anon_bytes")
            anon = None if anon is None else round(anon / 2**30, 2)
            rows.append([phase, r["exit"], r["seconds"], round(r["peak_bytes"] / 2**30, 2), anon,
                         round(data["limit_bytes"] / 2**30, 2)])  # fmt: skip
    return columns, rows


@suite("stream")
def stream_rows(raw):
    """``ctrkit bench stream``: per test day and method, test AUC, log loss, training seconds, table rows; then the
    means over the test days."""
    columns = ["test day", "method", "test AUC", "test log loss", "training seconds", "table rows",
               "rows held by an id", "tables and id maps (MiB)"]  # fmt: skip
    rows = []
    for _, data in raw:
        for day in data["days"]:
            for method in ("fixed", "retrain", "dynamic"):
                if method in day:
                    r = day[method]
                    rows.append([day["test_day"], method, r["auc"], r["logloss"], r["train_seconds"], r["table_rows"],
                                 r.get("rows_held"), r.get("table_mib")])  # fmt: skip
        for method, s in data["summary"].items():
            rows.append([f"mean of days 2-{len(data['days']) + 1} (seconds: sum)", method, s["mean_auc"],
                         s["mean_logloss"], s["train_seconds"], s["most_table_rows"], None,
                         s.get("most_table_mib")])  # fmt: skip
    return columns, rows


@suite("table-stream")
def table_stream_rows(raw):
    """``ctrkit bench table-stream``: per test day and method, next-day AUC and log loss from the raw rows, seconds
    (preprocessing and training), table rows; then the means over the test days."""
    columns = ["test day", "method", "next-day AUC", "next-day log loss", "seconds", "table rows"]
    rows = []
    for _, data in raw:
        for day in data["days"]:
            for method in ("like", "raw_ids", "retrain", "regression"):
                if method in day:
                    r = day[method]
                    rows.append([day["test_day"], method, r["auc"], r["logloss"], r["train_seconds"], r["table_rows"]])
        for method, s in data["summary"].items():
            rows.append([f"mean of days 2-{len(data['days']) + 1} (seconds: sum)", method, s["mean_auc"],
                         s["mean_logloss"], s["train_seconds"], s["most_table_rows"]])  # fmt: skip
    return columns, rows


@suite("refresh")
def refresh_rows(raw):
    """``ctrkit bench refresh``: per log (family, clean or broken, seed) and day, `ctrkit refresh`'s verdict, the served
    model's AUC on the day before training on it (progressive), a model retrained on all days so far and a logistic
    regression scored on the same day, the gate's served and candidate AUC on the held-out rows, the day's seconds and
    its steps' by hand, and the candidate the day took (continued, or fresh where one was trained beside it); then,
    per server, the requests of 4 clients across the version swaps."""
    columns = ["log", "day", "verdict", "progressive AUC", "retrained AUC", "regression AUC", "served (held out)",
               "candidate (held out)", "seconds", "by hand (s)", "taken"]  # fmt: skip
    rows = []
    for _, data in sorted(raw, key=lambda r: r[1]["config"]["family"], reverse=True):
        family = data["config"]["family"]
        for name, days in data["streams"].items():
            for d in days:
                gate = d.get("gate") or {}
                served, candidate = (gate.get("served") or {}).get("auc"), (gate.get("candidate") or {}).get("auc")
                taken = d.get("candidate") or ("continued" if gate else None)
                rows.append([f"{family} {name}", d["day"], d["verdict"], (d.get("progressive") or {}).get("auc"),
                             d.get("retrain_auc"), d.get("logistic_auc"), served, candidate, d["seconds"],
                             d.get("hand_seconds"), taken])  # fmt: skip
        for server, r in (data.get("swaps") or {}).items():
            if "skipped" not in r:
                said = (f"{r['failed']} of {r['steady']['requests'] + r['swap']['requests']:,} requests failed across "
                        f"{r['swaps']} swaps; p99 {r['steady']['p99_ms']} ms steady, {r['swap']['p99_ms']} ms around "
                        f"the swaps")  # fmt: skip
                rows.append([f"{family}: {server} serving 4 clients", None, said] + [None] * 8)
    return columns, rows


@suite("raw-rows")
def raw_rows_rows(raw):
    """``ctrkit bench raw-rows``: `predict --input` of a CSV of new rows end to end in a child process (median of
    interleaved rounds: rows/s, seconds, peak resident memory) at two file sizes; one-row requests to a real `ctrkit
    serve` on loopback, raw values and ids taking turns (latency percentiles)."""
    columns = ["what", "rows or requests", "rows/s", "seconds", "peak memory (MiB)", "p50 (ms)", "p99 (ms)"]
    rows = []
    for _, data in raw:
        for name, m in sorted(data["predict_median"].items(), key=lambda kv: -kv[1]["rows"]):
            rows.append([f"predict --input ({name})", m["rows"], m["rows_per_s"], m["seconds"], m["peak_rss_mib"],
                         None, None])  # fmt: skip
        for name, m in data["requests"].items():
            rows.append([f"one-row request ({name})", m["requests"], None, None, None, m["p50_ms"], m["p99_ms"]])
    return columns, rows


@suite("demo")
def demo_rows(raw):
    """`make demo`: what its run printed (the train summary line and `evaluate`'s line) and `evaluate --json`, as
    the README and the training page quote them."""
    columns = ["output", "text"]
    rows = []
    for _, data in raw:
        rows += [["train", data["train_line"]], ["evaluate", data["evaluate_line"]],
                 ["evaluate --json", data["evaluate_json"]]]  # fmt: skip
    return columns, rows


def _load(path: Path) -> list[tuple[str, dict]]:
    files = sorted(path.glob("*.json")) if path.is_dir() else [path]
    return [(p.stem, json.loads(p.read_text())) for p in files]


def _first_machine(raw: list[tuple[str, dict]]) -> dict | None:
    for _, data in raw:
        for d in data if isinstance(data, list) else [data]:
            if isinstance(d, dict) and d.get("machine"):
                return d["machine"]
    return None


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], capture_output=True, text=True, check=False).stdout.strip()


def collect(
    name: str,
    source: Path,
    kind: str | None = None,
    command: str = "",
    date: str | None = None,
    commit: str | None = None,
    notes: str = "",
    results: Path = RESULTS,
) -> Path:
    """Write ``results/NAME/KIND.json`` from the raw files under ``source``; returns its path."""
    raw = _load(source)
    if not raw:
        raise SystemExit(f"{source}: no JSON files to collect")
    columns, rows = SUITES[name](raw)
    machine = _first_machine(raw)
    kind = kind or (machine_kind(machine) if machine else None)
    if kind is None:
        raise SystemExit(f"{source}: the raw files record no machine; name its kind with --kind")
    result = {
        "suite": name,
        "what": SUITES[name].__doc__,
        "machine_kind": kind,
        "machine": machine,
        "date": date or datetime.date.today().isoformat(),
        "commit": commit or _git("rev-parse", "--short", "HEAD"),
        "command": command,
        "notes": notes,
        "columns": columns,
        "rows": rows,
    }
    out = results / name / f"{kind}.json"
    write(out, result)
    return out


def write(out: Path, result: dict) -> None:
    """Write a result atomically, one table row a line so that a rerun's diff reads row by row."""
    out.parent.mkdir(parents=True, exist_ok=True)
    body = dict(result)
    rows = ",\n  ".join(json.dumps(r) for r in body.pop("rows"))
    head = json.dumps(body, indent=1)[:-2]
    tmp = out.with_suffix(".tmp")
    tmp.write_text(f'{head},\n "rows": [\n  {rows}\n ]\n}}\n')
    tmp.replace(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("suite", choices=sorted(SUITES))
    p.add_argument("source", type=Path, help="a folder of raw JSON files, or one file")
    p.add_argument("--kind", help="the machine kind, where the raw files record no machine")
    p.add_argument("--command", default="", help="the command that made the raw files")
    p.add_argument("--date", help="the run's date (default: today)")
    p.add_argument("--commit", help="the code's commit (default: HEAD)")
    p.add_argument("--notes", default="", help="one line on how to read the table")
    a = p.parse_args()
    print(collect(a.suite, a.source, a.kind, a.command, a.date, a.commit, notes=a.notes))


if __name__ == "__main__":
    main()
