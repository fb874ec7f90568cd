"""`ctrkit preprocess outbrain --engine spark`: page views counted by a real local Spark session, the dataset
byte-identical to the embedded engine's (ad_id kept as raw ids), bad page-view rows named by line or counted the
same way."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from tests.conftest import run_cli  # noqa: E402

MASTER = "local[2]"


def files(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*.bin"))} | {
        "feature_spec.yaml": (directory / "feature_spec.yaml").read_bytes()
    }


def test_spark_engine_writes_the_same_dataset_and_names_bad_rows(tmp_path, capsys):
    raw = tmp_path / "raw"
    assert run_cli("synth", "outbrain-raw", "--out", raw, "--rows", "3000", "--seed", "5")[0] == 0
    # a few bad page-view rows: not an integer, missing, a decimal (Polars's non-strict cast refuses it)
    lines = (raw / "page_views.csv").read_text().splitlines()
    rows = {}
    for at, value in ((5, "abc"), (9, ""), (14, "3.0")):
        fields = lines[at].split(",")
        fields[1] = value
        lines[at] = ",".join(fields)
        rows[at + 1] = value
    (raw / "page_views.csv").write_text("\n".join(lines) + "\n")
    out = {}
    for engine in ("polars", "spark"):
        code, text, err = run_cli("preprocess", "outbrain", raw, "--out", tmp_path / engine, "--no-progress",
                                  "--bad-rows", "skip", "--engine", engine, "--spark-master", MASTER,
                                  "--raw-ids", "ad_id",
                                  capsys=capsys)  # fmt: skip
        assert code == 0, err
        assert " 3 bad rows dropped" in text
        out[engine] = files(tmp_path / engine)
    assert out["polars"].keys() == out["spark"].keys() and len(out["polars"]) > 10
    assert out["spark"] == out["polars"]  # byte for byte, the views columns included
    # with the default policy both engines stop at the first bad line, naming it
    for engine in ("polars", "spark"):
        code, _, err = run_cli("preprocess", "outbrain", raw, "--out", tmp_path / f"{engine}-e", "--no-progress",
                               "--engine", engine, "--spark-master", MASTER, capsys=capsys)  # fmt: skip
        assert code == 2 and "Traceback" not in err
        assert f"page_views.csv:{min(rows)}: document_id: expected an integer, got 'abc'" in err, err
        assert not (tmp_path / f"{engine}-e").exists()
    shutil.rmtree(tmp_path / "polars")
