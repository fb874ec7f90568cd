"""``ctrkit refresh`` and ``ctrkit check`` on a drifting day-by-day CSV log (new ids every day): clean days published,
broken days refused with nothing published, the same flags every day, one refresh at a time, a refresh killed
mid-way finished or dropped by the next, rollback, the version policy, and a real `ctrkit serve` polling the
repository through a swap with concurrent `tritonclient` clients and no failed request. Scores are checked against
scikit-learn, the served versions against `predict` of their checkpoints."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch
import tritonclient.http as httpclient
from sklearn.metrics import log_loss, roc_auc_score

from ctrkit.bench.raw_rows_bench import raw_inputs
from ctrkit.bench.table_stream import write_text_days
from ctrkit.refresh.checks import Profile, Thresholds, check_day, profile, psi
from ctrkit.refresh.gate import compare
from ctrkit.refresh.store import RefreshStore
from tests.conftest import run_cli
from tests.serve.test_server import Server

ROWS = 12_000
FLAGS = ("--label", "clicked", "--max-steps", "120", "--no-progress", "--bootstrap-rounds", "50")
ROLES = ("--categorical", "cat0,cat1,cat2,cat3", "--numerical", "num0,num1")


@pytest.fixture(scope="module")
def days(tmp_path_factory) -> list[Path]:
    out = tmp_path_factory.mktemp("days")
    return write_text_days(out, 5, ROWS, (200, 2000, 50, 24), seed=0, num_numerical=2)


def refresh(repo: Path, *args, capsys=None, fresh: bool = False):
    """``ctrkit refresh`` of ``repo``'s model ``ctr``; a later day trains the continued candidate alone unless
    ``fresh`` or ``args`` say otherwise (the tests of the fresh candidate ask for it; the others spare its training)."""
    off = () if fresh or "--fresh-rows" in args else ("--fresh-rows", "0")
    return run_cli("refresh", *args, "--repository", repo, "--name", "ctr", *FLAGS, *off, capsys=capsys)


@pytest.fixture(scope="module", autouse=True)
def machine_threads():
    """Every refresh of this file trains on two threads, this machine's default under xdist too: the published
    repository and the runs compared with it train alike, and a step split over two threads sums its gradients as the
    torchrun test's two processes do."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def published(machine_threads, days, tmp_path_factory):
    """A repository after days 1 and 2, both published."""
    work = tmp_path_factory.mktemp("refresh")
    repo = work / "repo"
    assert refresh(repo, days[0], *ROLES, fresh=True)[0] == 0
    assert refresh(repo, days[1], fresh=True)[0] == 0
    return work, repo


def copy_of(published, tmp_path) -> tuple[Path, RefreshStore]:
    """A copy of the published repository and its state, for a test that changes them."""
    work, repo = published
    shutil.copytree(work / "repo", tmp_path / "repo")
    shutil.copytree(work / "repo.refresh", tmp_path / "repo.refresh")
    return tmp_path / "repo", RefreshStore(tmp_path / "repo", "ctr")


def raw_scores(predictor, rows: pl.DataFrame) -> np.ndarray:
    return np.asarray(predictor(*predictor.transform.raw_rows(rows)), np.float64).reshape(-1)


def test_clean_days_are_published_each_trained_on_the_last_days_held_out_rows(published, days):
    _, repo = published
    store = RefreshStore(repo, "ctr")
    history = store.history()
    assert [r["verdict"] for r in history] == ["published", "published"]
    assert store.versions() == [1, 2] and store.read().served.number == 2
    day2 = history[1]
    tail = round(ROWS * 0.1)
    # day 1's held-out tail trained on with day 2; day 2's tail carried to day 3; the fresh candidate trained on all
    # of day 1 and day 2 before its tail (both days are under --fresh-rows)
    assert day2["trained_rows"] == {"carried": tail, "day": ROWS - tail, "held_out": tail, "fresh": 2 * ROWS - tail}
    assert store.carried().height == tail
    kept = store.days()
    assert kept["__ctrkit_day"].value_counts().sort("__ctrkit_day").rows() == [(1, ROWS), (2, ROWS)]
    # the progressive figures are the served version 1's on day 2's raw rows, as scikit-learn computes them
    from ctrkit.serve.predictor import Predictor

    v1 = Predictor.from_checkpoint(store.checkpoint("v1/model.pt"))
    rows = pl.read_csv(days[1])
    p = raw_scores(v1, rows.drop("clicked"))
    y = rows["clicked"].to_numpy()
    assert day2["progressive"]["auc"] == pytest.approx(roc_auc_score(y, p), abs=1e-6)
    assert day2["progressive"]["logloss"] == pytest.approx(log_loss(y, np.clip(p, 1e-7, 1 - 1e-7)), abs=1e-5)
    assert all(c["passed"] for c in day2["checks"]) and day2["gate"]["blessed"]
    # the candidate taken is the better of the two on day 2's tail, and the version published is it: its AUC there as
    # scikit-learn computes it from the served export
    figures = day2["candidates"]
    assert set(figures) == {"continued", "fresh"}
    taken = day2["candidate"]
    assert figures[taken]["auc"] == max(f["auc"] for f in figures.values()) == day2["gate"]["candidate"]["auc"]
    v2 = Predictor.from_export(repo / "ctr", "2", repository=repo)
    held = pl.read_csv(days[1], infer_schema=False).tail(tail)
    p2 = raw_scores(v2, held.drop("clicked"))
    assert figures[taken]["auc"] == pytest.approx(roc_auc_score(held["clicked"].cast(int), p2), abs=1e-6)
    page = (store.root / "history.html").read_text()
    assert page.count("<tr>") == 3 and "published" in page


def test_the_served_version_scores_as_predict_of_its_checkpoint(published, days, tmp_path):
    from ctrkit.serve.predictor import Predictor

    _, repo = published
    store = RefreshStore(repo, "ctr")
    rows = pl.read_csv(days[2]).head(2000)
    rows.write_csv(tmp_path / "rows.csv")
    code, _, _ = run_cli("predict", "--checkpoint", store.checkpoint("v2/model.pt"), "--input", tmp_path / "rows.csv",
                         "--out", tmp_path / "scores.csv", "--no-progress")  # fmt: skip
    assert code == 0
    expected = pl.read_csv(tmp_path / "scores.csv")["probability"].to_numpy()
    served = Predictor.from_export(repo / "ctr", "2", repository=repo)
    got = raw_scores(served, pl.read_csv(tmp_path / "rows.csv", infer_schema=False).drop("clicked"))
    assert np.abs(got - expected).max() <= 1e-6


def _broken(day: Path, out: Path, how: str) -> Path:
    rows = pl.read_csv(day, infer_schema=False)
    if how == "shuffled":
        rows = rows.with_columns(pl.Series("clicked", np.random.default_rng(0).permutation(rows["clicked"])))
    elif how == "renamed":
        rows = rows.rename({"cat1": "category_1"})
    elif how == "missing":
        rows = rows.with_columns(pl.lit(None, pl.String).alias("num0"))
    rows.write_csv(out)
    return out


@pytest.mark.parametrize("how, failed", [("shuffled", "served model's AUC on the day"), ("renamed", "columns"),
                                         ("missing", "missing share of num0")])  # fmt: skip
def test_a_broken_day_is_refused_and_nothing_is_published(published, days, tmp_path, how, failed, capsys):
    repo, store = copy_of(published, tmp_path)
    before = (store.read(), store.carried_file.read_bytes())
    code, out, _ = refresh(repo, _broken(days[2], tmp_path / "day.csv", how), capsys=capsys)
    assert code == 3 and "refused, nothing published" in out
    record = store.history()[-1]
    assert record["verdict"] == "refused" and record["served_after"] == 2
    assert any(c["name"].startswith(failed) and not c["passed"] for c in record["checks"])
    assert store.versions() == [1, 2] and store.read().served == before[0].served
    assert store.carried_file.read_bytes() == before[1]
    assert not [p for p in store.root.iterdir() if p.name.startswith("work-")]
    if how == "missing":  # --force takes it anyway, and says so
        assert refresh(repo, tmp_path / "day.csv", "--force")[0] == 0
        assert store.history()[-1]["forced"] and store.read().served.number == 3


def test_a_table_flag_is_taken_again_only_with_the_first_days_value(published, days, tmp_path, capsys):
    repo, store = copy_of(published, tmp_path)
    code, _, err = refresh(repo, days[2], "--frequency-threshold", "5", capsys=capsys)
    assert code == 2 and "--frequency-threshold: 5 differs from the model's (3" in err
    code, _, err = refresh(repo, days[2], "--model", "dcnv2", capsys=capsys)
    assert code == 2 and "--model: dcnv2, where the served model is dlrm" in err
    assert refresh(repo, days[2], "--categorical", "cat0,cat1,cat2,cat3")[0] == 0  # the first day's value: taken
    assert store.read().served.number == 3


def test_one_refresh_at_a_time(published, days, tmp_path, capsys):
    repo, store = copy_of(published, tmp_path)
    holder = subprocess.Popen(["sleep", "30"])
    try:
        (store.root / "refresh.lock").write_text(str(holder.pid))
        code, _, err = refresh(repo, days[2], capsys=capsys)
        assert code == 2 and f"another live process (pid {holder.pid})" in err
    finally:
        holder.kill()
        holder.wait()
    assert refresh(repo, days[2])[0] == 0  # its holder gone: taken over


def test_a_refresh_stopped_after_placing_its_version_is_finished_by_the_next(published, days, tmp_path, monkeypatch):
    repo, store = copy_of(published, tmp_path)

    def killed(self, state):
        raise KeyboardInterrupt  # as a kill just after the version was placed, before the state was written

    monkeypatch.setattr(RefreshStore, "write", killed)
    assert refresh(repo, days[2])[0] == 130
    monkeypatch.undo()
    assert store.versions() == [1, 2, 3] and store.read().served.number == 2 and store.pending() is not None
    assert refresh(repo, days[3])[0] == 0
    assert [r["verdict"] for r in store.history()][-2:] == ["published", "published"]
    assert [r.get("version") for r in store.history()][-2:] == [3, 4] and store.read().served.number == 4
    assert store.pending() is None


def test_a_refresh_stopped_before_placing_its_version_leaves_the_served_one(published, days, tmp_path, monkeypatch):
    import ctrkit.export.exporter as exporter

    repo, store = copy_of(published, tmp_path)

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(exporter, "export_checkpoint", killed)
    assert refresh(repo, days[2], fresh=True)[0] == 130
    monkeypatch.undo()
    assert store.versions() == [1, 2] and store.read().served.number == 2
    assert refresh(repo, days[2], fresh=True)[0] == 0
    assert store.read().served.number == 3 and store.versions() == [1, 2, 3]
    assert [r["day"] for r in store.history()] == [1, 2, 3]  # the stopped day left no record
    # the stopped run had kept the day's rows for the fresh candidates: the run again replaced them
    counts = store.days()["__ctrkit_day"].value_counts().sort("__ctrkit_day").rows()
    assert counts == [(1, ROWS), (2, ROWS), (3, ROWS)]


def test_fresh_rows_bounds_the_days_a_fresh_candidate_trains_on(published, days, tmp_path):
    import ctrkit.refresh.loop as loop

    repo, store = copy_of(published, tmp_path)
    tail = round(ROWS * 0.1)
    # room for day 3 and one day before it (2 * ROWS): the fresh candidate trains on day 2 and day 3's rows before
    # its tail, and day 1 leaves the days kept
    assert refresh(repo, days[2], "--fresh-rows", 2 * ROWS)[0] == 0
    day3 = store.history()[-1]
    assert day3["trained_rows"]["fresh"] == 2 * ROWS - tail and set(day3["candidates"]) == {"continued", "fresh"}
    assert store.days()["__ctrkit_day"].unique().sort().to_list() == [2, 3]
    # --fresh-rows 0: the continued candidate alone, and no days kept
    assert refresh(repo, days[3], "--fresh-rows", 0)[0] == 0
    day4 = store.history()[-1]
    assert "fresh" not in day4["trained_rows"] and "candidates" not in day4 and store.days() is None
    # the window against a direct count: the newest whole days that fit
    kept = pl.DataFrame({"v": list(range(10)), loop.DAY_COLUMN: [1, 1, 2, 2, 2, 3, 4, 4, 4, 4]})
    assert loop.newest_days(kept, 5, 5)[loop.DAY_COLUMN].unique().sort().to_list() == [3, 4]
    assert loop.newest_days(kept, 5, 4)[loop.DAY_COLUMN].unique().to_list() == [4]
    assert loop.newest_days(kept, 5, 3) is None  # day 4 alone holds 4 rows
    assert loop.newest_days(kept, 4, 100)[loop.DAY_COLUMN].unique().sort().to_list() == [1, 2, 3]  # before day 4


def test_rollback_serves_the_version_before_as_the_next_and_old_versions_go(published, days, tmp_path):
    from ctrkit.serve.predictor import Predictor

    repo, store = copy_of(published, tmp_path)
    assert run_cli("refresh", "--rollback", "--repository", repo, "--name", "ctr", "--keep-versions", "2")[0] == 0
    assert store.versions() == [2, 3] and store.read().served.checkpoint == "v1/model.pt"
    rows = pl.read_csv(days[2], infer_schema=False).head(500).drop("clicked")
    v3 = Predictor.from_export(repo / "ctr", "3", repository=repo)
    v1 = Predictor.from_checkpoint(store.checkpoint("v1/model.pt"))
    assert np.abs(raw_scores(v3, rows) - raw_scores(v1, rows)).max() <= 1e-6
    assert store.history()[-1]["verdict"] == "rolled back"


def test_check_prints_the_days_checks_against_a_model(published, days, tmp_path, capsys):
    _, repo = published
    code, out, _ = run_cli("check", days[2], "--repository", repo, "--name", "ctr", capsys=capsys)
    assert code == 0 and "served model's AUC on the day" in out and "checks passed" in out
    ckpt = RefreshStore(repo, "ctr").checkpoint("v2/model.pt")
    shuffled = _broken(days[2], tmp_path / "day.csv", "shuffled")
    code, out, _ = run_cli("check", shuffled, "--checkpoint", ckpt, "--against", days[1], capsys=capsys)
    assert code == 0 and "PSI of num0" in out  # no recent days given: the AUC is printed, not judged
    code, out, _ = run_cli("check", shuffled, "--repository", repo, "--name", "ctr", capsys=capsys)
    assert code == 3 and "FAILED" in out and "the day would be refused" in out


def when_publishing(monkeypatch) -> threading.Event:
    """An event set when a refresh of this process starts publishing its version (its training done): the swap
    tests' clients send a request every 0.1 s before it, as fast as answered after."""
    from ctrkit.refresh.loop import Refresh

    publishing, real = threading.Event(), Refresh._publish

    def publish(self, *args, **kwargs):
        publishing.set()
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Refresh, "_publish", publish)
    return publishing


def test_ctrkit_serve_polls_the_repository_and_answers_through_a_swap(published, days, tmp_path, monkeypatch):
    """4 clients send raw-value requests while a refresh publishes: no request fails, and the new version answers
    once loaded."""
    repo, store = copy_of(published, tmp_path)
    publishing = when_publishing(monkeypatch)
    server = Server("--model-repository", repo, "--poll-s", "0.2")
    rows = pl.read_csv(days[3], infer_schema=False).head(8)
    failures, versions, stop = [], [], threading.Event()

    def client():
        c = httpclient.InferenceServerClient(server.url)
        inputs = []
        for name in ("cat0", "cat1", "cat2", "cat3", "num0", "num1"):  # each in the datatype the model declares
            if name.startswith("num"):
                t = httpclient.InferInput(name, [len(rows), 1], "FP32")
                t.set_data_from_numpy(rows[name].cast(pl.Float32).fill_null(float("nan")).to_numpy().reshape(-1, 1))
            else:
                t = httpclient.InferInput(name, [len(rows), 1], "BYTES")
                t.set_data_from_numpy(np.asarray(rows[name].to_list(), dtype=object).reshape(-1, 1))
            inputs.append(t)
        for _ in range(1500):  # bounded
            if stop.is_set():
                break
            if not publishing.is_set():
                time.sleep(0.1)
            try:
                answer = c.infer("ctr", inputs)
                versions.append(int(answer.get_response()["model_version"]))
            except Exception as e:  # noqa: BLE001 - every failure counts
                failures.append(repr(e))
        c.close()

    threads = [threading.Thread(target=client) for _ in range(4)]
    try:
        for t in threads:
            t.start()
        assert refresh(repo, days[2])[0] == 0
        deadline = time.monotonic() + 60
        while 3 not in versions[-20:] and time.monotonic() < deadline:
            time.sleep(0.1)
        stop.set()
        for t in threads:
            t.join()
    finally:
        stop.set()
        server.stop()
    assert failures == []
    assert versions[0] == 2 and versions[-1] == 3


def test_the_loops_settings_default_to_the_commands_flags():
    """``RefreshSettings`` (what ``refresh/`` may import) and ``RefreshConfig`` (the flags) each state a default for a
    setting; they say the same (``--fresh-rows`` and the others), so a loop built from Python runs as the command."""
    from dataclasses import MISSING, fields

    from ctrkit.refresh.loop import RefreshSettings
    from ctrkit.refresh_config import RefreshConfig

    flags = {f.name: f.default for f in fields(RefreshConfig)}
    shared = [f for f in fields(RefreshSettings) if f.name in flags and f.default is not MISSING]
    assert {f.name for f in shared} >= {"fresh_rows", "holdout_fraction", "keep_versions", "auc_tolerance",
                                       "bootstrap_rounds", "nproc_per_node"}  # fmt: skip
    differ = {f.name: (f.default, flags[f.name]) for f in shared if flags[f.name] is not None and
              f.default != flags[f.name]}  # fmt: skip
    assert not differ, differ


def test_the_gate_against_scikit_learn_and_its_verdicts():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 4000)
    good = np.clip(0.3 + 0.3 * y + rng.normal(0, 0.15, y.size), 0.01, 0.99)
    noise = rng.uniform(0.01, 0.99, y.size)
    gate = compare(y, good, good, 0.002, 0.002, rounds=50)
    assert gate.blessed and gate.auc_gain == 0 and gate.served.auc == pytest.approx(roc_auc_score(y, good), abs=1e-6)
    worse = compare(y, good, noise, 0.002, 0.002, rounds=50)
    assert not worse.blessed and "worse on the held-out rows" in worse.reason
    assert worse.candidate.logloss == pytest.approx(log_loss(y, noise), abs=1e-6)
    assert worse.auc_interval[0] <= worse.auc_gain <= worse.auc_interval[1] < 0
    assert compare(y, noise, good, 0.002, 0.002, rounds=50).blessed


def test_profile_and_psi_against_direct_counts(days):
    from ctrkit.columns import Role
    from ctrkit.preprocess.transform import CategoricalInput, Column, NumericalInput, RowTransform
    from ctrkit.preprocess.vocabulary import vocabulary_frame

    rows = pl.read_csv(days[0], infer_schema=False).head(3000)
    rows = rows.with_columns(
        pl.when(pl.int_range(pl.len()) % 4 == 0).then(None).otherwise(pl.col("num0")).alias("num0")
    )
    known = rows["cat0"].head(1000).unique()
    vocab = vocabulary_frame(known, np.arange(2, 2 + len(known)))
    transform = RowTransform("ctrkit preprocess table", [Column("cat0", "String", Role.CATEGORICAL),
                             Column("num0", "Float64", Role.NUMERICAL)], [NumericalInput("num0", "num0")],
                             [CategoricalInput("cat0", "cat0")], [], {"cat0": vocab}, ("NA",), "clicked")  # fmt: skip
    labels = rows["clicked"].cast(pl.Int8).to_numpy()
    p = profile(rows.select("cat0", "num0"), labels, transform)
    assert p.missing["num0"] == pytest.approx(0.25) and p.missing["cat0"] == 0
    assert p.unseen["cat0"] == pytest.approx(float((~rows["cat0"].is_in(set(known.to_list()))).mean()))
    assert p.click_rate == pytest.approx(labels.mean())
    # PSI by its formula on the reference's own deciles: sum (a - e) ln(a / e)
    e, a = np.array([0.5, 0.3, 0.2]), np.array([0.2, 0.3, 0.5])
    assert psi(e, a) == pytest.approx(float(np.sum((a - e) * np.log(a / e))))
    same = check_day(p, p, Thresholds())
    assert all(c.passed for c in same)
    empty = Profile(p.rows, p.click_rate, {**p.missing, "num0": 1.0}, p.unseen, p.cuts, p.shares)
    assert [c.name for c in check_day(empty, p, Thresholds()) if not c.passed] == ["missing share of num0"]


def test_preprocess_table_validation_files_hold_out_rows_without_a_test_mapping(days, tmp_path):
    from ctrkit.data.feature_spec import FeatureSpec
    from ctrkit.preprocess.table import preprocess_table
    from ctrkit.preprocess.table_recipe import TableRecipe

    rows = pl.read_csv(days[0])
    rows.head(9000).write_csv(tmp_path / "train.csv")
    rows.tail(3000).write_csv(tmp_path / "held.csv")
    recipe = TableRecipe(label="clicked", categorical=("cat0", "cat1"), numerical=("num0",), also_categorical=(),
                         frequency_threshold=1)  # fmt: skip
    summary = preprocess_table([tmp_path / "train.csv"], tmp_path / "data", recipe,
                               validation_files=[tmp_path / "held.csv"])  # fmt: skip
    spec = FeatureSpec.from_yaml(tmp_path / "data")
    assert set(spec.source_spec) == {"train", "validation"}
    assert summary["train_rows"] == 9000 and summary["validation_rows"] == 3000
    # the vocabularies counted the training rows only: 2 ids below the first value's, one a distinct training value
    assert summary["cardinalities"]["cat1"] == 2 + rows.head(9000)["cat1"].n_unique()
    assert json.loads((tmp_path / "data" / "summary.json").read_text())["clicks"]["validation"] == int(
        rows.tail(3000)["clicked"].sum()
    )
    assert os.path.isdir(tmp_path / "data")


ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(not (ROOT / ".venv-triton" / "bin" / "python").exists(), reason="no Triton here: `make triton`")
def test_real_triton_in_poll_mode_serves_each_published_version_with_no_request_lost(days, tmp_path, monkeypatch):
    from ctrkit.bench.raw_rows_bench import server_ready
    from ctrkit.serve.predictor import Predictor
    from tests.conftest import free_port

    repo = tmp_path / "repo"
    assert refresh(repo, days[0], *ROLES, "--backend", "python")[0] == 0
    store = RefreshStore(repo, "ctr")
    specs = Predictor.from_checkpoint(store.checkpoint("v1/model.pt")).transform.input_specs()
    rows = pl.read_csv(days[3], infer_schema=False).head(8)
    port = free_port()
    proc = subprocess.Popen([str(ROOT / "scripts" / "tritonserver.sh"), str(repo), str(port),
                             "--model-control-mode=poll", "--repository-poll-secs=1"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    failures, versions, stop = [], [], threading.Event()
    publishing = when_publishing(monkeypatch)

    def client():
        c = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
        for _ in range(1500):  # bounded
            if stop.is_set():
                break
            if not publishing.is_set():
                time.sleep(0.1)
            try:
                versions.append(int(c.infer("ctr", raw_inputs(rows, specs)).get_response()["model_version"]))
            except Exception as e:  # noqa: BLE001 - every failure counts
                failures.append(repr(e))
        c.close()

    threads = [threading.Thread(target=client) for _ in range(4)]
    try:
        deadline = time.monotonic() + 90
        while not server_ready(f"127.0.0.1:{port}"):
            assert proc.poll() is None, proc.stdout.read()[-3000:]
            assert time.monotonic() < deadline, "Triton did not become ready"
            time.sleep(0.5)
        for t in threads:
            t.start()
        assert refresh(repo, days[1], "--backend", "python")[0] == 0
        deadline = time.monotonic() + 90
        while 2 not in versions[-20:] and time.monotonic() < deadline:
            time.sleep(0.2)
        stop.set()
        for t in threads:
            t.join()
        answer = httpclient.InferenceServerClient(f"127.0.0.1:{port}").infer("ctr", raw_inputs(rows, specs))
        got = answer.as_numpy("probability")[:, 0]
    finally:
        stop.set()
        proc.terminate()
        proc.wait(timeout=30)
    assert failures == []
    assert versions[0] == 1 and versions[-1] == 2
    want = raw_scores(Predictor.from_checkpoint(store.checkpoint("v2/model.pt")), rows.drop("clicked"))
    assert np.abs(got - want).max() <= 1e-6


def _scores(repo: Path, version: int, rows: pl.DataFrame) -> np.ndarray:
    from ctrkit.serve.predictor import Predictor

    return raw_scores(Predictor.from_checkpoint(RefreshStore(repo, "ctr").checkpoint(f"v{version}/model.pt")), rows)


def test_spark_preprocessing_refreshes_as_polars_does(published, days, tmp_path):
    """The same two days refreshed with the preprocessing on Spark: the served version scores as the Polars
    refresh's does (the same datasets, byte for byte, the same training)."""
    pytest.importorskip("pyspark")
    extra = ("--engine", "spark", "--spark-master", "local[1]")
    repo = tmp_path / "repo"
    assert refresh(repo, days[0], *ROLES, *extra, fresh=True)[0] == 0
    assert refresh(repo, days[1], *extra, fresh=True)[0] == 0
    assert [r["engine"] for r in RefreshStore(repo, "ctr").history()] == ["spark", "spark"]  # each day's, applied
    rows = pl.read_csv(days[2], infer_schema=False).head(2000).drop("clicked")
    assert np.abs(_scores(repo, 2, rows) - _scores(published[1], 2, rows)).max() <= 1e-6


def test_torchrun_trains_the_first_day_as_one_process_and_later_days_continue(published, days, tmp_path, capsys):
    """The first day trained under torchrun (2 processes) scores as the one-process refresh's first version (within
    float sums); its
    checkpoint is one file, which the next day continues in one process, saying so; the day's fresh candidate trains
    under torchrun."""
    repo = tmp_path / "repo"
    assert refresh(repo, days[0], *ROLES, "--nproc-per-node", "2", fresh=True)[0] == 0
    rows = pl.read_csv(days[2], infer_schema=False).head(2000).drop("clicked")
    # (the ranks sum their gradients in another order: 120 Adam steps apart by float sums alone)
    assert np.abs(_scores(repo, 1, rows) - _scores(published[1], 1, rows)).max() <= 1e-3
    code, _, err = refresh(repo, days[1], "--nproc-per-node", "2", capsys=capsys, fresh=True)  # both candidates
    assert code == 0 and "a continued day trains in one process" in err
    day2 = RefreshStore(repo, "ctr").history()[-1]
    assert day2["notes"] == ["trained in one process: train --continue-from runs one process"]
    assert set(day2["candidates"]) == {"continued", "fresh"}  # the fresh one trained under torchrun


def test_raw_id_columns_go_through_the_same_loop(days, tmp_path):
    from ctrkit.checkpoint import load_checkpoint

    repo = tmp_path / "repo"
    assert refresh(repo, days[0], *ROLES, "--raw-ids", "cat1", "--capacity", "4000")[0] == 0
    assert refresh(repo, days[1])[0] == 0
    store = RefreshStore(repo, "ctr")
    assert [r["verdict"] for r in store.history()] == ["published", "published"]
    spec = load_checkpoint(store.checkpoint("v2/model.pt")).spec
    assert spec["dynamic_features"] == ["cat1"] and spec["cardinalities"][1] == 4000  # a table of raw ids, its rows


CHROMIUM = next((p for p in (shutil.which("chromium"), shutil.which("chromium-browser")) if p), None)


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium installed (apt-get install chromium); CI installs it")
def test_the_history_page_renders_every_day_in_a_headless_browser(published, days, tmp_path):
    """history.html in a real browser: a row a day, a point per figure in the chart, nothing from the network."""
    sync_playwright = pytest.importorskip("playwright.sync_api").sync_playwright
    repo, store = copy_of(published, tmp_path)
    assert refresh(repo, _broken(days[2], tmp_path / "day.csv", "renamed"))[0] == 3
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page()
            requests = []
            page.on("request", lambda r: requests.append(r.url))
            page.goto((store.root / "history.html").as_uri())
            rows = page.evaluate("Array.from(document.querySelectorAll('#days tr')).map(r => r.innerText)")
            points = page.evaluate("document.querySelectorAll('svg circle').length")
            box = page.evaluate("(() => { const b = document.querySelector('svg').getBoundingClientRect(); "
                                "return [b.width, b.height]; })()")  # fmt: skip
        finally:
            browser.close()
    history = store.history()
    assert len(rows) == 1 + len(history) == 4
    assert "published" in rows[1] and "published" in rows[2] and "refused" in rows[3] and "lacks cat1" in rows[3]
    taken = history[1]["candidate"]
    assert f"{taken} (continued {history[1]['candidates']['continued']['auc']:.4f}" in rows[2]
    figures = sum(r.get(k) is not None for r in history for k in ("progressive", "gate")) + sum(
        1 for r in history if r.get("gate")
    )  # progressive, and the gate's served and candidate AUC
    assert points == figures and box[0] > 300 and box[1] > 100
    assert all(u.startswith(("file:", "data:")) for u in requests), requests


def test_a_candidate_the_gate_keeps_out_leaves_the_served_version_and_carries_the_day(published, days, tmp_path,
                                                                                       monkeypatch):  # fmt: skip
    import dataclasses

    import ctrkit.refresh.loop as loop

    repo, store = copy_of(published, tmp_path)
    real = loop.compare

    def worse(*args, **kwargs):
        return dataclasses.replace(real(*args, **kwargs), blessed=False, reason="worse (as the test says)")

    monkeypatch.setattr(loop, "compare", worse)
    assert refresh(repo, days[2])[0] == 0
    monkeypatch.undo()
    tail = round(ROWS * 0.1)
    assert store.history()[-1]["verdict"] == "kept" and store.versions() == [1, 2] and store.read().served.number == 2
    assert store.carried().height == tail + ROWS  # day 2's tail, and all of day 3: the served model learnt neither
    assert refresh(repo, days[3])[0] == 0
    assert store.history()[-1]["trained_rows"]["carried"] == tail + ROWS and store.read().served.number == 3
    assert store.carried().height == tail  # day 4's tail alone


def test_refresh_refuses_in_one_line_what_it_cannot_take(tmp_path, capsys):
    repo, missing = tmp_path / "repo", tmp_path / "none.csv"
    cases = [((), "no day files given"), (("--rollback",), "no earlier version to roll back to"),
             ((missing,), "--label: the model's first day names its label column"),
             ((missing, "--label", "clicked"), "none.csv: input file not found"),
             ((missing, "--holdout-fraction", "0.7"), "expected a share in (0, 0.5)")]  # fmt: skip
    bad = tmp_path / "bad.csv"
    bad.write_text("cat0,num0,clicked\na,1.0,0\nb,2.0,maybe\n")
    cases.append(((bad, "--label", "clicked"), "bad.csv:3: clicked"))  # the label rule preprocess applies
    for args, said in cases:
        code, _, err = run_cli("refresh", *args, "--repository", repo, "--name", "ctr", capsys=capsys)
        assert code == 2 and said in err and len(err.strip().splitlines()) == 1, (args, err)
    code, _, err = run_cli("refresh", missing, "--fresh-rows", "-1", "--repository", repo, "--name", "ctr",
                           capsys=capsys)  # fmt: skip
    assert code == 2 and err.strip().splitlines()[-1].endswith("--fresh-rows: expected an integer from 0 to "
                                                               "1000000000000, got '-1'")  # fmt: skip
    assert not repo.exists()
