"""``ctrkit report``: one self-contained HTML page about a trained model.

The page holds the run's resolved configuration, the training loss and learning rate over steps, every
evaluation's AUC and log loss (validation during training, test at the end), the final metrics with the
checkpoint's step, a calibration (reliability) diagram and the score histogram of each class on the
evaluated mapping, and the dataset's summary (rows and CTR per mapping; per categorical feature its
cardinality, the ids seen in training and the share of training rows whose id was seen only once there;
the preprocessing summary where the dataset has one). Plots are drawn with matplotlib and embedded as
PNG data URIs, so the page needs no network and no other file. The numbers behind every plot are also
embedded, as JSON in ``<script id="report-data">``.
"""

from __future__ import annotations

import base64
import html
import io
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ctrkit.data.atomic import atomic_file

CALIBRATION_BINS = 10
HISTOGRAM_BINS = 50
RARE_SAMPLE_ROWS = 1_000_000  # the per-feature id counts read at most this many training rows


def read_log(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The JSON-lines records of a training log (a line that is not JSON is a one-line error naming it)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: training log not found")
    records = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{number}: not a JSON log record ({e.msg})") from None
    return records


def curves(records: list[dict[str, Any]]) -> dict[str, dict[str, Sequence[float]]]:
    """The log's series: ``train`` (step, loss, lr), ``validation`` and ``test`` (step, auc, logloss), ``redraws``
    (step: where ``--reinit-embeddings`` redrew the tables, after the start; the validation AUC falls there and
    climbs back, docs/decisions/epoch-start-dip.md).

    A resumed run appends to its log: a step logged again replaces the earlier point."""
    out: dict[str, dict[int, dict[str, float]]] = {"train": {}, "validation": {}, "test": {}}
    redraws: set[int] = set()
    for r in records:
        if r.get("event") == "reinit_embeddings" and r.get("step"):
            redraws.add(int(r["step"]))
        elif r.get("event") == "train":
            out["train"][r["step"]] = {"loss": r["loss"], "lr": r["lr"]}
        elif r.get("event") in ("eval", "test") and r.get("mapping") in ("validation", "test"):
            out[r["mapping"]][r["step"]] = {"auc": r["auc"], "logloss": r["logloss"]}
    series: dict[str, dict[str, Sequence[float]]] = {}
    for name, points in out.items():
        steps = sorted(points)
        keys = ("loss", "lr") if name == "train" else ("auc", "logloss")
        series[name] = {"step": steps, **{k: [points[s][k] for s in steps] for k in keys}}
    series["redraws"] = {"step": sorted(redraws)}
    return series


def calibration(labels: np.ndarray, probs: np.ndarray, bins: int = CALIBRATION_BINS) -> dict[str, list[float]]:
    """Reliability diagram over ``bins`` equal-width bins of predicted probability: per bin its rows,
    mean prediction and observed click rate (None for an empty bin)."""
    edges = np.linspace(0.0, 1.0, bins + 1)
    which = np.clip(np.digitize(probs, edges[1:-1]), 0, bins - 1)
    rows = np.bincount(which, minlength=bins)
    pred = np.bincount(which, weights=probs, minlength=bins)
    pos = np.bincount(which, weights=labels.astype(np.float64), minlength=bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_pred, rate = pred / rows, pos / rows
    as_list = lambda a: [None if not np.isfinite(v) else float(v) for v in a]
    return {"edges": edges.tolist(), "rows": rows.tolist(), "mean_prediction": as_list(mean_pred),
            "observed_rate": as_list(rate)}  # fmt: skip


def dataset_summary(dataset_dir: str | os.PathLike) -> dict[str, Any]:
    """Rows and CTR per mapping; per categorical feature its cardinality, the distinct ids of the first
    ``RARE_SAMPLE_ROWS`` training rows and the share of those rows whose id occurs once among them; the
    preprocessing's ``summary.json`` where present."""
    from ctrkit.data.dataset import SplitBinaryDataset
    from ctrkit.data.feature_spec import FeatureSpec

    spec = FeatureSpec.from_yaml(dataset_dir)
    mappings = {}
    for mapping in spec.source_spec:
        data = SplitBinaryDataset(spec, mapping)
        labels = data.labels()  # the label column alone, not every feature of the mapping
        mappings[mapping] = {"rows": len(data), "ctr": float(labels.mean()) if len(labels) else None}
    features = []
    if "train" in spec.source_spec:
        train = SplitBinaryDataset(spec, "train")
        part = train.slice(0, min(len(train), RARE_SAMPLE_ROWS))
        cats = part.categorical.numpy()
        for j, (name, card) in enumerate(zip(spec.onehot_features, spec.cardinalities)):
            ids, counts = np.unique(cats[:, j], return_counts=True)
            once = float(counts[counts == 1].sum() / max(len(cats), 1))
            features.append({"feature": name, "cardinality": int(card), "ids_seen": int(len(ids)),
                             "rows_with_id_seen_once": once})  # fmt: skip
    preprocessing = None
    summary_file = Path(dataset_dir) / "summary.json"
    if summary_file.is_file():
        preprocessing = json.loads(summary_file.read_text())
    return {"mappings": mappings, "features": features, "sampled_train_rows": RARE_SAMPLE_ROWS,
            "preprocessing": preprocessing}  # fmt: skip


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _plots(series, calib, labels, probs, best_step: int | None) -> dict[str, str]:
    try:
        import matplotlib
    except ImportError:
        raise ValueError("ctrkit report draws its plots with matplotlib: pip install 'ctrkit[report]'") from None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = {}
    if not series["train"]["step"]:  # no log: no curves to draw
        return {"calibration": _calibration_plot(plt, calib, labels, probs)}
    out["training"] = _png(training_figure(plt, series["train"]))

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3.2))
    for name, style in (("validation", "o-"), ("test", "s")):
        s = series[name]
        if s["step"]:
            a1.plot(s["step"], s["auc"], style, label=name)
            a2.plot(s["step"], s["logloss"], style, label=name)
    a1.set_title("AUC")
    a2.set_title("log loss")
    for a in (a1, a2):
        if best_step is not None:
            a.axvline(best_step, color="grey", linestyle="--", linewidth=1, label=f"kept (step {best_step})")
        for i, step in enumerate(series.get("redraws", {}).get("step", [])):
            a.axvline(step, color="tab:red", linestyle=":", linewidth=1, label="tables redrawn" if i == 0 else None)
        a.set_xlabel("step")
        a.legend()
    out["evaluations"] = _png(fig)

    out["calibration"] = _calibration_plot(plt, calib, labels, probs)
    return out


def training_figure(plt, train: dict[str, list]):
    """The training loss and learning rate over steps (``train``: step, loss, lr); each record a marker where the log
    holds few (a short run's one or two records draw no line)."""
    marker = "o" if len(train["step"]) < 20 else None
    fig, ax = plt.subplots(figsize=(7, 3.2))
    ax.plot(train["step"], train["loss"], color="tab:blue", marker=marker, label="training loss")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (mean over the log window)")
    lr_ax = ax.twinx()
    lr_ax.plot(train["step"], train["lr"], color="tab:orange", marker=marker, label="learning rate")
    lr_ax.set_ylabel("learning rate")
    fig.legend(loc="upper center", ncol=2, bbox_to_anchor=(0.5, 0.0))
    ax.set_title("Training loss and learning rate")
    return fig


def _calibration_plot(plt, calib, labels, probs) -> str:
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3.6))
    full = [i for i, n in enumerate(calib["rows"]) if n]
    a1.plot([0, 1], [0, 1], ":", color="grey", label="perfectly calibrated")
    a1.plot([calib["mean_prediction"][i] for i in full], [calib["observed_rate"][i] for i in full], "o-",
            label="model")  # fmt: skip
    a1.set_xlabel("mean predicted click probability (bin)")
    a1.set_ylabel("observed click rate")
    a1.set_title(f"Calibration ({CALIBRATION_BINS} bins)")
    a1.legend()
    bins = np.linspace(0, 1, HISTOGRAM_BINS + 1)
    a2.hist(probs[labels == 0], bins=bins, alpha=0.6, density=True, label="no click")
    a2.hist(probs[labels == 1], bins=bins, alpha=0.6, density=True, label="click")
    a2.set_xlabel("predicted click probability")
    a2.set_ylabel("density")
    a2.set_title("Scores by class")
    a2.legend()
    return _png(fig)


def _table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "<p>none</p>"
    head = "".join(f"<th>{html.escape(str(k))}</th>" for k in rows[0])
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_fmt(v))}</td>" for v in r.values()) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4f}" if abs(v) < 1e4 else f"{v:,.0f}"
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v:,}"
    return "" if v is None else str(v)


def build_report(
    checkpoint: str | os.PathLike,
    out: str | os.PathLike,
    dataset: str | os.PathLike | None = None,
    mapping: str = "test",
    log_path: str | os.PathLike | None = None,
    device: str = "auto",
    progress: bool = False,
) -> dict[str, Any]:
    """Writes the report of ``checkpoint`` to ``out`` (atomically); returns the data embedded in it (``progress``:
    a progress bar while the mapping is scored).

    The dataset defaults to the run's (the YAML written beside the checkpoint), the log to the run's
    ``log_path`` when the run recorded one."""
    from ctrkit.eval.evaluator import Scoring
    from ctrkit.metrics import log_loss_from_logits, roc_auc, sigmoid
    from ctrkit.train.run_file import load_run_file

    checkpoint = Path(checkpoint)
    run_file = checkpoint.with_suffix(".yaml")
    run = load_run_file(run_file) if run_file.is_file() else {}
    dataset = dataset or run.get("dataset")
    if dataset is None:
        raise ValueError(f"{checkpoint}: no run YAML beside it names the dataset; give --dataset")
    log_path = log_path or run.get("log_path")
    records = read_log(log_path) if log_path is not None else []
    series = curves(records)
    scoring = Scoring.load(checkpoint, dataset, mapping, device)
    if len(scoring.dataset) == 0:
        raise ValueError(f"{dataset}: mapping '{mapping}' holds no samples to evaluate")
    logits = scoring.logits(progress=progress).astype(np.float64)  # the kept model's, calibrated as it is served
    probs = sigmoid(logits)
    labels = scoring.dataset.labels().astype(np.int64)
    ckpt = scoring.checkpoint
    final = {"mapping": mapping, "rows": int(len(labels)), "auc": float(roc_auc(labels, probs)),
             "logloss": log_loss_from_logits(labels, logits), "ctr": float(labels.mean()),
             "mean_prediction": float(probs.mean()), "checkpoint_step": int(ckpt.step)}  # fmt: skip
    if ckpt.selection is not None and ckpt.selection.get("best_step") is not None:
        final["best_step"] = int(ckpt.selection["best_step"])
    if ckpt.member_ensemble is not None and ckpt.members:  # a seed ensemble: the members' seeds and models averaged
        final["seed_ensemble"] = [int(ckpt.members[i]["seed"]) for i in ckpt.member_ensemble]
        final["models_averaged"] = ckpt.models_averaged
    elif ckpt.ensemble:
        final["ensemble"] = list(ckpt.ensemble)  # the steps whose models' logits are averaged
    if ckpt.calibration is not None:
        final["calibration_scale"] = ckpt.calibration  # the logit's multiplier (TrainConfig.calibrate)
    calib = calibration(labels, probs)
    data = {
        "model": ckpt.model_name,
        "checkpoint": str(checkpoint),
        "dataset": str(dataset),
        "final": final,
        "curves": series,
        "calibration": calib,
        "dataset_summary": dataset_summary(dataset),
        "config": {"model_config": ckpt.model_config, "train_config": ckpt.train_config},
    }
    best_step = ckpt.selection.get("best_step") if ckpt.selection is not None else None
    plots = _plots(series, calib, labels, probs, None if best_step is None else int(best_step))
    page = _page(data, plots, log_path)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(out) as tmp:
        Path(tmp).write_text(page)
    return data


def _page(data: dict[str, Any], plots: dict[str, str], log_path) -> str:
    final, summary = data["final"], data["dataset_summary"]
    img = lambda key, alt: f'<img src="{plots[key]}" alt="{alt}">' if key in plots else ""
    no_log = "" if log_path else "<p>No training log was given (<code>--log-path</code>), so no curves.</p>"
    prep = {k: v for k, v in (summary["preprocessing"] or {}).items() if not isinstance(v, (dict, list))}
    config_rows = [{"setting": k, "value": json.dumps(v)} for part in ("model_config", "train_config")
                   for k, v in (data["config"][part] or {}).items()]  # fmt: skip
    payload = json.dumps(data).replace("</", "<\\/")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>ctrkit report: {html.escape(data["model"])}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em; max-width: 1000px; color: #222; }}
table {{ border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 0.9em; }}
td, th {{ border: 1px solid #ccc; padding: 3px 8px; text-align: right; }}
th {{ background: #f3f3f3; }}
img {{ max-width: 100%; display: block; margin: 0.5em 0 1.5em; }}
code {{ background: #f3f3f3; padding: 0 3px; }}
</style></head><body>
<h1>{html.escape(data["model"])} on {html.escape(Path(data["dataset"]).name)}</h1>
<p>Checkpoint <code>{html.escape(data["checkpoint"])}</code>, dataset <code>{html.escape(data["dataset"])}</code>.</p>
<h2>Final metrics</h2>
{_table([final])}
<h2>Training</h2>
{no_log}{img("training", "training loss and learning rate")}{img("evaluations", "AUC and log loss per evaluation")}
<h2>Calibration and scores on {html.escape(final["mapping"])}</h2>
{img("calibration", "calibration diagram and score histograms")}
{
        _table(
            [
                {"bin": f"{lo:.1f}-{hi:.1f}", "rows": n, "mean prediction": p, "observed click rate": r}
                for lo, hi, n, p, r in zip(
                    data["calibration"]["edges"][:-1],
                    data["calibration"]["edges"][1:],
                    data["calibration"]["rows"],
                    data["calibration"]["mean_prediction"],
                    data["calibration"]["observed_rate"],
                )
            ]
        )
    }
<h2>Dataset</h2>
{_table([{"mapping": k, **v} for k, v in summary["mappings"].items()])}
<p>Per categorical feature, over the first {summary["sampled_train_rows"]:,} training rows:</p>
{_table(summary["features"])}
{"<p>Preprocessing summary:</p>" + _table([prep]) if prep else ""}
<h2>Configuration</h2>
{_table(config_rows)}
<script type="application/json" id="report-data">{payload}</script>
</body></html>
"""
