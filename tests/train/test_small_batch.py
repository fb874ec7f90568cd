"""``--small-batch``: on small data each member is also trained at a smaller batch, and the batch whose kept
model scores the higher validation AUC is kept. Checked against the runs of each batch trained on their own,
the tie rule, the unset default, resume inside the small-batch member, and the errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from ctrkit.checkpoint import load_checkpoint
from ctrkit.data.dataset import SplitBinaryDataset
from ctrkit.eval.evaluator import predict_logits
from ctrkit.train.plan import MIN_SMALL_BATCH, SMALL_BATCH_STEPS, SMALL_EPOCH, default_small_batch
from ctrkit.train.run import Run, resolve_run, train
from tests.conftest import Interrupted, run_cli, small_model_flags, stop_after_save

MODEL = dict(embedding_dim=8, bottom_mlp=(32, 8), top_mlp=(32, 1))
# 19,440 training rows: 10 batches of 2,048 an epoch, 19 of 1,024
SMALL = dict(**MODEL, batch_size=2048, epochs=2, evals_per_epoch=2, early_stopping_patience=0, plateau_patience=0,
             snapshot_ensemble=1, seed_ensemble=1, progress=False)  # fmt: skip
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def runs(tiny_dataset, tmp_path_factory):
    where = tmp_path_factory.mktemp("batches")
    both = train(tiny_dataset, "dlrm", seed=3, small_batch=1024, save_checkpoint=where / "b.pt",
                 log_path=where / "log.jsonl", **SMALL)  # fmt: skip
    alone = {b: train(tiny_dataset, "dlrm", seed=3, small_batch=0, save_checkpoint=where / f"{b}.pt",
                      **{**SMALL, "batch_size": b}) for b in (2048, 1024)}  # fmt: skip
    return both, alone, where


def test_each_batch_is_its_own_run_and_validation_picks_one(runs, tiny_dataset):
    both, alone, where = runs
    ckpt = load_checkpoint(where / "b.pt")
    assert [(m["seed"], m["batch_size"]) for m in ckpt.members] == [(3, 2048), (3, 1024)]
    assert [m["steps"] for m in both["members"]] == [20, 38]  # 2 epochs of 10 and of 19 batches
    for member, b in zip(ckpt.members, (2048, 1024)):  # the same training as the batch's own run
        assert member["best_step"] == alone[b]["best_step"]
        np.testing.assert_array_equal(
            next(iter(member["models"][0].values())).numpy(),
            next(iter(load_checkpoint(where / f"{b}.pt").model.values())).numpy(),
        )
    scores = {b: alone[b]["validation"]["auc"] for b in alone}
    assert scores[2048] != scores[1024]  # the choice is decided by the data, not by the tie rule
    want = max(scores, key=scores.get)
    assert both["batch_size"] == want and both["validation"]["auc"] == scores[want]
    assert both["auc"] == pytest.approx(alone[want]["auc"], abs=1e-7) and "single" not in both
    test = SplitBinaryDataset(tiny_dataset, "test")
    got = predict_logits(ckpt.build_model(), test, CPU)  # what evaluate, export and serve load
    np.testing.assert_allclose(got, predict_logits(load_checkpoint(where / f"{want}.pt").build_model(), test, CPU),
                               rtol=0, atol=1e-6)  # fmt: skip
    records = [json.loads(line) for line in (where / "log.jsonl").read_text().splitlines()]
    event = next(r for r in records if r["event"] == "seed_ensemble")
    assert event["batch_size"] == want
    assert [(b["batch_size"], b["auc"]) for b in event["batches"]] == [(2048, scores[2048]), (1024, scores[1024])]
    assert [r["config"]["batch_size"] for r in records if r["event"] == "start"] == [2048, 1024]
    from ctrkit.cli.train import summary_line

    line = summary_line(both)
    assert line.startswith("done: 2 models (--small-batch) of 20 / 38 steps; ")
    assert f"kept step {both['best_step']} of the batch-{want} model" in line


def test_a_tie_keeps_the_runs_batch(tiny_dataset):
    # min_delta 1: no gain counts, so both batches keep the same warm-start regression: equal scores
    got = train(tiny_dataset, "dlrm", seed=3, small_batch=1024, **{**SMALL, "epochs": 1, "min_delta": 1.0})
    assert [m["batch_size"] for m in got["members"]] == [2048, 1024]
    assert got["members"][0]["validation_auc"] == got["members"][1]["validation_auc"]
    assert got["batch_size"] == 2048 and got["best_step"] == 0


def test_unset_tries_a_small_batch_only_on_small_data(tiny_dataset):
    assert default_small_batch(4056) == 64 and default_small_batch(4138) == 128  # rows / 32 = 126.75, 129.3
    assert default_small_batch(9000) == 256 and default_small_batch(100) == MIN_SMALL_BATCH
    assert all(default_small_batch(n) * SMALL_BATCH_STEPS <= n for n in (1024, 5000, 9999))

    def run(**train_options):
        return Run(resolve_run(tiny_dataset, "dlrm", model_config=MODEL, train=train_options, progress=False))

    rows = 19_440
    small = run(batch_size=4096)  # 5 batches an epoch
    assert -(-rows // 4096) < SMALL_EPOCH and small.batches == [4096, default_small_batch(rows)] == [4096, 512]
    assert small.members == 2 and "at batch 4096 and at 512 (--small-batch)" in small.describe()
    assert "4,096 and 512, the better kept" in small.plan.text()
    mid = run(batch_size=2048)  # 10 batches an epoch: not small
    assert mid.batches == [2048] and mid.members == 1 and "(--small-batch)" not in mid.describe()
    assert run(batch_size=4096, small_batch=0).batches == [4096]
    assert run(batch_size=2048, small_batch=256).batches == [2048, 256]  # given: whatever the data's size
    assert run(batch_size=4096, validation_fraction=0).batches == [4096]  # no validation: nothing to choose by


def test_bad_small_batch_is_one_line_and_exit_2(tiny_dataset, capsys):
    base = ["train", "--dataset", tiny_dataset, *small_model_flags(), "--no-progress", "--max-steps", "1"]
    code, _, err = run_cli(*base, "--batch-size", "2048", "--small-batch", "2048", capsys=capsys)
    assert code == 2 and "--small-batch 2048: expected a batch size below the run's, 2048" in err
    assert len(err.strip().splitlines()) == 1
    code, _, err = run_cli(*base, "--small-batch", "256", "--validation-fraction", "0", capsys=capsys)
    assert code == 2 and "--small-batch 256: a second batch size cannot be planned: it needs validation data" in err


def test_resume_inside_the_small_batch_member_gives_the_uninterrupted_result(runs, tiny_dataset, tmp_path):
    both, _, _ = runs
    path = tmp_path / "r.pt"
    with stop_after_save(member=1, step=10), pytest.raises(Interrupted):  # the batch-1024 member's, step 10 or later
        train(tiny_dataset, "dlrm", seed=3, small_batch=1024, save_checkpoint=path, checkpoint_every=10, **SMALL)
    mid = load_checkpoint(path)
    assert mid.member == 1 and [m["batch_size"] for m in mid.members] == [2048] and 10 <= mid.step < 38
    resumed = train(tiny_dataset, "dlrm", seed=3, small_batch=1024, load_checkpoint=path, save_checkpoint=path,
                    **SMALL)  # fmt: skip
    for key in ("auc", "logloss", "best_step", "batch_size", "member_ensemble", "members"):
        assert resumed[key] == both[key], key
    with pytest.raises(ValueError, match=r"trained at batch sizes \[2048, 1024\], this run takes turns over \[2048\]"):
        train(tiny_dataset, "dlrm", seed=3, small_batch=0, load_checkpoint=path, **SMALL)


def test_a_seed_ensemble_saved_before_small_batch_resumes_at_its_one_batch(tiny_dataset, tmp_path):
    from dataclasses import replace

    from ctrkit.checkpoint import save_checkpoint

    options = {**SMALL, "batch_size": 4096, "epochs": 1, "seed_ensemble": 2}  # 5 batches an epoch: small data
    path = tmp_path / "old.pt"
    before = train(tiny_dataset, "dlrm", seed=3, small_batch=0, save_checkpoint=path, **options)
    ckpt = load_checkpoint(path)  # as a checkpoint written before members recorded their batch
    old = [{k: v for k, v in m.items() if k != "batch_size"} for m in ckpt.members]
    save_checkpoint(path, replace(ckpt, members=old))
    again = train(tiny_dataset, "dlrm", seed=3, load_checkpoint=path, **options)  # small_batch unset: 512 here
    assert again["auc"] == before["auc"] and again["member_ensemble"] == before["member_ensemble"]
    assert [m["steps"] for m in again["members"]] == [5, 5]
