"""A new day on a model's own vocabulary: `preprocess table --like CHECKPOINT` keeps every value's id and gives the
values the model has not seen new ids after its own; `train --continue-from` grows the model's tables for them,
its learned rows (and their optimizer states) kept in place; the model's old data and a new day refuse to mix in
silence."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from ctrkit.checkpoint import load_checkpoint
from ctrkit.data.feature_spec import FeatureSpec
from ctrkit.data.split_binary import open_mapping
from ctrkit.data.synthetic_clicks import click_log
from ctrkit.models.growth import table_rows
from ctrkit.models.registry import create_model, make_config
from ctrkit.models.storage import DEFERRED
from tests.conftest import run_cli, small_model_flags

FLAGS = ["--label", "clicked", "--order-by", "ts", "--no-progress"]


def _days(tmp_path):
    """Monday's log, and Tuesday's with ads Monday never showed (six of them, each often enough for an id of its
    own, one seen once: rare)."""
    monday = click_log(3000, 0)
    tuesday = click_log(3000, 1, first_row=3000)
    new_ads = [f"ad_new_{i % 6}" for i in range(60)] + ["ad_once"]
    tuesday = tuesday.with_columns(
        pl.when(pl.int_range(pl.len()) < len(new_ads)).then(pl.Series(new_ads + [""] * (3000 - len(new_ads))))
        .otherwise(pl.col("ad_id")).alias("ad_id")
    )  # fmt: skip
    monday.write_csv(tmp_path / "mon.csv")
    tuesday.write_csv(tmp_path / "tue.csv")
    return tmp_path / "mon.csv", tmp_path / "tue.csv"


@pytest.fixture(scope="module")
def monday(tmp_path_factory):
    work = tmp_path_factory.mktemp("like")
    mon, tue = _days(work)
    assert run_cli("preprocess", "table", mon, "--out", work / "mon", "--integers", "categorical", *FLAGS)[0] == 0
    assert run_cli("train", "--dataset", work / "mon", "--max-steps", 30, "--batch-size", 256, "--optimizer", "adam",
                   "--save-checkpoint", work / "mon.pt", "--no-progress", *small_model_flags())[0] == 0  # fmt: skip
    return work, tue


def _vocab(dataset, column) -> dict[str, int]:
    v = pl.read_parquet(dataset / "vocab" / f"{column}.parquet")
    return dict(zip(v["value"].to_list(), v["id"].to_list()))


def test_a_new_day_keeps_every_values_id_and_numbers_new_ones_after(monday, capsys):
    work, tue = monday
    assert run_cli("preprocess", "table", tue, "--out", work / "tue", "--like", work / "mon.pt", *FLAGS)[0] == 0
    old, new = _vocab(work / "mon", "ad_id"), _vocab(work / "tue", "ad_id")
    assert all(new[v] == i for v, i in old.items() if i >= 2)  # every value with a learned row keeps its id
    first = 2 + sum(i >= 2 for i in old.values())  # the row after the model's last
    assert all(new[v] in (1, *range(first, 1000)) for v, i in old.items() if i == 1)  # rare ones: rare, or a new row
    assert {new[f"ad_new_{i}"] for i in range(6)} <= set(range(first, max(new.values()) + 1))
    assert len(set(new.values()) - {1}) == max(new.values()) - 1  # ids 2.. without a gap
    assert new["ad_once"] == 1  # seen once: the shared rare id
    mon_spec = load_checkpoint(work / "mon.pt").spec
    import yaml

    meta = yaml.safe_load((work / "tue" / "feature_spec.yaml").read_text())["metadata"]
    assert meta["extends_vocabulary"] == [mon_spec["vocabulary"]]
    # written with the model's preprocessing: the ids the carried transform gives the raw rows
    spec = FeatureSpec.from_yaml(work / "tue")
    ids = np.asarray(open_mapping(spec, "train").categorical[list(spec.onehot_features).index("ad_id")])
    assert {first + i for i in range(6)} <= set(ids.tolist())
    # the role flags are the model's: refused, naming them
    code, _, err = run_cli("preprocess", "table", tue, "--out", work / "x", "--like", work / "mon.pt",
                           "--categorical", "ad_id", *FLAGS, capsys=capsys)  # fmt: skip
    assert code == 2 and "--categorical: with --like the columns' roles are" in err
    # the old model cannot score the new day's ids: it says what to do instead
    code, _, err = run_cli("evaluate", "--checkpoint", work / "mon.pt", "--dataset", work / "tue", capsys=capsys)
    assert code == 2 and "extends the checkpoint's vocabularies" in err and "predict --input" in err


def test_continuing_grows_the_tables_and_keeps_the_learned_rows(monday):
    """With every rate 1e-30 (0 is refused; a step then moves no weight by more than 1e-20), the continued model's
    tables hold the model's rows where they were, each feature's new rows
    after them (first-order rows at 0), and the optimizer states grew with them."""
    work, tue = monday
    if not (work / "tue").exists():
        assert run_cli("preprocess", "table", tue, "--out", work / "tue", "--like", work / "mon.pt", *FLAGS)[0] == 0
    assert run_cli("train", "--dataset", work / "tue", "--continue-from", work / "mon.pt", "--max-steps", 3,
                   "--batch-size", 256, "--optimizer", "adam", "--lr", 1e-30, "--embedding-lr", 1e-30,
                   "--wide-lr", 1e-30, "--save-checkpoint", work / "tue.pt", "--no-progress")[0] == 0  # fmt: skip
    mon, tue_ckpt = load_checkpoint(work / "mon.pt"), load_checkpoint(work / "tue.pt")
    before = table_rows(create_model(mon.model_name, make_config(mon.model_name, mon.model_config), DEFERRED))
    after = table_rows(create_model(tue_ckpt.model_name, make_config(tue_ckpt.model_name, tue_ckpt.model_config),
                                    DEFERRED))  # fmt: skip
    grew = [name for name in before if before[name] != after[name]]
    assert grew and all(sum(after[n]) > sum(before[n]) for n in grew)
    for name in before:
        old, new = mon.model[name], tue_ckpt.model[name]
        at_old = at_new = 0
        for a, b in zip(before[name], after[name]):
            assert close(old[at_old : at_old + a], new[at_new : at_new + a]), name  # learned rows in place
            if "wide" in name and b > a:
                assert float(new[at_new + a : at_new + b].abs().max()) < 1e-20  # new first-order rows: 0
            at_old, at_new = at_old + a, at_new + b
    for name, p in mon.model.items():  # the rest of the model as it was (every rate 0)
        if name not in before:
            assert close(p, tue_ckpt.model[name]), name
    # the per-row optimizer states grew with their tables
    sizes = {tuple(v.shape) for opt in tue_ckpt.optimizers for s in opt["state"].values() for v in s.values()
             if hasattr(v, "shape") and v.dim()}  # fmt: skip
    assert any(shape[0] == sum(after[n]) for n in grew for shape in sizes)


def close(a, b) -> bool:
    import torch

    return a.shape == b.shape and bool(torch.allclose(a.float(), b.float(), rtol=0, atol=1e-20))


def test_other_vocabularies_are_never_used_in_silence(monday, capsys):
    work, tue = monday
    assert run_cli("preprocess", "table", tue, "--out", work / "own", "--integers", "categorical", *FLAGS)[0] == 0
    code, _, err = run_cli("train", "--dataset", work / "own", "--continue-from", work / "mon.pt", "--max-steps", 2,
                           "--no-progress", capsys=capsys)  # fmt: skip
    assert code == 2 and "preprocess table --like CHECKPOINT" in err  # refused, saying how to keep the meanings
    # the same values, each ad's name given to another ad: other ids, the same table sizes; allowed when asked,
    # never in silence
    mon = pl.read_csv(work / "mon.csv")
    ads = sorted(set(mon["ad_id"].to_list()))
    moved = dict(zip(ads, ads[1:] + ads[:1]))
    mon.with_columns(pl.col("ad_id").replace_strict(moved)).write_csv(work / "moved.csv")
    assert run_cli("preprocess", "table", work / "moved.csv", "--out", work / "moved", "--integers", "categorical",
                   *FLAGS)[0] == 0  # fmt: skip
    code, _, err = run_cli("train", "--dataset", work / "moved", "--continue-from", work / "mon.pt", "--max-steps", 2,
                           "--no-progress", capsys=capsys)  # fmt: skip
    assert code == 2 and "other vocabularies than the checkpoint's" in err
    code, _, err = run_cli("train", "--dataset", work / "moved", "--continue-from", work / "mon.pt", "--max-steps", 2,
                           "--optimizer", "adam", "--allow-other-vocabulary", "--no-progress",
                           capsys=capsys)  # fmt: skip
    assert code == 0 and "warning:" in err and "each learned row now stands for whatever value" in err


def test_a_later_day_without_a_column_the_model_reads_names_it_and_no_flag_preprocess_lacks(monday, capsys):
    work, tue = monday
    pl.read_csv(tue).drop("country").write_csv(work / "no_country.csv")
    code, _, err = run_cli("preprocess", "table", work / "no_country.csv", "--out", work / "no_country", "--like",
                           work / "mon.pt", *FLAGS, capsys=capsys)  # fmt: skip
    assert code == 2 and "no column 'country'" in err and "holds every column it reads" in err, err
    assert "--missing-columns" not in err  # a flag of predict and serve, not of preprocess
