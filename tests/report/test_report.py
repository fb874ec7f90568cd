"""`ctrkit report`: the page of a 2-epoch run holds the curves the log has, a calibration diagram whose
bins hold every scored row, and images a real headless browser renders."""

import json
import math
import re
import shutil

import numpy as np
import pytest

from ctrkit.report import calibration
from tests.conftest import run_cli, small_model_flags

CHROMIUM = next((p for p in (shutil.which("chromium"), shutil.which("chromium-browser")) if p), None)


@pytest.fixture(scope="module")
def report(tiny_dataset, tmp_path_factory):
    """A 2-epoch run (3 evaluations per epoch, a log record every 10 steps), its log and its report."""
    run = tmp_path_factory.mktemp("report")
    code, _, _ = run_cli("train", "--dataset", tiny_dataset, "--epochs", "2", "--batch-size", "512",
                         "--evals-per-epoch", "3", "--print-freq", "10", "--early-stopping-patience", "0",
                         "--no-progress", "--save-checkpoint", run / "m.pt", "--log-path", run / "log.jsonl",
                         *small_model_flags())  # fmt: skip
    assert code == 0
    code, _, _ = run_cli("report", run / "m.pt", "--out", run / "report.html")  # dataset and log from the run
    assert code == 0
    page = (run / "report.html").read_text()
    data = json.loads(re.search(r'<script type="application/json" id="report-data">(.*?)</script>', page, re.S)[1])
    return run, page, data


def test_curves_hold_every_logged_point(report, tiny_dataset):
    _, _, data = report
    steps_per_epoch = math.ceil(21_600 * 0.9 / 512)  # tiny_dataset: 21,600 train rows, 10% held out
    total = 2 * steps_per_epoch
    last_window = [total] if total % 10 else []  # the run's last, partial log window
    assert data["curves"]["train"]["step"] == list(range(10, total + 1, 10)) + last_window
    assert len(data["curves"]["train"]["lr"]) == len(data["curves"]["train"]["loss"])
    # the warm start's evaluation at step 0, then 3 per epoch (the last at the end of the run)
    assert len(data["curves"]["validation"]["step"]) == 1 + 2 * 3
    assert data["curves"]["validation"]["step"][-1] == total
    assert data["curves"]["test"]["step"] == [total]
    final = data["final"]
    assert final["rows"] == 2_400 and final["checkpoint_step"] == total and 0.5 < final["auc"] <= 1
    assert final["auc"] == pytest.approx(data["curves"]["test"]["auc"][0], abs=1e-6)  # the run's own test score
    summary = data["dataset_summary"]
    assert summary["mappings"]["train"]["rows"] == 21_600 and len(summary["features"]) == 8


def test_calibration_bins_hold_every_row(report):
    _, _, data = report
    calib = data["calibration"]
    assert sum(calib["rows"]) == data["final"]["rows"]
    for lo, hi, n, p in zip(calib["edges"][:-1], calib["edges"][1:], calib["rows"], calib["mean_prediction"]):
        assert (n == 0 and p is None) or lo <= p <= hi


def test_calibration_against_a_loop():
    rng = np.random.default_rng(0)
    probs, labels = rng.random(1000), rng.integers(0, 2, 1000)
    probs[:3] = [0.0, 1.0, 0.1]  # the edges: 1.0 falls in the last bin, 0.1 in the second
    calib = calibration(labels, probs, bins=10)
    for b in range(10):
        inside = [(p, y) for p, y in zip(probs, labels) if min(int(p * 10), 9) == b]
        assert calib["rows"][b] == len(inside)
        assert calib["observed_rate"][b] == pytest.approx(np.mean([y for _, y in inside]))


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium installed (apt-get install chromium); CI installs it")
def test_every_image_renders_in_a_headless_browser(report):
    sync_playwright = pytest.importorskip("playwright.sync_api").sync_playwright
    run, _, _ = report
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page()
            requests = []
            page.on("request", lambda r: requests.append(r.url))
            page.goto((run / "report.html").as_uri())
            images = page.evaluate(
                "Array.from(document.images).map(i => [i.complete, i.naturalWidth, i.naturalHeight])"
            )
        finally:
            browser.close()
    assert len(images) == 3  # training curves, evaluations, calibration + histograms
    assert all(done and w > 100 and h > 100 for done, w, h in images), images
    assert all(u.startswith(("file:", "data:")) for u in requests), requests  # nothing from the network


def test_a_short_runs_loss_is_drawn_as_points():
    """A 60-step run logs one loss record (every 50 steps): a line through one point draws nothing, a marker does."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ctrkit.report import training_figure

    few = training_figure(plt, {"step": [50], "loss": [0.41], "lr": [0.001]})
    assert [line.get_marker() for line in few.axes[0].lines + few.axes[1].lines] == ["o", "o"]
    many = training_figure(plt, {"step": list(range(0, 1000, 10)), "loss": [0.4] * 100, "lr": [0.001] * 100})
    assert many.axes[0].lines[0].get_marker() in (None, "None", "")
    plt.close("all")


def test_the_curves_mark_where_the_tables_were_redrawn():
    """A redraw of the tables (``--reinit-embeddings``) is where the validation AUC falls at an epoch's start: the
    curves carry its steps (the draw logged at the start is none), so the page can mark them."""
    from ctrkit.report import curves

    records = [{"event": "reinit_embeddings", "step": 0, "epoch": 0},
               {"event": "eval", "mapping": "validation", "step": 285, "auc": 0.80, "logloss": 0.41},
               {"event": "reinit_embeddings", "step": 357, "epoch": 1},
               {"event": "eval", "mapping": "validation", "step": 357, "auc": 0.77, "logloss": 0.43},
               {"event": "reinit_embeddings", "step": 570, "epoch": 2}]  # fmt: skip
    series = curves(records)
    assert series["redraws"]["step"] == [357, 570]
    assert series["validation"]["step"] == [285, 357]
