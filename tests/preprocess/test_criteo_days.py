"""Criteo one day at a time: a model made from day 0 (gzip) writes day 1 on its vocabularies (`preprocess criteo
--like`), `train --continue-from` grows its tables, and its raw day files (headerless TSV, labeled or not, plain or
gzip) are scored by `predict --input`, `ctrkit serve` and real Triton as `predict --dataset` scores the rows the
preprocessing wrote."""

from __future__ import annotations

import gzip

import numpy as np
import polars as pl
import pytest

from ctrkit.data.synthetic import write_criteo_tsv
from tests.conftest import HAS_TRITON, run_cli, small_model_flags, triton_server

NAMES = ["label", *(f"I{i}" for i in range(1, 14)), *(f"C{i}" for i in range(1, 27))]
CARDINALITIES = (3, 8, 30, 60, 120, 250, 500, 900) * 3 + (40, 700)


@pytest.fixture(scope="module")
def days(tmp_path_factory):
    """Day 0 (gzip) and day 1 of one generated log; a model trained on day 0; day 1 written --like it and the
    model continued on it."""
    work = tmp_path_factory.mktemp("criteo_days")
    log = write_criteo_tsv(work / "log.tsv", 9000, CARDINALITIES, seed=3, progress=False)
    lines = log.read_bytes().splitlines(keepends=True)
    with gzip.open(work / "day_0.tsv.gz", "wb") as f:
        f.writelines(lines[:5000])
    (work / "day_1.tsv").write_bytes(b"".join(lines[5000:]))
    flags = ["--max-steps", "12", "--batch-size", "256", "--no-progress", *small_model_flags()]
    assert run_cli("preprocess", "criteo", work / "day_0.tsv.gz", "--out", work / "d0", "--no-progress")[0] == 0
    assert run_cli("train", "--dataset", work / "d0", "--save-checkpoint", work / "m0.pt", *flags)[0] == 0
    code, out, err = run_cli("preprocess", "criteo", work / "day_1.tsv", "--like", work / "m0.pt", "--out",
                             work / "d1", "--no-progress")  # fmt: skip
    assert code == 0, err
    code, _, err = run_cli("train", "--dataset", work / "d1", "--continue-from", work / "m0.pt", "--save-checkpoint",
                           work / "m1.pt", *flags)  # fmt: skip
    assert code == 0, err
    return work


def test_a_later_day_keeps_every_id_and_numbers_new_values_after_them(days):
    for i in range(26):
        old = pl.read_parquet(days / "d0" / "vocab" / f"C{i + 1}.parquet")
        new = pl.read_parquet(days / "d1" / "vocab" / f"C{i + 1}.parquet")
        own = old.filter(pl.col("id") >= 2).select("value", "id")
        kept = own.join(new.select("value", pl.col("id").alias("now")), on="value", how="left")
        assert kept["now"].to_list() == kept["id"].to_list(), f"C{i + 1}"  # a learned row keeps its value
        grown = new.filter((pl.col("id") >= 2) & ~pl.col("value").is_in(own["value"].implode()))
        top = int(own["id"].max()) if len(own) else 1
        assert sorted(grown["id"].to_list()) == list(range(top + 1, top + 1 + len(grown))), f"C{i + 1}"
    # the dataset says which vocabularies it extends: continued training took it (the fixture), scoring it with the
    # day-0 model is refused
    from ctrkit.data.feature_spec import FeatureSpec

    summary = FeatureSpec.from_yaml(days / "d1").summary()
    assert summary["extends"] and summary["vocabulary"] != FeatureSpec.from_yaml(days / "d0").summary()["vocabulary"]
    assert max(summary["cardinalities"]) > max(FeatureSpec.from_yaml(days / "d0").summary()["cardinalities"])


def test_raw_criteo_days_score_as_their_preprocessed_rows(days, tmp_path, capsys):
    assert run_cli("predict", "--checkpoint", days / "m1.pt", "--dataset", days / "d1", "--out",
                   tmp_path / "p.npy")[0] == 0  # fmt: skip
    want = np.load(tmp_path / "p.npy")
    tail = (days / "day_1.tsv").read_bytes().splitlines(keepends=True)[-len(want) :]
    (tmp_path / "labeled.tsv").write_bytes(b"".join(tail))
    (tmp_path / "unlabeled.tsv").write_bytes(b"".join(line.split(b"\t", 1)[1] for line in tail))
    with gzip.open(tmp_path / "labeled.tsv.gz", "wb") as f:
        f.write(b"".join(tail))
    for name in ("labeled.tsv", "unlabeled.tsv", "labeled.tsv.gz"):
        out = tmp_path / f"{name}.csv"
        code, _, err = run_cli("predict", "--checkpoint", days / "m1.pt", "--input", tmp_path / name, "--out", out,
                               "--keep", "C1", "--no-progress", capsys=capsys)  # fmt: skip
        assert code == 0, err
        got = pl.read_csv(out, infer_schema=False)
        np.testing.assert_allclose(got["probability"].cast(pl.Float64).to_numpy(), want, atol=1e-6, err_msg=name)
        assert got["C1"].to_list()[:3] == [line.split(b"\t")[14].decode() or None for line in tail[:3]]
    # one rule for a value: what the Criteo recipe refuses when fitting is refused when scoring
    bad = [line.split(b"\t") for line in tail[:5]]
    bad[1][2] = b"1.5"
    bad[3][20] = b"zz"
    (tmp_path / "bad.tsv").write_bytes(b"".join(b"\t".join(fields) for fields in bad))
    code, _, err = run_cli("predict", "--checkpoint", days / "m1.pt", "--input", tmp_path / "bad.tsv", "--out",
                           tmp_path / "b.csv", capsys=capsys)  # fmt: skip
    assert code == 2 and "bad.tsv:2: column 'I2' holds '1.5'; expected an integer" in err, err
    code, out, _ = run_cli("predict", "--checkpoint", days / "m1.pt", "--input", tmp_path / "bad.tsv", "--out",
                           tmp_path / "b.csv", "--bad-values", "missing", capsys=capsys)  # fmt: skip
    assert code == 0 and "2 bad values scored as missing" in out
    code, _, err = run_cli("preprocess", "criteo", tmp_path / "bad.tsv", "--out", tmp_path / "bad", capsys=capsys)
    assert code == 2 and "bad.tsv:2: I2: '1.5' is not an integer" in err
    # a file of another layout is refused in one line
    (tmp_path / "short.tsv").write_bytes(b"1\t2\t3\n")
    code, _, err = run_cli("predict", "--checkpoint", days / "m1.pt", "--input", tmp_path / "short.tsv", "--out",
                           tmp_path / "s.csv", capsys=capsys)  # fmt: skip
    assert code == 2 and "short.tsv:1: 3 tab-separated fields; expected 40 (label, I1, I2, ..., C26) or 39" in err


def test_like_refuses_what_it_cannot_keep(days, tmp_path, capsys):
    day = days / "day_1.tsv"
    cases = [
        (["--like", days / "m0.pt", "--raw-ids", "C1"], "with --like the raw-id columns and their tables are"),
        (["--like", tmp_path / "none.pt"], "no such checkpoint or dataset directory"),
    ]
    for flags, said in cases:
        code, _, err = run_cli("preprocess", "criteo", day, "--out", tmp_path / "o", *flags, capsys=capsys)
        assert code == 2 and said in err, err
    rows = pl.DataFrame({"ad": ["a", "b", "c"] * 100, "clicked": [0, 1, 0] * 100})
    rows.write_csv(tmp_path / "t.csv")
    assert run_cli("preprocess", "table", tmp_path / "t.csv", "--out", tmp_path / "t", "--label", "clicked")[0] == 0
    code, _, err = run_cli("preprocess", "criteo", day, "--out", tmp_path / "o", "--like", tmp_path / "t",
                           capsys=capsys)  # fmt: skip
    assert code == 2 and "carries the preprocessing of `ctrkit preprocess table`; `preprocess criteo --like`" in err


def test_servers_score_raw_criteo_columns_as_predict_does(days, tmp_path):
    """A Criteo model's raw columns by name (I1..I13 as INT64, C1..C26 as BYTES) to `ctrkit serve` and to real
    Triton's Python-backend model: `predict --input`'s scores on the same rows."""
    import tritonclient.http as httpclient

    from tests.serve.test_server import Server

    rows = pl.read_csv(days / "day_1.tsv", separator="\t", has_header=False, new_columns=NAMES, n_rows=16,
                       schema_overrides={n: pl.String for n in NAMES[14:]})  # fmt: skip
    assert run_cli("predict", "--checkpoint", days / "m1.pt", "--input", days / "day_1.tsv", "--out",
                   tmp_path / "s.csv", "--no-progress")[0] == 0  # fmt: skip
    want = pl.read_csv(tmp_path / "s.csv")["probability"].to_numpy()[:16]
    repo = tmp_path / "repository"
    assert run_cli("export", "--checkpoint", days / "m1.pt", "--format", "triton", "--backend", "python", "--name",
                   "criteo", "--out", repo)[0] == 0  # fmt: skip

    def request():
        inputs = []
        for name in NAMES[1:]:
            if name.startswith("I"):
                data = rows[name].fill_null(np.iinfo(np.int64).min).to_numpy().astype(np.int64).reshape(-1, 1)
                tensor = httpclient.InferInput(name, list(data.shape), "INT64")
            else:
                data = np.array([[v.encode() if v else b""] for v in rows[name].to_list()], dtype=object)
                tensor = httpclient.InferInput(name, list(data.shape), "BYTES")
            tensor.set_data_from_numpy(data)
            inputs.append(tensor)
        return inputs

    server = Server("--model-repository", repo)
    try:
        got = httpclient.InferenceServerClient(server.url).infer("criteo", request()).as_numpy("probability")[:, 0]
        np.testing.assert_allclose(got, want, atol=1e-6)
    finally:
        server.stop()
    if not HAS_TRITON:
        pytest.skip("no Triton here: `make triton`")
    with triton_server(repo) as port:
        got = httpclient.InferenceServerClient(f"127.0.0.1:{port}").infer("criteo", request())
        np.testing.assert_allclose(got.as_numpy("probability")[:, 0], want, atol=1e-6)


def test_spark_writes_a_day_like_a_model_as_polars_does(days, tmp_path, capsys):
    pytest.importorskip("pyspark")
    from tests.preprocess.test_criteo_spark import MASTER, assert_same_output

    code, _, err = run_cli("preprocess", "criteo", days / "day_1.tsv", "--like", days / "m0.pt", "--out",
                           tmp_path / "spark", "--engine", "spark", "--spark-master", MASTER, "--no-progress",
                           capsys=capsys)  # fmt: skip
    assert code == 0, err
    assert len(assert_same_output(days / "d1", tmp_path / "spark")) > 30
