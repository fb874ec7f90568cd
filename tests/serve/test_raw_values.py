"""Raw rows in, clicks out: the README's own-click-log sequence on a generated CSV (preprocess table, train,
evaluate, report, export), then `predict --input` on new unlabeled rows against `predict --dataset`, raw-value
requests (strings, unseen values, missing numbers) over HTTP to the real `ctrkit serve` and to a real Triton server
on the exported repository, each against `predict --input` on the same rows."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from ctrkit.data.synthetic_clicks import COLUMNS as RAW_COLUMNS
from ctrkit.data.synthetic_clicks import click_log
from tests.conftest import run_cli, small_model_flags, triton_server
from tests.serve.test_server import Server

ROOT = Path(__file__).resolve().parents[2]
ROWS = 6000
COLUMNS = RAW_COLUMNS[:-1]  # the model's inputs: the time (read as its hour and weekday) and the others, not the click


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The README's sequence for your own click log, on a generated CSV; the test rows as raw CSV rows."""
    work = tmp_path_factory.mktemp("own")
    log = click_log(ROWS)
    log.write_csv(work / "clicks.csv")
    data, ckpt = work / "data", work / "runs" / "dlrm.pt"
    assert run_cli("preprocess", "table", work / "clicks.csv", "--out", data, "--label", "clicked", "--order-by", "ts",
                   "--integers", "categorical", "--no-progress")[0] == 0  # fmt: skip
    assert run_cli("train", "--dataset", data, "--model", "dlrm", "--max-steps", 40, "--batch-size", 256,
                   "--no-progress", "--save-checkpoint", ckpt, *small_model_flags())[0] == 0  # fmt: skip
    assert run_cli("evaluate", "--checkpoint", ckpt, "--dataset", data, "--no-progress")[0] == 0
    assert run_cli("report", ckpt, "--dataset", data, "--out", work / "report.html")[0] == 0
    for backend in ("onnx", "python"):
        args = ["export", "--checkpoint", ckpt, "--format", "triton", "--backend", backend, "--name", f"ctr_{backend}"]
        assert run_cli(*args, "--out", work / "repository")[0] == 0
    # model `ctr` as the docs name it; for Triton, in a repository of its own (this Triton build has no ONNX
    # Runtime backend to serve the others)
    args = ["export", "--checkpoint", ckpt, "--format", "triton", "--backend", "python", "--name", "ctr"]
    assert run_cli(*args, "--out", work / "repository")[0] == 0
    assert run_cli(*args, "--out", work / "triton_repository")[0] == 0
    test_rows = log.sort("ts", maintain_order=True).tail(ROWS - int(ROWS * 0.9)).drop("clicked")
    return work, data, ckpt, test_rows


def predict_rows(trained, rows: pl.DataFrame, suffix=".csv", *flags) -> np.ndarray:
    work, _, ckpt, _ = trained
    rows.write_csv(work / "new.csv")
    out = work / f"scores{suffix}"
    assert run_cli("predict", "--checkpoint", ckpt, "--input", work / "new.csv", "--out", out, "--no-progress",
                   *flags)[0] == 0  # fmt: skip
    table = pl.read_parquet(out) if suffix == ".parquet" else pl.read_csv(out)
    return table


def test_predict_input_scores_new_rows_as_the_dataset_scores_them(trained, tmp_path):
    work, data, ckpt, test_rows = trained
    assert run_cli("predict", "--checkpoint", ckpt, "--dataset", data, "--out", tmp_path / "p.npy")[0] == 0
    want = np.load(tmp_path / "p.npy")
    for suffix in (".csv", ".parquet"):  # blocks of 170 rows: the stream's joins are checked too
        table = predict_rows(trained, test_rows, suffix, "--keep", "ts,ad_id", "--batch-size", "170")
        assert table.columns == ["ts", "ad_id", "probability"]
        assert table["ts"].to_list() == test_rows["ts"].to_list()
        np.testing.assert_allclose(table["probability"].to_numpy(), want, rtol=0, atol=1e-6)
    assert not (data / "test").with_suffix(".unchanged").exists()
    # Parquet in, the typed columns: the same scores
    test_rows.write_parquet(tmp_path / "new.parquet")
    assert run_cli("predict", "--checkpoint", ckpt, "--input", tmp_path / "new.parquet", "--out",
                   tmp_path / "s.csv", "--no-progress")[0] == 0  # fmt: skip
    np.testing.assert_allclose(pl.read_csv(tmp_path / "s.csv")["probability"].to_numpy(), want, atol=1e-6)


def test_predict_input_refuses_what_it_cannot_score(trained, tmp_path, capsys):
    work, _, ckpt, test_rows = trained
    test_rows.drop("price").write_csv(tmp_path / "a.csv")
    code, _, err = run_cli("predict", "--checkpoint", ckpt, "--input", tmp_path / "a.csv", "--out", tmp_path / "o.csv",
                           capsys=capsys)  # fmt: skip
    assert code == 2 and "no column 'price'; the model reads" in err and "Traceback" not in err
    test_rows.with_columns(pl.lit("cheap").alias("price")).write_csv(tmp_path / "b.csv")
    code, _, err = run_cli("predict", "--checkpoint", ckpt, "--input", tmp_path / "b.csv", "--out", tmp_path / "o.csv",
                           capsys=capsys)  # fmt: skip
    assert code == 2 and "b.csv:2: column 'price' holds 'cheap'; expected a number" in err
    assert not (tmp_path / "o.csv").exists()  # nothing written


def test_predict_input_reads_files_by_preprocess_rules(trained, tmp_path, capsys):
    """The one table reader under predict: a record with an unquoted comma is refused naming its line (nothing
    written, nothing scored out of line); blank lines are no records (the output keeps one row a record, aligned);
    a tab separator by any of its names; the output may not be the input; a Parquet list where text is due."""
    work, _, ckpt, test_rows = trained
    rows = test_rows.head(40)
    want = predict_rows(trained, rows, ".csv", "--keep", "ts")
    lines = (work / "new.csv").read_text().splitlines()

    def predict(path, *flags):
        return run_cli("predict", "--checkpoint", ckpt, "--input", path, "--out", tmp_path / "o.csv", *flags,
                       capsys=capsys)  # fmt: skip

    shifted = lines[:5] + [lines[5].replace(",", ",x,", 1)] + lines[6:]  # 9 fields under an 8-field header
    (tmp_path / "bad.csv").write_text("\n".join(shifted) + "\n")
    code, _, err = predict(tmp_path / "bad.csv")
    assert code == 2 and "bad.csv:6: 9 comma-separated fields, the header has 8" in err and "Traceback" not in err
    assert not (tmp_path / "o.csv").exists()
    (tmp_path / "blank.csv").write_text("\n".join(lines[:3] + ["", "\r"] + lines[3:] + ["", ""]) + "\n")
    assert predict(tmp_path / "blank.csv", "--keep", "ts")[0] == 0
    assert pl.read_csv(tmp_path / "o.csv").equals(want)
    rows.write_csv(tmp_path / "t.tsv", separator="\t")
    for name in ("tab", "\\t"):
        assert predict(tmp_path / "t.tsv", "--separator", name, "--keep", "ts")[0] == 0
        assert pl.read_csv(tmp_path / "o.csv").equals(want)
    before = (tmp_path / "t.tsv").read_bytes()
    code, _, err = run_cli("predict", "--checkpoint", ckpt, "--input", tmp_path / "t.tsv", "--out", tmp_path / "t.tsv",
                           "--separator", "tab", capsys=capsys)  # fmt: skip
    assert code == 2 and "would destroy the input" in err and (tmp_path / "t.tsv").read_bytes() == before
    rows.with_columns(pl.col("country").map_elements(lambda v: [v], return_dtype=pl.List(pl.String))).write_parquet(
        tmp_path / "l.parquet"
    )
    code, _, err = predict(tmp_path / "l.parquet")
    assert code == 2 and "column 'country' is List(String), a list, where the model reads one value" in err


def _raw_request(rows: pl.DataFrame, binary: bool) -> list:
    inputs = []
    for name in COLUMNS:
        values = rows[name].to_list()
        if name == "price":
            array = np.array([[np.nan if v is None else v] for v in values], np.float32)
            kind = "FP32"
        elif name in ("age", "position"):
            array = np.array([[-1 if v is None else v] for v in values], np.int64)
            kind = "INT64"
        else:
            array = np.array([["" if v is None else v] for v in values], dtype=object)
            kind = "BYTES"
        item = httpclient.InferInput(name, list(array.shape), kind)
        item.set_data_from_numpy(array, binary_data=binary)
        inputs.append(item)
    return inputs


def _unusual_rows(test_rows: pl.DataFrame) -> pl.DataFrame:
    """Test rows with unseen values and missing numbers and text."""
    rows = test_rows.head(12).with_columns(
        pl.Series("ad_id", ["ad_never_seen"] * 3 + test_rows["ad_id"].head(12).to_list()[3:]),
        pl.Series("country", ["ZZ", None] + test_rows["country"].head(12).to_list()[2:]),
        pl.Series("price", [None, 12.5, None] + test_rows["price"].head(12).to_list()[3:]),
    )
    return rows.with_columns(age=pl.when(pl.int_range(pl.len()) == 4).then(None).otherwise(pl.col("age")))


@pytest.fixture(scope="module")
def served(trained):
    """`ctrkit serve` of the repository (models ctr, ctr_onnx, ctr_python), the line it printed first; after the
    module's tests it is stopped (SIGTERM) and must have said nothing more than warnings of its own."""
    work = trained[0]
    server = Server("--model-repository", work / "repository")
    said = server.proc.stderr.readline()
    yield server, said
    server.stop()
    rest = server.proc.stderr.read()
    assert "leaked" not in rest and "Traceback" not in rest, rest  # a clean stop


def test_ctrkit_serve_takes_raw_values(trained, served, capsys):
    work, _, ckpt, test_rows = trained
    rows = _unusual_rows(test_rows)
    want = predict_rows(trained, rows)["probability"].to_numpy()
    server, said = served
    # the URLs it printed answer what they say
    post, get = said.split("POST ")[1].split(";")[0], said.split("GET ")[1].strip()
    assert post.endswith("/v2/models/ctr/infer") and get == post.removesuffix("/infer")
    with urllib.request.urlopen(get, timeout=5) as r:
        assert r.status == 200 and json.loads(r.read())["name"] == "ctr"
    client = httpclient.InferenceServerClient(server.url)
    meta = client.get_model_metadata("ctr_onnx")
    assert [i["name"] for i in meta["inputs"]][: len(COLUMNS)] == list(COLUMNS)
    assert {i["name"]: i["datatype"] for i in meta["inputs"]}["price"] == "FP32"
    for model in ("ctr_onnx", "ctr_python"):
        for binary in (False, True):
            got = client.infer(model, _raw_request(rows, binary)).as_numpy("probability")[:, 0]
            np.testing.assert_allclose(got, want, atol=1e-6, err_msg=f"{model} binary={binary}")
    # JSON as curl sends it, null for a missing value, under predict's column rule: a column the model reads left
    # out is refused naming it (--missing-columns missing: missing in every row); one it does not read is ignored
    body = {"inputs": [{"name": "country", "datatype": "BYTES", "shape": [2, 1], "data": ["ZZ", None]},
                       {"name": "price", "datatype": "FP32", "shape": [2], "data": [None, 12.5]},
                       {"name": "clicks", "datatype": "INT64", "shape": [2], "data": [0, 1]}]}  # fmt: skip
    status, answer = server.post(json.dumps(body).encode(), model="ctr_onnx")
    assert status == 400 and "no column 'ts', 'device', 'ad_id'" in json.loads(answer)["error"], answer
    code, _, err = run_cli("predict", "--checkpoint", trained[2], "--input", _csv(work / "partial.csv", body),
                           "--out", work / "p.csv", capsys=capsys)  # fmt: skip
    assert code == 2 and "no column 'ts', 'device', 'ad_id'" in err
    lenient = Server("--model-repository", work / "repository", "--missing-columns", "missing")
    try:
        status, answer = lenient.post(json.dumps(body).encode(), model="ctr_onnx")
        for bad, message in (
            (
                {"name": "price", "datatype": "BYTES", "shape": [1], "data": ["cheap"]},
                "datatype BYTES, the model declares FP32",
            ),  # (Triton's rule: the config's datatype)
            ({"name": "clicks", "datatype": "FP32", "shape": [1], "data": [1]}, "none of the columns the model reads"),
            ({"name": "price", "datatype": "FP32", "shape": [1], "data": [True]}, "must hold numbers"),
        ):
            code, said = lenient.post(json.dumps({"inputs": [bad]}).encode(), model="ctr_onnx")
            assert code == 400 and message in json.loads(said)["error"], said
    finally:
        lenient.stop()
    assert status == 200
    partial = pl.read_csv(work / "partial.csv")
    np.testing.assert_allclose(json.loads(answer)["outputs"][0]["data"], predict_rows(trained, partial, ".csv",
                               "--missing-columns", "missing")["probability"].to_numpy(), atol=1e-6)  # fmt: skip


def _csv(path: Path, body: dict) -> Path:
    """The JSON request's columns as a CSV file."""
    columns = {i["name"]: [v[0] if isinstance(v, list) else v for v in i["data"]] for i in body["inputs"]}
    pl.DataFrame(columns).write_csv(path)
    return path


@pytest.mark.skipif(not (ROOT / ".venv-triton" / "bin" / "python").exists(), reason="no Triton here: `make triton`")
def test_real_triton_serves_the_exported_repository(trained, tmp_path, monkeypatch):
    work, data, ckpt, test_rows = trained
    rows = _unusual_rows(test_rows)
    want = predict_rows(trained, rows)["probability"].to_numpy()
    with triton_server(work / "triton_repository") as port:
        client = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
        # raw values, and the id inputs, through the Python-backend model
        got = client.infer("ctr", _raw_request(rows, True)).as_numpy("probability")[:, 0]
        np.testing.assert_allclose(got, want, atol=1e-6)
        # the serving page's Python client, as written, every datatype (missing integer ids included)
        page = (ROOT / "docs" / "serving.md").read_text()
        doc_client = next(b for b in re.findall(r"```python\n(.*?)```", page, re.S) if "read_csv" in b)
        monkeypatch.chdir(tmp_path)
        rows.write_csv(tmp_path / "new.csv")
        assert rows["age"].null_count() and rows["position"].null_count() < len(rows)
        scope: dict = {}
        exec(doc_client.replace("127.0.0.1:8000", f"127.0.0.1:{port}"), scope)  # noqa: S102 - our own documentation
        np.testing.assert_allclose(scope["probability"][:, 0], want, atol=1e-6)
        from ctrkit.data.dataset import SplitBinaryDataset

        batch = SplitBinaryDataset(data, "test").slice(0, 12)
        ids = [httpclient.InferInput("numerical", list(batch.numerical.shape), "FP32"),
               httpclient.InferInput("categorical", list(batch.categorical.shape), "INT64")]  # fmt: skip
        ids[0].set_data_from_numpy(batch.numerical.numpy())
        ids[1].set_data_from_numpy(batch.categorical.numpy())
        by_ids = client.infer("ctr", ids).as_numpy("probability")[:, 0]
        np.testing.assert_allclose(by_ids, predict_rows(trained, test_rows.head(12))["probability"], atol=1e-6)
        country = httpclient.InferInput("country", [1, 1], "BYTES")
        country.set_data_from_numpy(np.array([["BR"]], dtype=object))
        price = httpclient.InferInput("price", [1, 1], "BYTES")  # declared FP32: Triton refuses it
        price.set_data_from_numpy(np.array([["cheap"]], dtype=object))
        with pytest.raises(Exception, match="price"):
            client.infer("ctr", [country, price])
        price = httpclient.InferInput("price", [1, 1], "FP32")  # the model's own refusals, in words, as a 400

        def refused(inputs, match):  # the client's error: Triton's invalid-argument, HTTP 400 (not a 500)
            with pytest.raises(InferenceServerException, match=match) as e:
                client.infer("ctr", inputs)
            assert str(e.value.status()) == "400", (e.value.status(), match)

        price.set_data_from_numpy(np.array([[12.5]], np.float32))
        refused([country, price], "no column 'ts', 'device', 'ad_id'")  # predict's column rule
        refused(_raw_request(rows.head(1).with_columns(price=pl.lit(float("inf"))), False),
                "column 'price' holds 'inf'; expected a finite number")  # fmt: skip
        bad = batch.numerical.numpy().copy()
        for value in (np.nan, np.inf):  # (1e300 arrives as float32's inf)
            bad[3, 0] = value
            ids[0].set_data_from_numpy(bad)
            refused(ids, "input 'numerical' holds NaN or infinite values")  # ctrkit's server: the same 400
        ids[0].set_data_from_numpy(batch.numerical.numpy())
        refused(ids[:1], "missing input.s. categorical")
        one = httpclient.InferInput("country", list(batch.categorical.shape[:1]) + [1], "BYTES")
        one.set_data_from_numpy(np.array([["BR"]] * len(batch.categorical), dtype=object))
        refused([*ids, one], "beside the id inputs")
        assert client.is_server_live()


def test_evaluate_and_report_name_the_kept_step(trained, capsys):
    from ctrkit.checkpoint import load_checkpoint

    work, data, ckpt, _ = trained
    kept = load_checkpoint(ckpt)
    assert kept.kept_step != kept.step  # the fixture's run kept an earlier evaluation
    code, out, _ = run_cli("evaluate", "--checkpoint", ckpt, "--dataset", data, "--no-progress", capsys=capsys)
    assert code == 0 and f"step {kept.kept_step} (kept of {kept.step} trained) on test" in out
    code, out, _ = run_cli("report", ckpt, "--dataset", data, "--out", work / "r.html", capsys=capsys)
    assert code == 0 and f"step {kept.kept_step} on test" in out


def test_the_serving_pages_raw_value_examples_run(trained, served, tmp_path, monkeypatch):
    """docs/serving.md's curl body and Python client, as written, against `ctrkit serve` of a repository holding
    model `ctr`: the answers are `predict --input`'s on the same rows."""
    import re

    work, _, _, test_rows = trained
    page = (ROOT / "docs" / "serving.md").read_text()
    body = re.search(r"curl -s \S+ -d '(.*?)'\n", page, re.S).group(1)
    client = next(b for b in re.findall(r"```python\n(.*?)```", page, re.S) if "read_csv" in b)
    rows = test_rows.head(20)
    monkeypatch.chdir(tmp_path)
    rows.write_csv(tmp_path / "new.csv")
    curl_rows = pl.DataFrame({"ts": ["2026-03-02T19:30:00", None], "country": ["BR", None],
                              "device": ["mobile", "tablet"], "ad_id": ["ad_0004", "an_ad_never_seen"],
                              "category": ["books", None], "age": [34, None], "price": [12.5, None],
                              "position": [1, 3]})  # fmt: skip
    assert set(curl_rows.columns) == set(COLUMNS)
    want_rows, want_curl = predict_rows(trained, rows), predict_rows(trained, curl_rows)["probability"].to_numpy()
    server = served[0]
    status, answer = server.post(body.encode(), model="ctr")
    assert status == 200, answer
    np.testing.assert_allclose(json.loads(answer)["outputs"][0]["data"], want_curl, atol=1e-6)
    scope: dict = {}
    exec(client.replace("127.0.0.1:8000", server.url), scope)  # noqa: S102 - our own documentation
    np.testing.assert_allclose(scope["probability"][:, 0], want_rows["probability"].to_numpy(), atol=1e-6)


def test_raw_id_columns_score_through_the_carried_hash(trained, tmp_path):
    """`--raw-ids ad_id`: the model carries the hash, not a vocabulary; predict --input and an export's raw-value
    path equal predict on the dataset."""
    from ctrkit.serve.predictor import Predictor

    work, _, _, test_rows = trained
    data, ckpt = tmp_path / "data", tmp_path / "dlrm.pt"
    assert run_cli("preprocess", "table", work / "clicks.csv", "--out", data, "--label", "clicked", "--order-by", "ts",
                   "--integers", "categorical", "--raw-ids", "ad_id", "--no-progress")[0] == 0  # fmt: skip
    assert run_cli("train", "--dataset", data, "--max-steps", 20, "--batch-size", 256, "--no-progress",
                   "--save-checkpoint", ckpt, *small_model_flags())[0] == 0  # fmt: skip
    assert run_cli("predict", "--checkpoint", ckpt, "--dataset", data, "--out", tmp_path / "p.npy")[0] == 0
    test_rows.write_csv(tmp_path / "new.csv")
    out = tmp_path / "s.parquet"
    assert run_cli("predict", "--checkpoint", ckpt, "--input", tmp_path / "new.csv", "--out", out)[0] == 0
    want = np.load(tmp_path / "p.npy")
    np.testing.assert_allclose(pl.read_parquet(out)["probability"].to_numpy(), want, atol=1e-6)
    assert run_cli("export", "--checkpoint", ckpt, "--format", "onnx", "--out", tmp_path / "onnx")[0] == 0
    exported = Predictor.from_export(tmp_path / "onnx")
    got = exported.score_named({c: test_rows[c].to_list() for c in COLUMNS})
    np.testing.assert_allclose(got[:, 0], want, atol=1e-5)


def test_generated_bodies_get_an_answer_in_words_and_the_server_stays_up(trained, served):
    """2,000+ bodies made by hypothesis (any JSON; requests whose inputs have any name, datatype, shape and data; a
    valid raw-value or id request with one field replaced by any JSON value; bytes behind a binary-data header),
    posted to the real server's infer routes and the repository index: every answer is a 200 or a 4xx whose body
    says what is wrong; none is a 500, and the server answers after them."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    server = served[0]
    _, _, _, test_rows = trained
    valid = json.loads(json.dumps({"inputs": [{"name": name, "datatype": kind, "shape": [2], "data": data}
                                              for name, kind, data in _json_columns(test_rows.head(2))]}))  # fmt: skip
    leaf = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=6)
    value = st.recursive(leaf, lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=6), c, max_size=3),
                         max_leaves=10)  # fmt: skip
    name = st.sampled_from([*COLUMNS, "numerical", "categorical", "multi_hot", "unknown", ""])
    datatype = st.sampled_from(["FP32", "INT64", "BYTES", "BOOL", "FP64", "INT32", "UINT8", "fp32", ""]) | value
    shape = st.lists(st.integers(-2, 4), max_size=3) | value
    tensor = st.fixed_dictionaries({"name": name, "datatype": datatype, "shape": shape, "data": value},
                                   optional={"parameters": value})  # fmt: skip
    request = st.fixed_dictionaries({"inputs": st.lists(tensor, max_size=len(COLUMNS) + 2)},
                                    optional={"outputs": value, "parameters": value, "id": value})  # fmt: skip

    @st.composite
    def mutated(draw):
        doc = json.loads(json.dumps(valid))
        if draw(st.booleans()):
            doc["inputs"] = draw(st.permutations(doc["inputs"]))[: draw(st.integers(0, len(doc["inputs"])))]
        if doc["inputs"]:
            item = draw(st.sampled_from(doc["inputs"]))
            item[draw(st.sampled_from(["name", "datatype", "shape", "data", "parameters"]))] = draw(value)
        return doc

    as_json = (value | request | mutated()).map(lambda doc: (json.dumps(doc).encode(), {}))
    binary = st.tuples(st.binary(max_size=64), st.integers(-5, 80)).map(
        lambda b: (b[0], {"Inference-Header-Content-Length": str(b[1])})
    )
    paths = st.sampled_from(["/v2/models/ctr/infer", "/v2/models/ctr_onnx/versions/1/infer",
                             "/v2/models/ctr_python/infer", "/v2/repository/index"])  # fmt: skip
    answers: dict[int, int] = {}

    @settings(max_examples=2000, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(path=paths, sent=as_json | binary)
    def post(path, sent):
        body, headers = sent
        status, text = server.post(body, headers=headers, path=path)
        answers[status] = answers.get(status, 0) + 1
        assert status == 200 or 400 <= status < 500, (status, body[:300], text[:300])
        if status != 200:
            said = json.loads(text)["error"]
            assert isinstance(said, str) and len(said) > 10, (body[:300], said)

    post()
    assert sum(answers.values()) >= 2000 and not any(s >= 500 for s in answers)
    assert answers.get(400, 0) > 1000 and answers.get(200, 0) > 50  # mostly refused, some valid ones scored
    assert server.healthy()


def _json_columns(rows: pl.DataFrame) -> list[tuple[str, str, list]]:
    """Each model input column of ``rows`` as (name, datatype, data) for a JSON request."""
    out = []
    for name in COLUMNS:
        values = rows[name].to_list()
        kind = "FP32" if name == "price" else "INT64" if name in ("age", "position") else "BYTES"
        out.append((name, kind, values))
    return out


def test_an_export_whose_preprocessing_does_not_fit_its_model_is_refused_at_load(trained, tmp_path, capsys):
    """An export sealed with a preprocessing that is not its model's (ids past a table's rows; a feature fewer) is
    refused when loaded, naming the export, instead of being READY and answering every request with a 500."""

    from ctrkit.integrity import seal_files
    from ctrkit.preprocess.transform import RowTransform
    from ctrkit.serve.predictor import Predictor

    _, _, ckpt, _ = trained
    out = tmp_path / "onnx"
    assert run_cli("export", "--checkpoint", ckpt, "--format", "onnx", "--out", out)[0] == 0
    Predictor.from_export(out)  # as exported: it fits
    transform = RowTransform.read(out)
    feature = next(iter(transform.vocabularies))
    grown = transform.vocabularies[feature].with_columns(pl.col("id") + 10_000)
    vocabularies = {**transform.vocabularies, feature: grown}
    RowTransform(transform.source, transform.columns, transform.numerical, transform.categorical, transform.multi_hot,
                 vocabularies, transform.null_values, transform.label).write(out)  # fmt: skip
    seal_files(out)
    with pytest.raises(ValueError, match=f"gives feature '{feature}' ids up to .* not exported together"):
        Predictor.from_export(out)
    RowTransform(transform.source, transform.columns, [], transform.categorical, transform.multi_hot,
                 transform.vocabularies, transform.null_values, transform.label).write(out)  # fmt: skip
    seal_files(out)
    with pytest.raises(ValueError, match="makes 0 numerical features, the model reads 1"):
        Predictor.from_export(out)
    code, _, err = run_cli("serve", "--model-dir", out, "--port", "0", capsys=capsys)
    assert code == 2 and "not exported together" in err and "Traceback" not in err


def test_large_raw_requests_are_transformed_off_the_event_loop(trained, monkeypatch):
    """Raw rows become ids on the event loop up to INLINE_ROWS rows (a one-row request's transform is cheaper than a
    hand-off), and in a thread beyond, so that a large request never holds the loop other clients are served on;
    both give the ids the model's transform gives."""
    import asyncio
    import threading

    from ctrkit.preprocess.transform import RowTransform
    from ctrkit.serve.predictor import Predictor
    from ctrkit.serve.protocol import parse_request
    from ctrkit.serve.state import INLINE_ROWS, Limits, ServerState

    work, _, _, test_rows = trained
    predictor = Predictor.from_export(work / "repository" / "ctr_onnx")
    threads, real = [], RowTransform.from_request

    def recorded(self, *args, **kwargs):
        threads.append(threading.current_thread().name)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(RowTransform, "from_request", recorded)
    sizes = [1, INLINE_ROWS + 1]

    async def run():
        state = ServerState(predictor, "ctr", Limits(), None)
        await state.startup()
        served, out = state.lookup("ctr", None), []
        for n in sizes:
            rows = pl.concat([test_rows] * (n // len(test_rows) + 1)).head(n)
            body = {"inputs": [{"name": c, "datatype": k, "shape": [n, 1], "data": [[None if v is None else v]
                                                                                    for v in values]}
                               for c, k, values in _json_columns(rows)]}  # fmt: skip
            parsed = parse_request(json.dumps(body).encode(), None, served.predictor.signature)
            done, _ = await state._transform("ctr", None, served, parsed)
            out.append((rows, done))
        await state.shutdown()
        return out

    out = asyncio.run(run())
    assert threads[0] == threading.main_thread().name and threads[1].startswith("ctrkit-transform"), threads
    for rows, done in out:
        numerical, categorical, _ = real(predictor.transform, {c: rows[c].to_list() for c in COLUMNS}, len(rows))
        np.testing.assert_array_equal(done.categorical, categorical)
        np.testing.assert_array_equal(done.numerical, numerical)


def test_numbers_a_column_cannot_hold_are_refused_or_missing_never_changed(trained, served):
    """A JSON integer of 400 digits is refused (it was read as a missing value); a number sent in another datatype
    than the column's is refused (Triton's rule)."""
    _, _, _, test_rows = trained
    server, _ = served
    row = test_rows.head(1)

    def body(**changed):
        inputs = []
        for name, kind, values in _json_columns(row):
            kind, values = changed.get(name, (kind, values))
            inputs.append({"name": name, "datatype": kind, "shape": [1, 1], "data": [values]})
        return json.dumps({"inputs": inputs}).encode()

    def score(**changed):
        status, answer = server.post(body(**changed), model="ctr_onnx")
        assert status == 200, answer
        return json.loads(answer)["outputs"][0]["data"][0]

    status, answer = server.post(body(price=("FP32", [int("9" * 400)])), model="ctr_onnx")
    assert status == 400 and "input 'price'" in json.loads(answer)["error"] and "beyond a 64-bit" in answer.decode()
    # another datatype than the model declares is refused, as Triton refuses it (a file's "30.9" is missing, its
    # "30.0" is 30: tests/serve/test_value_rules.py)
    for kind, value in (("FP32", 30.9), ("FP32", 30.0), ("INT32", 30), ("BYTES", "30")):
        status, answer = server.post(body(age=(kind, [value])), model="ctr_onnx")
        assert status == 400 and f"datatype {kind}, the model declares INT64" in answer.decode(), answer
    assert score(age=("INT64", [None])) != score(age=("INT64", [30]))


def test_a_killed_parquet_predict_leaves_nothing_behind_the_next_run(trained, tmp_path):
    """`predict --input ... --out x.parquet` killed while it writes its parts: the next run to the same output
    removes what the killed one left (its parts directory was kept for good before), and writes the whole file."""
    import signal

    work, _, ckpt, test_rows = trained
    big = pl.concat([test_rows] * 80)
    big.write_csv(tmp_path / "new.csv")
    out = tmp_path / "scores.parquet"
    cmd = [sys.executable, "-m", "ctrkit", "predict", "--checkpoint", str(ckpt), "--input", str(tmp_path / "new.csv"),
           "--out", str(out), "--no-progress"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not any(p.name.startswith(f".{out.name}.") and "parts" in p.name for p in tmp_path.iterdir()):
        assert proc.poll() is None and time.monotonic() < deadline, "predict ended before it wrote parts"
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert [p for p in tmp_path.iterdir() if "parts" in p.name]  # what the killed run left
    assert run_cli("predict", "--checkpoint", ckpt, "--input", tmp_path / "new.csv", "--out", out)[0] == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new.csv", "scores.parquet"]
    assert len(pl.read_parquet(out)) == len(big)


def test_a_repository_server_answers_the_configuration_statistics_and_load_extensions(trained, served):
    """With a model repository: each model's config (raw columns and id inputs, each optional), every version's
    statistics, and a load that brings a config of its own refused in words (it was ignored in silence)."""
    from tritonclient.utils import InferenceServerException

    server, _ = served
    client = httpclient.InferenceServerClient(server.url)
    config = client.get_model_config("ctr_onnx")
    kinds = {i["name"]: (i["data_type"], i.get("optional")) for i in config["input"]}
    assert kinds["country"] == ("TYPE_STRING", True) and kinds["price"] == ("TYPE_FP32", True)
    assert kinds["categorical"] == ("TYPE_INT64", True) and config["output"][0]["name"] == "probability"
    names = {s["name"] for s in client.get_inference_statistics()["model_stats"]}
    assert {"ctr", "ctr_onnx", "ctr_python"} <= names
    with pytest.raises(InferenceServerException, match="config is not taken"):
        client.load_model("ctr", config='{"max_batch_size": 4}')
    client.load_model("ctr")  # as the repository holds it
    assert client.is_model_ready("ctr")
    client.close()
