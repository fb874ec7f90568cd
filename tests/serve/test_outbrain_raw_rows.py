"""A Wide & Deep model made by `preprocess outbrain` scores raw Outbrain rows (an events.csv row with an ad_id):
`predict --input`, the real `ctrkit serve` and real Triton's Python-backend model agree with `predict --dataset` on the
preprocessed evaluation rows; a bad value gets one verdict from each; `--like` refuses an Outbrain model."""

from __future__ import annotations

from contextlib import ExitStack

import numpy as np
import polars as pl
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from ctrkit.checkpoint import load_checkpoint
from ctrkit.data.dataset import SplitBinaryDataset
from ctrkit.data.feature_spec import FeatureSpec
from ctrkit.preprocess import carried
from tests.conftest import HAS_TRITON, run_cli, triton_server
from tests.serve.test_server import Server

SERVED_ROWS = 300  # rows sent in one request to each server


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """Raw files, their dataset, a trained Wide & Deep model, its export (Python backend), the evaluation rows as raw
    rows in the dataset's order (clicks joined with their events), ctrkit serve and Triton of the export."""
    work = tmp_path_factory.mktemp("outbrain_raw")
    raw, data, ckpt, repo = work / "raw", work / "data", work / "wd.pt", work / "repository"
    assert run_cli("synth", "outbrain-raw", "--out", raw, "--rows", "8000", "--seed", "4")[0] == 0
    assert run_cli("preprocess", "outbrain", raw, "--out", data, "--no-progress")[0] == 0
    assert run_cli("train", "--dataset", data, "--model", "wide_deep", "--recipe", "plain", "--max-steps", 40,
                   "--batch-size", 256, "--embedding-dim", 8, "--no-progress",
                   "--save-checkpoint", ckpt)[0] == 0  # fmt: skip
    assert run_cli("export", "--checkpoint", ckpt, "--format", "triton", "--backend", "python", "--name", "wd",
                   "--out", repo)[0] == 0  # fmt: skip
    test = SplitBinaryDataset(FeatureSpec.from_yaml(data), "test")
    clicks = pl.read_csv(raw / "clicks_train.csv").with_row_index("line")
    events = pl.read_csv(raw / "events.csv", infer_schema=False).with_columns(pl.col("display_id").cast(pl.Int64))
    rows = (
        clicks.filter(pl.col("display_id").is_in(np.unique(test.groups()).tolist()))
        .sort("display_id", "line")  # the dataset's evaluation rows: by display, then as the file holds them
        .join(events, on="display_id", how="left", maintain_order="left")
        .drop("line", "clicked", "uuid")
    )
    assert len(rows) == len(test)
    rows.write_csv(work / "rows.csv")
    server = Server("--model-repository", repo)
    lenient = Server("--model-repository", repo, "--bad-values", "missing")
    with ExitStack() as stack:
        stack.callback(server.stop)
        stack.callback(lenient.stop)
        port = stack.enter_context(triton_server(repo)) if HAS_TRITON else None
        yield work, rows, server, lenient, port


def _predict(work, path, *flags, capsys=None):
    out = work / "scores.csv"
    out.unlink(missing_ok=True)
    code, stdout, stderr = run_cli("predict", "--checkpoint", work / "wd.pt", "--input", path, "--out", out,
                                   "--no-progress", *flags, capsys=capsys)  # fmt: skip
    return code, stdout + stderr, pl.read_csv(out)["probability"].to_numpy() if code == 0 else None


def _infer(url: str, rows: pl.DataFrame) -> np.ndarray:
    """The rows as a raw-value request: ids and the timestamp as INT64 (missing: INT64's minimum), geo as BYTES."""
    inputs = []
    for name in ("ad_id", "document_id", "timestamp", "platform", "geo_location"):
        values = rows[name]
        if name == "geo_location":
            kind, data = "BYTES", np.array([[(v or "").encode()] for v in values], dtype=object)
        else:
            kind = "INT64"
            data = values.cast(pl.Int64, strict=False).fill_null(np.iinfo(np.int64).min).to_numpy().reshape(-1, 1)
        tensor = httpclient.InferInput(name, list(data.shape), kind)
        tensor.set_data_from_numpy(data)
        inputs.append(tensor)
    return httpclient.InferenceServerClient(url).infer("wd", inputs).as_numpy("probability").ravel()


def test_raw_rows_score_as_the_preprocessed_rows_in_every_scorer(made):
    work, rows, server, _, triton = made
    code, said, scores = _predict(work, work / "rows.csv")
    assert code == 0, said
    assert run_cli("predict", "--checkpoint", work / "wd.pt", "--dataset", work / "data", "--out",
                   work / "dataset.npy", "--no-progress")[0] == 0  # fmt: skip
    reference = np.load(work / "dataset.npy").ravel()
    assert reference.std() > 1e-3  # a model whose scores differ between rows
    np.testing.assert_allclose(scores, reference, atol=1e-6)
    # a Parquet file of the same rows, its ids typed
    rows.write_parquet(work / "rows.parquet")
    assert np.abs(_predict(work, work / "rows.parquet")[2] - reference).max() < 1e-6
    sent = rows.head(SERVED_ROWS)
    np.testing.assert_allclose(_infer(server.url, sent), reference[:SERVED_ROWS], atol=1e-6)
    if triton is not None:
        np.testing.assert_allclose(_infer(f"127.0.0.1:{triton}", sent), reference[:SERVED_ROWS], atol=1e-6)


def test_the_checkpoint_and_the_export_carry_the_same_preprocessing(made):
    work, rows, *_ = made
    from_checkpoint = load_checkpoint(work / "wd.pt").row_transform()
    exported = carried.read(work / "repository" / "wd" / "1")
    from_dataset = carried.from_dataset(work / "data")
    given = {c: rows[c].head(50) for c in rows.columns}
    outputs = [t.from_request(given, 50) for t in (from_checkpoint, exported, from_dataset)]
    for other in outputs[1:]:
        for a, b in zip(outputs[0], other):
            np.testing.assert_array_equal(a, b)
    numerical, categorical, bags = outputs[0]
    assert numerical.shape == (50, 15) and categorical.shape == (50, 13) and bags.shape == (50, 6, 3)
    assert (categorical > 0).any() and (bags >= 0).any()


def test_a_bad_value_gets_one_verdict_from_every_scorer(made, capsys):
    work, rows, server, lenient, triton = made
    sent = rows.head(20).with_columns(pl.col("ad_id").cast(pl.String))
    row = pl.int_range(pl.len()) == 7
    bad = sent.with_columns(pl.when(row).then(pl.lit("12x")).otherwise("ad_id").alias("ad_id"))
    bad.write_csv(work / "bad.csv")
    code, said, _ = _predict(work, work / "bad.csv", capsys=capsys)
    assert code == 2 and "bad.csv:9: " in said and "column 'ad_id' holds '12x'; expected an integer" in said, said
    code, said, scores = _predict(work, work / "bad.csv", "--bad-values", "missing", capsys=capsys)
    assert code == 0 and "1 bad values scored as missing" in said, said
    # scored as a missing ad: as the row with its ad_id left out (a required value: also a bad one)
    missing = sent.with_columns(pl.when(row).then(None).otherwise("ad_id").alias("ad_id"))
    missing.write_csv(work / "missing.csv")
    code, said, alike = _predict(work, work / "missing.csv", "--bad-values", "missing", capsys=capsys)
    assert code == 0, said
    np.testing.assert_allclose(scores, alike, atol=1e-7)
    assert abs(scores[7] - _predict(work, work / "rows.csv")[2][7]) > 0  # a different row than the good one
    for url in [server.url] + ([f"127.0.0.1:{triton}"] if triton is not None else []):
        with pytest.raises(InferenceServerException, match="ad_id"):
            _infer(url, missing)
    np.testing.assert_allclose(_infer(lenient.url, missing), alike, atol=1e-6)


def test_like_refuses_an_outbrain_model(made, tmp_path, capsys):
    work, rows, *_ = made
    rows.head(50).with_columns(clicked=pl.lit(0)).write_csv(tmp_path / "day.csv")
    code, _, err = run_cli("preprocess", "table", tmp_path / "day.csv", "--out", tmp_path / "out", "--label",
                           "clicked", "--like", work / "wd.pt", "--no-progress", capsys=capsys)  # fmt: skip
    assert code == 2 and "preprocess outbrain" in err and "cannot extend" in err, err


def test_triton_unloads_and_loads_the_model_on_request(made):
    """tritonclient's model control against scripts/tritonserver.sh (explicit mode, every model loaded at start)."""
    work, rows, _, _, triton = made
    if triton is None:
        pytest.skip("no Triton here (make triton)")
    client = httpclient.InferenceServerClient(f"127.0.0.1:{triton}")
    assert client.is_model_ready("wd")
    client.unload_model("wd")
    assert not client.is_model_ready("wd")
    client.load_model("wd")
    assert client.is_model_ready("wd")
    assert [m["name"] for m in client.get_model_repository_index()] == ["wd"]
    assert len(_infer(f"127.0.0.1:{triton}", rows.head(3))) == 3
