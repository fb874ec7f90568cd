"""What each mechanism of a recipe earns: the recipe's run, then the same run with one mechanism off, per data
set and training seed.

A mechanism whose effect the run reports itself (``Mechanism.derived``: calibration, ensembles) is read from the
recipe's run; one that the recipe's run never used (no table redraw happened, no plateau was reached, no
second batch was trained) is not run again: switching it off gives the same run. Results are appended to
``results.json`` as each run ends, so an interrupted ablation resumes where it stopped.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ctrkit.bench.panel import PanelEntry
from ctrkit.data.atomic import atomic_file
from ctrkit.train.mechanisms import MECHANISMS, Mechanism

BASE = "recipe"  # the variant with every mechanism as the recipe sets it


def _read_log(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def unused(name: str, result: dict[str, Any], log: list[dict[str, Any]]) -> bool:
    """Whether the recipe's run never used mechanism ``name`` (so a run without it is the same run)."""
    if name == "redraws":
        return not any(r.get("event") == "reinit_embeddings" for r in log)
    if name == "plateau":
        return all(r.get("lr_scale", 1.0) == 1.0 for r in log if r.get("event") == "eval")
    if name == "small_batch":  # one batch size trained
        return len({r["config"].get("batch_size") for r in log if r.get("event") == "start"}) < 2
    if name in ("warm_start", "warm_start_logloss") and not any(r.get("event") == "warm_start" for r in log):
        return True
    if name == "warm_start_logloss":  # no evaluation that beat the kept one was refused for its log loss
        start = next((r["config"] for r in log if r.get("event") == "start"), {})
        evals = [r for r in log if r.get("event") == "eval"]
        if not evals:
            return True
        baseline, best = evals[0]["logloss"], evals[0]["auc"]
        for r in evals[1:]:
            if r["auc"] > best + start.get("min_delta", 0.0):
                if r["logloss"] >= baseline:
                    return False
                best = r["auc"]
        return True
    if name == "decay":  # the run ended before its decay began
        starts = [r["config"] for r in log if r.get("event") == "start"]
        if not starts or any(c.get("decay_steps") is None for c in starts):  # a schedule not recorded: run it
            return False
        return all(c["decay_steps"] == 0 or result.get("step", 0) <= c["decay_start_step"] for c in starts)
    return False


def _scores(result: dict[str, Any]) -> dict[str, Any]:
    keep = ("auc", "logloss", "uncalibrated", "single", "best_step", "step", "batch_size", "member_ensemble",
            "ensemble")  # fmt: skip
    out = {k: result[k] for k in keep if k in result}
    out["validation_auc"] = (result.get("validation") or {}).get("auc")
    return out


def run_ablation(
    entries: Sequence[PanelEntry],
    model: str,
    mechanisms: Sequence[str],
    seeds: Sequence[int],
    out: Path,
    recipe: str | None = None,
    settings: dict[str, dict[str, Any]] | None = None,
    echo=print,
) -> list[dict[str, Any]]:
    """Runs the ablation: per data set and seed the recipe's run, each of ``mechanisms`` switched alone (off, or
    on for an opt-in one) and each of ``settings`` (a name -> training or model fields, e.g. a lower maximum of
    epochs); returns (and keeps in ``out/results.json``) one record per run."""
    from ctrkit.train.run import train

    out.mkdir(parents=True, exist_ok=True)
    path = out / "results.json"
    records: list[dict[str, Any]] = json.loads(path.read_text()) if path.exists() else []
    done = {(r["dataset"], r["seed"], r["variant"]) for r in records}

    from ctrkit.bench.peak import machine

    where = machine()

    def keep(record: dict[str, Any]) -> None:
        records.append({**record, "machine": where})
        with atomic_file(path) as tmp:
            Path(tmp).write_text(json.dumps(records, indent=1))

    for entry in entries:
        for seed in seeds:
            log_path = out / "logs" / f"{entry.name}-s{seed}-{BASE}.jsonl"
            variants: list[tuple[str, Mechanism | None]] = [(BASE, None), *((n, MECHANISMS[n]) for n in mechanisms)]
            variants += [(n, Mechanism(n, "a setting", dict(v), opt_in=True)) for n, v in (settings or {}).items()]
            base_result = next((r for r in records if (r["dataset"], r["seed"], r["variant"]) ==
                                (entry.name, seed, BASE)), None)  # fmt: skip
            for name, mech in variants:
                if (entry.name, seed, name) in done:
                    continue
                record = {"dataset": entry.name, "seed": seed, "variant": name, "bayes_auc": entry.bayes_auc,
                          "switched": "on" if mech is not None and mech.opt_in else "off",
                          "setting": name in (settings or {})}  # fmt: skip
                if mech is not None and mech.derived is not None:
                    keep({**record, "derived": mech.derived})
                    continue
                if mech is not None and not mech.opt_in and unused(name, base_result["result"], _read_log(log_path)):
                    keep({**record, "unused": True})
                    continue
                start = time.perf_counter()
                run_log = out / "logs" / f"{entry.name}-s{seed}-{name}.jsonl"
                run_log.parent.mkdir(parents=True, exist_ok=True)
                run_log.unlink(missing_ok=True)
                off = {**mech.toggle_train, **mech.toggle_model} if mech is not None else {}
                result = train(entry.path, model=model, progress=False, seed=seed, recipe=recipe,
                               log_path=run_log, **off)  # fmt: skip
                record.update(result=_scores(result), seconds=time.perf_counter() - start)
                keep(record)
                if mech is None:
                    base_result = record
                echo(f"{entry.name} seed {seed} {name}: test AUC {result['auc']:.4f} logloss {result['logloss']:.4f} "
                     f"({record['seconds']:.0f} s)")  # fmt: skip
    return records


def _without(record: dict[str, Any], base: dict[str, Any]) -> dict[str, float]:
    """The test scores of ``record``'s variant: its run's, the recipe's run's (unused), or the part the recipe's
    run reported (derived)."""
    res = base["result"]
    if record.get("unused"):
        return {"auc": res["auc"], "logloss": res["logloss"]}
    if record.get("derived"):
        part = res.get(record["derived"])
        if record["derived"] == "single":  # the single model beside the ensemble, both unscaled
            whole = res.get("uncalibrated") or res
            return part or {"auc": whole["auc"], "logloss": whole["logloss"]}
        return part or {"auc": res["auc"], "logloss": res["logloss"]}
    return {"auc": record["result"]["auc"], "logloss": record["result"]["logloss"]}


def _with(record: dict[str, Any], base: dict[str, Any]) -> dict[str, float]:
    """The recipe's scores to compare ``record``'s against (an ensemble's unscaled, beside its single model's)."""
    res = base["result"]
    if record.get("derived") == "single" and res.get("uncalibrated"):
        return res["uncalibrated"]
    return {"auc": res["auc"], "logloss": res["logloss"]}


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Per data set and mechanism: what it earns on the mean over seeds (AUC with it minus without; log loss
    without minus with: positive is a gain), the worst seed, the recipe's seed spread (max - min test AUC), and
    per mechanism the verdict: kept where it gains on the mean somewhere and loses nowhere by more than the
    spread."""
    bases = {(r["dataset"], r["seed"]): r for r in records if r["variant"] == BASE}
    table: dict[str, dict[str, Any]] = {}
    datasets = list(dict.fromkeys(r["dataset"] for r in records))
    mechanisms = list(dict.fromkeys(r["variant"] for r in records if r["variant"] != BASE))
    spread: dict[str, float | None] = {}  # None: one seed, no spread measured (such a data set does not vote)
    for d in datasets:
        aucs = [b["result"]["auc"] for (dd, _), b in bases.items() if dd == d]
        spread[d] = max(aucs) - min(aucs) if len(aucs) > 1 else None
    for m in mechanisms:
        row: dict[str, Any] = {}
        for d in datasets:
            pairs = [(r, bases[(d, r["seed"])]) for r in records if r["dataset"] == d and r["variant"] == m
                     and (d, r["seed"]) in bases]  # fmt: skip
            if not pairs:
                continue
            sign = [-1.0 if r.get("switched") == "on" else 1.0 for r, _ in pairs]  # on: the variant has it
            auc = [s * (_with(r, b)["auc"] - _without(r, b)["auc"]) for s, (r, b) in zip(sign, pairs)]
            loss = [s * (_without(r, b)["logloss"] - _with(r, b)["logloss"]) for s, (r, b) in zip(sign, pairs)]
            row[d] = {"auc": statistics.mean(auc), "logloss": statistics.mean(loss), "worst_auc": min(auc),
                      "seeds": len(pairs), "unused": all(r.get("unused") for r, _ in pairs),
                      "derived": any(r.get("derived") for r, _ in pairs)}  # fmt: skip
        used = {d: c for d, c in row.items() if not c["unused"]}
        gains = any(c["auc"] > 0 or c["logloss"] > 0 for c in used.values())
        loses = any(spread[d] is not None and c["auc"] < -spread[d] for d, c in used.items())
        verdict = "unused" if not used else ("keep" if gains and not loses else "drop")
        if any(r.get("setting") for r in records if r["variant"] == m):
            verdict = "(a setting)"
        elif any(r.get("switched") == "on" for r in records if r["variant"] == m):
            verdict = "opt-in: " + ("earns" if gains and not loses else "does not earn")
        table[m] = {"datasets": row, "verdict": verdict}
    return {"spread": spread, "mechanisms": table, "datasets": datasets}


def markdown(summary: dict[str, Any]) -> str:
    """The table: per mechanism and data set, test AUC earned (log loss earned, x1000), the verdict."""
    datasets = summary["datasets"]
    lines = ["| mechanism | " + " | ".join(datasets) + " | verdict |", "| --- |" + " ---: |" * len(datasets) + " --- |"]
    for name, row in summary["mechanisms"].items():
        cells = []
        for d in datasets:
            c = row["datasets"].get(d)
            if c is None:
                cells.append("")
            elif c["unused"]:
                cells.append("unused")
            else:
                cells.append(f"{c['auc']:+.4f} ({1000 * c['logloss']:+.1f})")
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {row['verdict']} |")
    spreads = [summary["spread"][d] for d in datasets]
    lines.append("| seed spread (AUC) | " + " | ".join("" if x is None else f"{x:.4f}" for x in spreads) + " | |")
    return "\n".join(lines) + "\n"
