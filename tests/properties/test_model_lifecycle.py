"""Stateful, property-based: a model's life as hypothesis orders it. From a model fitted on day 0, any sequence of
later days (each written `--like` the current model and continued with `train --continue-from`), exports (a new
version in one repository) and loads of the newest version keeps two invariants:

- the current checkpoint scores its latest day's raw test rows (`predict --input`) as the dataset's rows
  (`predict --dataset`), to 1e-6;
- the newest export, loaded as a server loads it (`Predictor.from_export`), scores those raw rows as the
  checkpoint it was exported from.

Planted fault the machine catches (`test_a_planted_fault_is_caught`): an export writing its vocabularies without
their last value (a one-line mutation of `RowTransform.write`).
"""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from ctrkit.data.synthetic_clicks import click_log
from ctrkit.serve.predictor import Predictor
from tests.conftest import run_cli

ROWS = 1200
FLAGS = ["--label", "clicked", "--numerical", "age", "--categorical", "position", "--no-progress"]
MODEL = ["--embedding-dim", "4", "--bottom-mlp", "8,4", "--top-mlp", "8,1", "--batch-size", "128", "--no-progress"]


class ModelLife(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        import tempfile
        from pathlib import Path

        self.work = Path(tempfile.mkdtemp(prefix="ctrkit-life-"))
        self.day = 0
        self.exported: tuple[Path, int] | None = None  # (the checkpoint exported, its version)
        self.version = 0

    def _write_day(self, day: int, rows: int) -> None:
        log = click_log(rows, seed=day, first_row=day * ROWS)
        if day:  # ads no earlier day showed
            log = log.with_columns(pl.format("{}_d{}", "ad_id", pl.lit(day % 3)).alias("ad_id"))
        tail = rows // 5
        log.head(rows - tail).write_csv(self.work / f"day{day}.csv")
        log.tail(tail).write_csv(self.work / f"day{day}_test.csv")

    @initialize()
    def fit_day_zero(self):
        self._write_day(0, ROWS)
        data = self.work / "data0"
        assert run_cli("preprocess", "table", self.work / "day0.csv", "--test-files", self.work / "day0_test.csv",
                       "--out", data, *FLAGS)[0] == 0  # fmt: skip
        assert run_cli("train", "--dataset", data, "--max-steps", 8, "--save-checkpoint", self.work / "m0.pt",
                       *MODEL)[0] == 0  # fmt: skip

    @rule(rows=st.sampled_from([300, 900]), steps=st.integers(1, 6))
    def a_later_day(self, rows, steps):
        before, self.day = self.day, self.day + 1
        self._write_day(self.day, rows)
        data = self.work / f"data{self.day}"
        assert (
            run_cli(
                "preprocess",
                "table",
                self.work / f"day{self.day}.csv",
                "--test-files",
                self.work / f"day{self.day}_test.csv",
                "--out",
                data,
                "--like",
                self.work / f"m{before}.pt",
                "--label",
                "clicked",
                "--no-progress",
            )[0]
            == 0
        )  # fmt: skip (the roles: the model's)
        assert run_cli("train", "--dataset", data, "--continue-from", self.work / f"m{before}.pt", "--max-steps", steps,
                       "--save-checkpoint", self.work / f"m{self.day}.pt", *MODEL)[0] == 0  # fmt: skip

    @rule()
    def export(self):
        self.version += 1
        assert run_cli("export", "--checkpoint", self.work / f"m{self.day}.pt", "--format", "triton", "--backend",
                       "python", "--name", "ctr", "--out", self.work / "repository")[0] == 0  # fmt: skip
        self.exported = (self.work / f"m{self.day}.pt", self.version)

    def _scores(self, checkpoint) -> np.ndarray:
        out = self.work / "scores.csv"
        out.unlink(missing_ok=True)
        assert run_cli("predict", "--checkpoint", checkpoint, "--input", self.work / f"day{self.day}_test.csv",
                       "--out", out, "--no-progress")[0] == 0  # fmt: skip
        return pl.read_csv(out)["probability"].to_numpy()

    @invariant()
    def raw_rows_score_as_the_dataset(self):
        checkpoint = self.work / f"m{self.day}.pt"
        reference = self.work / "reference.npy"
        assert run_cli("predict", "--checkpoint", checkpoint, "--dataset", self.work / f"data{self.day}", "--out",
                       reference, "--no-progress")[0] == 0  # fmt: skip
        np.testing.assert_allclose(self._scores(checkpoint), np.load(reference).ravel(), atol=1e-6)

    @precondition(lambda self: self.exported is not None)
    @rule()
    def load_the_newest_version(self):
        checkpoint, version = self.exported
        predictor = Predictor.from_export(self.work / "repository" / "ctr", version=str(version))
        rows = pl.read_csv(self.work / f"day{self.day}_test.csv").drop("clicked")
        loaded = predictor.score_named({c: rows[c].to_numpy() for c in rows.columns}, "error").ravel()
        np.testing.assert_allclose(loaded, self._scores(checkpoint), atol=1e-6)

    def teardown(self):
        import shutil

        shutil.rmtree(self.work, ignore_errors=True)


ModelLife.TestCase.settings = settings(
    max_examples=max(3, settings.default.max_examples // 25), stateful_step_count=5, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)  # fmt: skip
test_a_model_life_keeps_raw_rows_and_exports_scoring_as_its_data = ModelLife.TestCase


def test_a_planted_fault_is_caught(monkeypatch):
    """A one-line mutation of the export (its vocabularies written without their last value): the loaded version no
    longer scores as its checkpoint, and the machine's rule says so."""
    from ctrkit.preprocess import transform

    life = ModelLife()
    try:
        life.fit_day_zero()
        life.export()
        life.load_the_newest_version()  # the property holds
        real = transform.RowTransform.write

        def dropping_a_value(self, directory):
            vocabularies = self.vocabularies
            self.vocabularies = {f: v.head(len(v) - 1) if len(v) > 2 else v for f, v in vocabularies.items()}
            try:
                return real(self, directory)
            finally:
                self.vocabularies = vocabularies

        monkeypatch.setattr(transform.RowTransform, "write", dropping_a_value)
        life.export()
        with pytest.raises(AssertionError):
            life.load_the_newest_version()
    finally:
        life.teardown()
