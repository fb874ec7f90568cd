"""`train --tensorboard DIR`: the event files, read back with TensorBoard's own reader, hold the JSON
log's scalars at the same steps."""

import json

import pytest

from tests.conftest import run_cli, small_model_flags

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402


def test_tensorboard_scalars_equal_the_json_log(tiny_dataset, tmp_path, capsys):
    log, board = tmp_path / "log.jsonl", tmp_path / "tb"
    code, _, err = run_cli("train", "--dataset", tiny_dataset, "--epochs", "2", "--batch-size", "512",
                           "--print-freq", "10", "--no-progress", "--log-path", log, "--tensorboard", board,
                           *small_model_flags(), capsys=capsys)  # fmt: skip
    assert code == 0, err
    records = [json.loads(line) for line in log.read_text().splitlines()]
    expected: dict[str, list[tuple[int, float]]] = {}
    for r in records:
        if r["event"] == "train":
            for name in ("loss", "lr", "samples_per_s"):
                expected.setdefault(f"train/{name}", []).append((r["step"], r[name]))
        elif r["event"] in ("eval", "test"):
            for name in ("auc", "logloss"):
                expected.setdefault(f"{r['mapping']}/{name}", []).append((r["step"], r[name]))
    assert {"train/loss", "validation/auc", "test/auc"} <= set(expected)
    assert len(expected["validation/auc"]) >= 2 and len(expected["test/auc"]) == 1

    events = EventAccumulator(str(board), size_guidance={"scalars": 0})  # 0: keep every point
    events.Reload()
    assert sorted(events.Tags()["scalars"]) == sorted(expected)
    for tag, points in expected.items():
        got = [(e.step, e.value) for e in events.Scalars(tag)]
        assert [s for s, _ in got] == [s for s, _ in points], tag
        assert [v for _, v in got] == pytest.approx([v for _, v in points], rel=1e-6), tag  # stored as float32


def test_a_seed_ensemble_writes_each_member_as_a_run_of_its_own(tiny_dataset, tmp_path, capsys):
    log, board = tmp_path / "log.jsonl", tmp_path / "tb"
    code, _, err = run_cli("train", "--dataset", tiny_dataset, "--epochs", "1", "--batch-size", "4096",
                           "--seed-ensemble", "2", "--seed", "5", "--no-progress", "--log-path", log, "--tensorboard",
                           board, *small_model_flags(), capsys=capsys)  # fmt: skip
    assert code == 0, err
    records = [json.loads(line) for line in log.read_text().splitlines()]
    # 5 batches of 4,096 an epoch: small data, so each seed also trains at the unset --small-batch, 512
    runs = ((0, "seed5"), (1, "seed5-batch512"), (2, "seed6"), (3, "seed6-batch512"))
    assert sorted(p.name for p in board.iterdir() if p.is_dir()) == sorted(name for _, name in runs)
    for member, name in runs:  # each member's validation curve in DIR/seed<N>[-batch<B>], as the log has it
        want = [(r["step"], r["auc"]) for r in records if r["event"] == "eval" and r.get("member") == member]
        events = EventAccumulator(str(board / name), size_guidance={"scalars": 0})
        events.Reload()
        got = [(e.step, e.value) for e in events.Scalars("validation/auc")]
        assert [s for s, _ in got] == [s for s, _ in want] and len(want) >= 2
        assert [v for _, v in got] == pytest.approx([v for _, v in want], rel=1e-6)
        assert "test/auc" not in events.Tags()["scalars"]
    test = next(r for r in records if r["event"] == "test")
    events = EventAccumulator(str(board), size_guidance={"scalars": 0})  # the run's own: the test, once
    events.Reload()
    assert [e.value for e in events.Scalars("test/auc")] == pytest.approx([test["auc"]], rel=1e-6)
