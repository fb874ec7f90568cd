"""One rule for a value, held by every command that reads raw rows: each case is a table `preprocess table` fits
on, a file `predict --input` scores, and a request to the real `ctrkit serve` and to real Triton's Python-backend
model, all with the same value in the same row; each gives one verdict (refused naming the column, or read as
missing), and under `--bad-values missing` (the servers' flag, Triton's config parameter) a bad value scores as a
missing one does."""

from __future__ import annotations

import re
from contextlib import ExitStack
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from ctrkit.data.synthetic_clicks import click_log
from tests.conftest import HAS_TRITON, run_cli, small_model_flags, triton_server
from tests.serve.test_server import Server

ROWS, ROW = 2000, 7  # the bad value's row among the scored rows (0-based): its line in a CSV is ROW + 2


def _tables() -> dict[str, pl.DataFrame]:
    """Model `iso` reads a text timestamp (ISO, as the log writes it), model `unix` seconds since 1970."""
    log = click_log(ROWS).select("ts", "country", "device", "ad_id", "price", "clicked")
    seconds = log["ts"].str.strptime(pl.Datetime("ms")).dt.epoch("s")
    return {"iso": log, "unix": log.with_columns(seconds.alias("ts"))}


MODEL_FLAGS = {"iso": [], "unix": ["--time", "ts", "--time-format", "unix"]}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """Both models trained and exported (Python backend: raw values), a copy of `iso` whose config says
    bad_values "missing"; `ctrkit serve` of the repository twice (--bad-values error and missing) and Triton."""
    work = tmp_path_factory.mktemp("rules")
    repo = work / "repository"
    for name, table in _tables().items():
        table.write_csv(work / f"{name}.csv")
        data, ckpt = work / f"data_{name}", work / f"{name}.pt"
        assert run_cli("preprocess", "table", work / f"{name}.csv", "--out", data, "--label", "clicked", "--order-by",
                       "ts", *MODEL_FLAGS[name], "--no-progress")[0] == 0  # fmt: skip
        assert run_cli("train", "--dataset", data, "--max-steps", 10, "--batch-size", 256, "--no-progress",
                       "--save-checkpoint", ckpt, *small_model_flags())[0] == 0  # fmt: skip
        for model in (name, f"{name}_missing") if name == "iso" else (name,):
            assert run_cli("export", "--checkpoint", ckpt, "--format", "triton", "--backend", "python", "--name", model,
                           "--out", repo)[0] == 0  # fmt: skip
    config = repo / "iso_missing" / "config.pbtxt"
    text = config.read_text()
    assert 'key: "bad_values" value: { string_value: "error" }' in text  # the export's default, as predict's
    config.write_text(text.replace('key: "bad_values" value: { string_value: "error" }',
                                   'key: "bad_values" value: { string_value: "missing" }'))  # fmt: skip
    servers = [Server("--model-repository", repo), Server("--model-repository", repo, "--bad-values", "missing")]
    with ExitStack() as stack:
        for server in servers:
            stack.callback(server.stop)
        port = stack.enter_context(triton_server(repo)) if HAS_TRITON else None
        yield work, servers, port


def _rows(model: str, value) -> pl.DataFrame:
    """The last 20 rows of the model's table without the label, ``value`` in row ROW: a float in ``price``, anything
    else in ``ts`` (None: missing)."""
    rows = _tables()[model].tail(20).drop("clicked")
    column = "price" if isinstance(value, float) else "ts"
    values = rows[column].to_list()
    values[ROW] = value
    dtype = pl.String if isinstance(value, str) else rows.schema[column]
    return rows.with_columns(pl.Series(column, values, dtype=dtype, strict=False))


def _infer(client: httpclient.InferenceServerClient, model: str, rows: pl.DataFrame):
    """The rows as a raw-value request (text as BYTES, integers as INT64, numbers as FP32)."""
    inputs = []
    for name, dtype in rows.schema.items():
        values = rows[name]
        if dtype == pl.String:
            kind, data = "BYTES", np.array([[v.encode() if v is not None else b""] for v in values], dtype=object)
        elif dtype.is_integer():
            kind, data = "INT64", values.to_numpy().astype(np.int64).reshape(-1, 1)
        else:  # (1e39 arrives as float32's inf)
            with np.errstate(over="ignore"):
                kind, data = "FP32", values.to_numpy().astype(np.float32).reshape(-1, 1)
        tensor = httpclient.InferInput(name, list(data.shape), kind)
        tensor.set_data_from_numpy(data)
        inputs.append(tensor)
    return client.infer(model, inputs)


def _clients(served, model: str):
    """(what, client, model name, rule) of each server: ctrkit serve under each rule (the second server's flag), and
    Triton's model under each (the `_missing` copy's config parameter; only `iso` has one)."""
    _, servers, triton = served
    out = [("ctrkit serve", httpclient.InferenceServerClient(servers[0].url), model, "error"),
           ("ctrkit serve --bad-values missing", httpclient.InferenceServerClient(servers[1].url), model,
            "missing")]  # fmt: skip
    if triton is not None:
        client = httpclient.InferenceServerClient(f"127.0.0.1:{triton}")
        out.append(("Triton", client, model, "error"))
        if model == "iso":
            out.append(("Triton bad_values missing", client, "iso_missing", "missing"))
    return out


def _predict(work: Path, model: str, rows: pl.DataFrame, suffix: str, *flags, capsys=None):
    path = work / f"new{suffix}"
    if suffix == ".csv":
        rows.write_csv(path)
    else:
        rows.write_parquet(path)
    out = work / "scores.csv"
    out.unlink(missing_ok=True)
    code, stdout, stderr = run_cli("predict", "--checkpoint", work / f"{model}.pt", "--input", path, "--out", out,
                                   "--no-progress", *flags, capsys=capsys)  # fmt: skip
    scores = pl.read_csv(out)["probability"].to_numpy() if code == 0 else None
    return code, stdout, stderr, scores


BAD = [  # (model, value, what the refusal says; a float goes to price, anything else to ts)
    ("iso", 1e39, "column 'price'"),
    ("iso", float("inf"), "column 'price'"),
    ("iso", "04/11/2026 00:00", "column 'ts' holds '04/11/2026 00:00'; expected a timestamp of the column's format"),
    ("iso", "yesterday", "column 'ts' holds 'yesterday'"),
    ("iso", "2026-11-04 10:00:00", "column 'ts' holds '2026-11-04 10:00:00'"),  # ISO, not the model's own
    ("unix", 1767225600000, "column 'ts' holds '1767225600000'; expected a timestamp of the column's format 'unix'"),
]


@pytest.mark.parametrize(("model", "value", "said"), BAD, ids=[str(v) for _, v, _ in BAD])
def test_a_bad_value_gets_one_verdict_from_every_scorer(served, capsys, model, value, said):
    work = served[0]
    # preprocess: the value in a training row is a bad row, named by its line
    table = _tables()[model]
    column = "price" if isinstance(value, float) else "ts"
    fitted = table.with_columns(pl.Series(column, [*table[column].cast(pl.String).to_list()[:ROW], str(value),
                                                   *table[column].cast(pl.String).to_list()[ROW + 1 :]]))  # fmt: skip
    fitted.write_csv(work / "fit.csv")
    code, _, err = run_cli("preprocess", "table", work / "fit.csv", "--out", work / "refit", "--overwrite", "--label",
                           "clicked", "--order-by", "ts", *MODEL_FLAGS[model], "--no-progress",
                           capsys=capsys)  # fmt: skip
    assert code == 2 and f"fit.csv:{ROW + 2}: column '{column}'" in err, err
    rows = _rows(model, value)
    # predict --input: refused, naming the file's line; --bad-values missing: scored as the value left out
    code, _, err, _ = _predict(work, model, rows, ".csv", capsys=capsys)
    assert code == 2 and f"new.csv:{ROW + 2}: column '{column}'" in err and "Traceback" not in err, err
    assert not isinstance(value, str) or said in err, err
    _, _, _, as_missing = _predict(work, model, _rows(model, None if column == "ts" else float("nan")), ".csv")
    code, out, _, scores = _predict(work, model, rows, ".csv", "--bad-values", "missing", capsys=capsys)
    assert code == 0 and "1 bad values scored as missing (--bad-values missing); the first, " in out
    assert f"new.csv:{ROW + 2}: column '{column}'" in out
    np.testing.assert_allclose(scores, as_missing, atol=1e-7)
    as_given = _predict(work, model, _tables()[model].tail(20).drop("clicked"), ".csv")[3]
    assert scores[ROW] != as_given[ROW] and np.array_equal(np.delete(scores, ROW), np.delete(as_given, ROW))
    # the servers: a 400 naming the row and column under "error"; the missing value's score under "missing"
    for what, client, name, rule in _clients(served, model):
        if rule == "error":
            with pytest.raises(InferenceServerException) as e:
                _infer(client, name, rows)
            message = str(e.value)
            assert str(e.value.status()) == "400" and f"row {ROW + 1}: column '{column}'" in message, (what, message)
            assert not isinstance(value, str) or said in message, (what, message)
            # each server names its own way to score it as missing: serve's flag, the Triton config's parameter
            hint = "--bad-values missing" if what.startswith("ctrkit") else 'the config parameter bad_values "missing"'
            assert f"{hint} scores a bad value as missing" in message, (what, message)
            assert what.startswith("ctrkit") or "--bad-values" not in message, (what, message)
            continue
        answer = _infer(client, name, rows)
        np.testing.assert_allclose(answer.as_numpy("probability")[:, 0], as_missing, atol=1e-6, err_msg=what)
        if what.startswith("ctrkit"):  # (Triton's Python backend here passes no response parameters on)
            assert answer.get_response().get("parameters") == {"bad_values_missing": 1}, what


def test_nan_is_a_missing_value_for_every_scorer(served, capsys):
    work = served[0]
    table = _tables()["iso"]
    price = table["price"].to_list()
    price[ROW] = float("nan")
    table.with_columns(pl.Series("price", price)).write_parquet(work / "fit.parquet")
    code, out, err = run_cli("preprocess", "table", work / "fit.parquet", "--out", work / "refit_nan", "--label",
                             "clicked", "--order-by", "ts", "--no-progress", capsys=capsys)  # fmt: skip
    assert code == 0 and "0 bad rows dropped" in out, err
    nan_rows = _rows("iso", float("nan"))
    empty_rows = nan_rows.with_columns(pl.col("price").fill_nan(None))
    _, _, _, empty = _predict(work, "iso", empty_rows, ".csv")
    for suffix in (".parquet", ".csv"):
        code, _, err, scores = _predict(work, "iso", nan_rows, suffix, capsys=capsys)
        assert code == 0, err
        np.testing.assert_allclose(scores, empty, atol=1e-7)
    for what, client, name, rule in _clients(served, "iso"):
        if rule == "error":
            got = _infer(client, name, nan_rows).as_numpy("probability")[:, 0]
            np.testing.assert_allclose(got, empty, atol=1e-6, err_msg=what)


def test_what_a_table_cannot_mean_is_refused_when_fitting(served, tmp_path, capsys):
    """The fit's own cases: milliseconds named as seconds, a day-first date, a list-valued column, a lone-CR file:
    one line naming what to give; a 14-digit timestamp named in --time is read."""
    log = click_log(300)
    ms = log.with_columns(pl.col("ts").str.strptime(pl.Datetime("ms")).dt.epoch("ms").alias("ts"))
    dmy = log.with_columns(pl.col("ts").str.strptime(pl.Datetime).dt.strftime("%d/%m/%Y %H:%M").alias("ts"))
    tags = log.with_columns(pl.Series("tags", [["sale|new", "eco", "new|eco|hot"][i % 3] for i in range(300)]))
    compact = log.with_columns(pl.col("ts").str.strptime(pl.Datetime).dt.strftime("%Y%m%d%H%M%S").alias("ts"))
    cases = [
        (ms, ["--time", "ts", "--time-format", "unix"], "column 'ts': its first value 1767225600000 is beyond the year "
         "5000 as a count of 'unix' (milliseconds: --time-format unix_ms)"),
        (dmy, [], "column 'ts' holds dates such as '01/01/2026 00:00' in none of the formats tried: its first value "
         "'01/01/2026 00:00' looks like '%d/%m/%Y %H:%M' or '%m/%d/%Y %H:%M': give --time-format"),
        (tags, ["--time", "ts"], "column 'tags' holds lists of values such as 'sale|new' (200 of 300 values hold '|'): "
         "name it in --multi-hot"),
    ]  # fmt: skip
    for k, (table, flags, said) in enumerate(cases):
        table.write_csv(tmp_path / f"t{k}.csv")
        code, _, err = run_cli("preprocess", "table", tmp_path / f"t{k}.csv", "--out", tmp_path / f"o{k}", "--label",
                               "clicked", "--integers", "categorical", *flags, capsys=capsys)  # fmt: skip
        assert code == 2 and said in err and "Traceback" not in err, err
    dmy.write_csv(tmp_path / "dmy.csv")
    code, out, err = run_cli("preprocess", "table", tmp_path / "dmy.csv", "--out", tmp_path / "dmy", "--label",
                             "clicked", "--integers", "categorical", "--time-format", "%d/%m/%Y %H:%M",
                             capsys=capsys)  # fmt: skip
    assert code == 0 and "ts_hour, ts_weekday" in out, err
    compact.write_csv(tmp_path / "compact.csv")
    code, out, err = run_cli("preprocess", "table", tmp_path / "compact.csv", "--out", tmp_path / "compact", "--label",
                             "clicked", "--integers", "categorical", "--time", "ts", capsys=capsys)  # fmt: skip
    assert code == 0 and "ts_hour, ts_weekday" in out, err
    spec = re.search(r"categorical ([^;]*)", out).group(1)
    assert "ts," not in spec.replace("ts_", "")  # the digits are a time, not an id of their own
    (tmp_path / "cr.csv").write_bytes((tmp_path / "compact.csv").read_bytes().replace(b"\n", b"\r"))
    for command in (["preprocess", "table", tmp_path / "cr.csv", "--out", tmp_path / "cr", "--label", "clicked"],
                    ["predict", "--checkpoint", served[0] / "iso.pt", "--input", tmp_path / "cr.csv", "--out",
                     tmp_path / "s.csv"]):  # fmt: skip
        code, _, err = run_cli(*command, capsys=capsys)
        assert code == 2 and "cr.csv:1: lines end in a lone carriage return" in err and "tr '\\r' '\\n'" in err, err
