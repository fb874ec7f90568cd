"""`ctrkit synth outbrain-raw` -> `ctrkit preprocess outbrain`: the Kaggle schema in, NVIDIA's feature set
out, split per display, statistics from training rows only, bad rows named by file and line."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from ctrkit.data.dataset import SplitBinaryDataset
from ctrkit.data.feature_spec import FeatureSpec
from ctrkit.preprocess.outbrain import MULTI_HOT, NUMERICAL, ONEHOT
from ctrkit.preprocess.outbrain_files import EVAL_SHARE, TRAIN_LAST_DAY, OutbrainRecipe, split_draw
from tests.conftest import run_cli

CTR_FOLDS = OutbrainRecipe().ctr_folds  # the default of --ctr-folds


@pytest.fixture(scope="module")
def raw(tmp_path_factory):
    out = tmp_path_factory.mktemp("outbrain") / "raw"
    assert run_cli("synth", "outbrain-raw", "--out", out, "--rows", "6000", "--seed", "2")[0] == 0
    return out


@pytest.fixture(scope="module")
def dataset(raw):
    out = raw.parent / "dataset"
    assert run_cli("preprocess", "outbrain", raw, "--out", out, "--no-progress")[0] == 0
    return out


def train_mask(raw, clicks: pl.DataFrame) -> np.ndarray:
    """The split, recomputed independently: per display, day <= 10 and a draw of at least 0.2 trains."""
    events = pl.read_csv(raw / "events.csv", infer_schema=False).with_columns(
        pl.col("display_id", "timestamp").cast(pl.Int64)
    )
    day = dict(zip(events["display_id"].to_list(), (events["timestamp"] // 86_400_000).to_list()))
    displays = clicks["display_id"].to_numpy()
    return np.array([day[d] <= TRAIN_LAST_DAY for d in displays]) & (split_draw(displays, 0) >= EVAL_SHARE)


def test_raw_files_have_the_kaggle_schema(raw):
    events = pl.read_csv(raw / "events.csv", infer_schema=False)
    assert events.columns == ["display_id", "uuid", "document_id", "timestamp", "platform", "geo_location"]
    assert events["geo_location"].str.contains(r"^[A-Z]{2}(>[0-9A-Z]+)*$").all()
    assert pl.read_csv(raw / "clicks_train.csv").columns == ["display_id", "ad_id", "clicked"]
    clicks = pl.read_csv(raw / "clicks_train.csv")
    per_display = clicks.group_by("display_id").agg(pl.col("clicked").sum(), pl.len(), pl.col("ad_id").n_unique())
    assert (per_display["clicked"] == 1).all() and per_display["len"].is_between(2, 12).all()
    assert (per_display["ad_id"] == per_display["len"]).all()  # an ad at most once per display
    entities = pl.read_csv(raw / "documents_entities.csv")
    assert entities["entity_id"].str.contains(r"^[0-9a-f]{32}$").all()
    assert entities["confidence_level"].is_between(0, 1).all()


def test_features_split_and_training_statistics(raw, dataset):
    spec = FeatureSpec.from_yaml(dataset)
    assert spec.onehot_features == ONEHOT and spec.multi_hot_features == MULTI_HOT
    assert spec.numerical_features == NUMERICAL and spec.group_feature == "display_id"
    train, test = SplitBinaryDataset(spec, "train"), SplitBinaryDataset(spec, "test")
    clicks = pl.read_csv(raw / "clicks_train.csv")
    events = pl.read_csv(raw / "events.csv", infer_schema=False).with_columns(
        pl.col("display_id", "timestamp").cast(pl.Int64)
    )
    assert len(train) + len(test) == len(clicks)
    displays = clicks["display_id"].to_numpy()
    draws = split_draw(displays, 0)
    trains = train_mask(raw, clicks)
    assert int(trains.sum()) == len(train)
    groups = test.groups()
    assert np.all(np.diff(groups) >= 0) and set(groups) == set(displays[~trains])  # whole displays, in order
    np.testing.assert_array_equal(train.labels(), clicks["clicked"].to_numpy()[trains])
    # the ad's CTR over training rows (min. 5 impressions); a training row's over the other folds' rows only,
    # its display's fold a fixed function of the display's draw
    ads, labels = clicks["ad_id"].to_numpy(), clicks["clicked"].to_numpy()
    folds = np.where(trains, np.minimum(((draws - EVAL_SHARE) / (1 - EVAL_SHARE) * CTR_FOLDS).astype(int),
                                        CTR_FOLDS - 1), -1)  # fmt: skip
    shown, clicked = {}, {}
    for a, y, f in zip(ads[trains], labels[trains], folds[trains]):
        for key in ((a, None), (a, f)):
            shown[key] = shown.get(key, 0) + 1
            clicked[key] = clicked.get(key, 0) + int(y)

    def ctr(a, fold):
        n = shown.get((a, None), 0) - (shown.get((a, fold), 0) if fold is not None else 0)
        c = clicked.get((a, None), 0) - (clicked.get((a, fold), 0) if fold is not None else 0)
        return c / n if n >= 5 else 0.0

    expected_train = [ctr(a, f) for a, f in zip(ads[trains], folds[trains])]
    got_train = np.asarray(train.slice(0, len(train)).numerical, dtype=np.float32)[:, NUMERICAL.index("ad_id_ctr")]
    np.testing.assert_allclose(got_train, expected_train, atol=1e-3)  # stored as float16
    order = np.argsort(displays[~trains], kind="stable")
    expected_test = np.array([ctr(a, None) for a in ads[~trains]])[order]
    got_test = np.asarray(test.slice(0, len(test)).numerical, dtype=np.float32)[:, NUMERICAL.index("ad_id_ctr")]
    np.testing.assert_allclose(got_test, expected_test, atol=1e-3)
    assert 0 < (got_test > 0).mean() < 1
    # each page's topics: the 3 most confident of its document, as ids of the sorted topic vocabulary
    topics = pl.read_csv(raw / "documents_topics.csv")
    vocab = {t: i + 1 for i, t in enumerate(sorted(topics["topic_id"].unique().to_list()))}
    doc_of = dict(zip(events["display_id"].to_list(), events["document_id"].cast(pl.Int64).to_list()))
    bags = train.slice(0, 40).multi_hot
    f = MULTI_HOT.index("topic_id_list")
    for b, display in enumerate(displays[trains][:40]):
        mine = topics.filter(pl.col("document_id") == doc_of[display]).sort(["confidence_level", "topic_id"],
                                                                              descending=[True, False])  # fmt: skip
        lo, hi = int(bags.offsets[f * 40 + b]), int(bags.offsets[f * 40 + b + 1])
        assert bags.ids[lo:hi].tolist() == [vocab[t] for t in mine["topic_id"].to_list()[:3]]


def test_topic_similarity_is_the_tfidf_cosine_of_page_and_ad_documents(raw, dataset):
    """Recomputed by hand from the raw files: each document's topics weighted by confidence x log(documents /
    documents with the topic), scaled to unit length; the similarity of a row is the dot product of its
    page's and its ad's document vectors (0 where either has no topics)."""
    topics = pl.read_csv(raw / "documents_topics.csv")
    n_docs = topics["document_id"].n_unique()
    df = dict(topics.group_by("topic_id").len().iter_rows())
    vectors: dict[int, dict[int, float]] = {}
    for doc, topic, confidence in topics.select("document_id", "topic_id", "confidence_level").iter_rows():
        vectors.setdefault(doc, {})[topic] = confidence * (np.log(n_docs) - np.log(df[topic]))
    for v in vectors.values():
        norm = np.sqrt(sum(w * w for w in v.values()))
        v.update({t: w / norm for t, w in v.items()})
    events = pl.read_csv(raw / "events.csv", infer_schema=False).with_columns(
        pl.col("display_id", "document_id").cast(pl.Int64)
    )
    page_doc = dict(events.select("display_id", "document_id").iter_rows())
    promo = pl.read_csv(raw / "promoted_content.csv")
    ad_doc = dict(promo.select("ad_id", "document_id").iter_rows())
    clicks = pl.read_csv(raw / "clicks_train.csv")
    trains = train_mask(raw, clicks)
    rows = clicks.filter(pl.Series(trains)).head(300)
    expected = []
    for display, ad in rows.select("display_id", "ad_id").iter_rows():
        a, b = vectors.get(page_doc[display], {}), vectors.get(ad_doc.get(ad), {})
        expected.append(sum(w * b[t] for t, w in a.items() if t in b))
    spec = FeatureSpec.from_yaml(dataset)
    got = np.asarray(SplitBinaryDataset(spec, "train").slice(0, 300).numerical, dtype=np.float32)
    got = got[:, NUMERICAL.index("document_id_document_id_promo_sim_topics")]
    np.testing.assert_allclose(got, expected, atol=2e-3)  # stored as float16
    assert 0.05 < (np.asarray(expected) > 0).mean() < 0.95  # the data has both kinds of row


def test_bad_rows_are_named_or_counted(raw, tmp_path, capsys):
    import shutil

    bad = tmp_path / "raw"
    shutil.copytree(raw, bad)
    lines = (bad / "events.csv").read_text().splitlines()
    fields = lines[7].split(",")
    fields[3] = "12x"
    lines[7] = ",".join(fields)
    (bad / "events.csv").write_text("\n".join(lines) + "\n")
    code, _, err = run_cli("preprocess", "outbrain", bad, "--out", tmp_path / "d", "--no-progress", capsys=capsys)
    assert code == 2 and "events.csv:8: timestamp: expected an integer, got '12x'" in err and "Traceback" not in err
    assert not (tmp_path / "d").exists()
    code, out, _ = run_cli("preprocess", "outbrain", bad, "--out", tmp_path / "d", "--no-progress", "--bad-rows",
                           "skip", capsys=capsys)  # fmt: skip
    shown = pl.read_csv(raw / "clicks_train.csv").filter(pl.col("display_id") == int(fields[0])).height
    assert code == 0 and f" {1 + shown} bad rows dropped" in out  # the event, and its display's clicks rows
    shutil.copy(raw / "events.csv", bad / "events.csv")
    (bad / "page_views.csv").write_text((bad / "page_views.csv").read_text() + "u1,notanumber,1,1,US,1\n")
    code, _, err = run_cli("preprocess", "outbrain", bad, "--out", tmp_path / "e", "--no-progress", capsys=capsys)
    views = len((raw / "page_views.csv").read_text().splitlines()) + 1
    assert code == 2 and f"page_views.csv:{views}: document_id: expected an integer, got 'notanumber'" in err


@pytest.mark.parametrize("how, said", [
    ("lone CR", "events.csv:1: lines end in a lone carriage return"),
    ("UTF-16", "events.csv:1: the file is UTF-16 (it starts with a UTF-16 byte-order mark); expected UTF-8"),
    ("Latin-1", "events.csv:1: the header holds bytes that are not UTF-8"),
    ("empty", "events.csv: holds no header"),
    ("semicolons", "names separated by ';': this command reads files separated by ',' only"),
])  # fmt: skip
def test_a_file_the_table_reader_refuses_is_refused_alike(raw, tmp_path, capsys, how, said):
    """The Outbrain files' headers are read by the rules of a user's table (``table_reader``): one line naming the
    file and what to do, exit status 2, nothing written."""
    import shutil

    bad = tmp_path / "raw"
    shutil.copytree(raw, bad)
    text = (bad / "events.csv").read_bytes()
    broken = {"lone CR": text.replace(b"\n", b"\r"), "UTF-16": text.decode().encode("utf-16"), "empty": b"",
              "semicolons": text.replace(b",", b";"),
              "Latin-1": text.replace(b"display_id", "d\xefsplay_id".encode("latin-1"), 1)}[how]  # fmt: skip
    (bad / "events.csv").write_bytes(broken)
    code, _, err = run_cli("preprocess", "outbrain", bad, "--out", tmp_path / "d", "--no-progress", capsys=capsys)
    assert code == 2 and said in err and len(err.strip().splitlines()) == 1 and len(err) < 400, err[:500]
    assert not (tmp_path / "d").exists()


def test_a_training_rows_ctr_features_do_not_see_its_displays_labels(raw, dataset, tmp_path):
    """Moving the click of one training display to another of its ads changes no CTR feature of that display's
    rows (each training row's statistics come from the other folds, and a display lies in one fold); with
    the row's own click left out instead, the clicked row's CTR would sit below its siblings' and give the
    label away."""
    import shutil

    spec = FeatureSpec.from_yaml(dataset)
    train = SplitBinaryDataset(spec, "train")
    clicks = pl.read_csv(raw / "clicks_train.csv")
    displays = clicks["display_id"].to_numpy()
    trains = train_mask(raw, clicks)
    display = int(displays[trains][0])
    ctr_columns = [NUMERICAL.index(n) for n in NUMERICAL if n.endswith("_ctr")]
    moved = tmp_path / "raw"
    shutil.copytree(raw, moved)
    mine = clicks["display_id"] == display
    clicked = clicks["clicked"].to_numpy().copy()
    rows = np.flatnonzero(mine.to_numpy())
    clicked[rows] = np.roll(clicked[rows], 1)
    assert not np.array_equal(clicked, clicks["clicked"].to_numpy())
    clicks.with_columns(pl.Series("clicked", clicked)).write_csv(moved / "clicks_train.csv")
    assert run_cli("preprocess", "outbrain", moved, "--out", tmp_path / "d", "--no-progress")[0] == 0
    after = SplitBinaryDataset(FeatureSpec.from_yaml(tmp_path / "d"), "train")
    at = np.flatnonzero(displays[trains] == display)
    before_ctr = np.asarray(train.slice(0, len(train)).numerical, dtype=np.float32)[at][:, ctr_columns]
    after_ctr = np.asarray(after.slice(0, len(after)).numerical, dtype=np.float32)[at][:, ctr_columns]
    np.testing.assert_array_equal(after_ctr, before_ctr)
    assert not np.array_equal(after.labels()[at], train.labels()[at])


def test_ctr_folds_below_two_is_refused(raw, tmp_path, capsys):
    code, _, err = run_cli("preprocess", "outbrain", raw, "--out", tmp_path / "d", "--ctr-folds", "1",
                           "--no-progress", capsys=capsys)  # fmt: skip
    assert code == 2 and "--ctr-folds: expected an integer from 2 to 1000, got '1'" in err and "Traceback" not in err
    assert not (tmp_path / "d").exists()


def _files(directory):
    """Every file of a dataset but summary.json (its timings differ), as bytes by relative path."""
    return {p.relative_to(directory): p.read_bytes() for p in sorted(directory.rglob("*"))
            if p.is_file() and p.name != "summary.json"}  # fmt: skip


def test_the_blocks_the_clicks_go_through_in_do_not_change_the_dataset(raw, dataset, tmp_path):
    """The clicks rows go through in blocks: blocks of 700 rows, and a file whose displays come in another
    order, write the same bytes as one block of the file in display order."""
    import shutil

    from ctrkit.preprocess.outbrain import preprocess_outbrain

    whole = _files(dataset)
    assert len(pl.read_csv(raw / "clicks_train.csv")) > 5 * 700
    preprocess_outbrain(raw, tmp_path / "blocks", progress=False, block_rows=700)
    assert _files(tmp_path / "blocks") == whole
    shuffled = tmp_path / "raw"
    shutil.copytree(raw, shuffled)
    clicks = pl.read_csv(raw / "clicks_train.csv")
    displays = clicks["display_id"].unique().to_numpy()
    rank = dict(zip(displays.tolist(), np.random.default_rng(0).permutation(len(displays)).tolist()))
    moved = clicks.with_columns(pl.col("display_id").replace_strict(rank).alias("r")).sort("r", maintain_order=True)
    assert not moved["display_id"].equals(clicks["display_id"])
    moved.drop("r").write_csv(shuffled / "clicks_train.csv")
    preprocess_outbrain(shuffled, tmp_path / "moved", progress=False, block_rows=700)
    assert _files(tmp_path / "moved") == whole


def test_bad_clicks_rows_are_named_by_line_in_any_block(raw, tmp_path, capsys):
    import shutil

    bad = tmp_path / "raw"
    shutil.copytree(raw, bad)
    lines = (bad / "clicks_train.csv").read_text().splitlines()
    fields = lines[2500].split(",")  # line 2501, in the fourth block of 700 rows
    lines[2500] = ",".join([fields[0], "7y", fields[2]])
    lines[3000] = ",".join(lines[3000].split(",")[:2] + ["2"])  # line 3001: a label other than 0 and 1
    lines[4000] = ",".join(["99999999"] + lines[4000].split(",")[1:])  # line 4001: a display not in events.csv
    (bad / "clicks_train.csv").write_text("\n".join(lines) + "\n")
    from ctrkit.preprocess.outbrain import preprocess_outbrain
    from ctrkit.preprocess.outbrain_files import OutbrainRecipe

    with pytest.raises(Exception, match=r"clicks_train.csv:2501: ad_id: expected an integer, got '7y'"):
        preprocess_outbrain(bad, tmp_path / "d", progress=False, block_rows=700)
    assert not (tmp_path / "d").exists()
    lines[2500] = ",".join(fields)
    (bad / "clicks_train.csv").write_text("\n".join(lines) + "\n")
    code, _, err = run_cli("preprocess", "outbrain", bad, "--out", tmp_path / "d", "--no-progress", capsys=capsys)
    assert (
        code == 2
        and "clicks_train.csv:3001: clicked: expected a label of 0 or 1 (or 1.0/0.0, true/false), got '2'" in err
        and "Traceback" not in err
    )
    lines[3000] = ",".join(lines[3000].split(",")[:2] + ["0"])
    (bad / "clicks_train.csv").write_text("\n".join(lines) + "\n")
    with pytest.raises(Exception, match=r"clicks_train.csv:4001: display_id 99999999 is not in events.csv"):
        preprocess_outbrain(bad, tmp_path / "d", progress=False, block_rows=700)
    lines[2500] = ",".join([fields[0], "7y", fields[2]])
    lines[3000] = ",".join(lines[3000].split(",")[:2] + ["2"])
    (bad / "clicks_train.csv").write_text("\n".join(lines) + "\n")
    summary = preprocess_outbrain(bad, tmp_path / "d", OutbrainRecipe(bad_rows="skip"), progress=False, block_rows=700)
    assert summary["bad_rows"] == 3 and summary["clicks_rows_read"] == len(lines) - 1
    assert sum(summary["rows"].values()) == len(lines) - 1 - 3
    assert [r["line_no"] for r in summary["bad_row_examples"]] == [2501, 3001]


def test_files_with_only_a_header_leave_their_features_missing(raw, tmp_path):
    """No promoted content, documents or topics: the ads' advertisers, campaigns and documents, the pages'
    sources and the topics are all missing (id 0, cardinality 1), the CTRs of those keys 0; the ad's own
    CTR is still there."""
    import shutil

    from ctrkit.preprocess.outbrain import preprocess_outbrain

    bare = tmp_path / "raw"
    shutil.copytree(raw, bare)
    for name in ("promoted_content", "documents_meta", "documents_topics"):
        header = (bare / f"{name}.csv").read_text().splitlines()[0]
        (bare / f"{name}.csv").write_text(header + "\n")
    summary = preprocess_outbrain(bare, tmp_path / "d", progress=False, block_rows=1000)
    cards = summary["cardinalities"]
    for name in ("advertiser_id", "campaign_id", "document_id_promo", "source_id", "topic_id_list"):
        assert cards[name] == 1, name
    assert cards["ad_id"] > 1 and cards["entity_id_list"] > 1
    train = SplitBinaryDataset(FeatureSpec.from_yaml(tmp_path / "d"), "train")
    numerical = np.asarray(train.slice(0, len(train)).numerical, dtype=np.float32)
    assert (numerical[:, NUMERICAL.index("campaign_id_ctr")] == 0).all()
    assert (numerical[:, NUMERICAL.index("ad_id_ctr")] > 0).any()


def test_rows_with_another_number_of_fields_are_named_or_dropped(raw, tmp_path, capsys):
    """A row with more or fewer comma-separated fields than the header (a value holding a comma, a field left
    out) would put values in the wrong columns: it is named by file and line, or dropped and counted."""
    import shutil

    from ctrkit.preprocess.outbrain import preprocess_outbrain
    from ctrkit.preprocess.outbrain_files import OutbrainRecipe

    bad = tmp_path / "raw"
    shutil.copytree(raw, bad)
    events = (bad / "events.csv").read_text().splitlines()
    events[11] += ",US"  # line 12: a seventh field
    (bad / "events.csv").write_text("\n".join(events) + "\n")
    code, _, err = run_cli("preprocess", "outbrain", bad, "--out", tmp_path / "d", "--no-progress", capsys=capsys)
    assert code == 2 and "events.csv:12: expected 6 comma-separated fields, found 7" in err and "Traceback" not in err
    shutil.copy(raw / "events.csv", bad / "events.csv")
    clicks = (bad / "clicks_train.csv").read_text().splitlines()
    clicks[2999] += ",1"  # line 3000, in the fifth block of 700 rows: a fourth field
    clicks[3999] = clicks[3999].rsplit(",", 1)[0]  # line 4000: the label left out
    (bad / "clicks_train.csv").write_text("\n".join(clicks) + "\n")
    with pytest.raises(Exception, match=r"clicks_train.csv:3000: expected 3 comma-separated fields, found 4"):
        preprocess_outbrain(bad, tmp_path / "d", progress=False, block_rows=700)
    summary = preprocess_outbrain(bad, tmp_path / "d", OutbrainRecipe(bad_rows="skip"), progress=False, block_rows=700)
    assert summary["bad_rows"] == 2 and sum(summary["rows"].values()) == len(clicks) - 1 - 2
    assert [(r["line_no"], r["problem"]) for r in summary["bad_row_examples"]] == [
        (3000, "expected 3 comma-separated fields, found 4"),
        (4000, "expected 3 comma-separated fields, found 2"),
    ]


def test_raw_id_columns_keep_the_files_integer_ids(raw, dataset, tmp_path, capsys):
    out = tmp_path / "raw_ids"
    code, _, err = run_cli("preprocess", "outbrain", raw, "--out", out, "--raw-ids", "ad_id,document_id",
                           "--capacity", "500", "--no-progress", capsys=capsys)  # fmt: skip
    assert code == 0, err
    spec, plain = FeatureSpec.from_yaml(out), FeatureSpec.from_yaml(dataset)
    assert spec.dynamic_features == ("document_id", "ad_id") and spec.feature_spec["ad_id"].cardinality == 500
    clicks = pl.read_csv(raw / "clicks_train.csv")
    trains = train_mask(raw, clicks)
    train = SplitBinaryDataset(spec, "train")
    ads = train.slice(0, len(train)).categorical[:, ONEHOT.index("ad_id")].numpy()
    np.testing.assert_array_equal(ads, clicks["ad_id"].to_numpy()[trains])  # in the clicks file's order
    # the other columns, the numerical features and labels are the vocabulary dataset's
    other = SplitBinaryDataset(plain, "train")
    a, b = train.slice(0, len(train)), other.slice(0, len(other))
    keep = [i for i, n in enumerate(ONEHOT) if n not in ("ad_id", "document_id")]
    assert np.array_equal(a.categorical[:, keep].numpy(), b.categorical[:, keep].numpy())
    assert np.array_equal(a.numerical.numpy(), b.numerical.numpy()) and np.array_equal(a.labels, b.labels)
    code, _, err = run_cli("preprocess", "outbrain", raw, "--out", tmp_path / "bad", "--raw-ids", "geo_location",
                           "--no-progress", capsys=capsys)  # fmt: skip
    assert code == 2 and "geo_location values are text" in err
