"""Seed ensembles (``--seed-ensemble``): each member is the run of its seed, the kept model the mean of the
members' logits (checked against the members trained on their own), exact resume inside a member, the
default on small data, and the ensemble through evaluate and export."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from ctrkit.checkpoint import load_checkpoint
from ctrkit.data.dataset import SplitBinaryDataset
from ctrkit.eval.evaluator import predict_logits
from ctrkit.metrics import roc_auc
from ctrkit.models.ensemble import Ensemble
from ctrkit.train.run import train
from tests.conftest import Interrupted, run_cli, stop_after_save

# small enough to train three times in seconds; snapshot pools of 2 so members may be ensembles themselves
SMALL = dict(embedding_dim=8, bottom_mlp=(32, 8), top_mlp=(32, 1), batch_size=2048, epochs=2, evals_per_epoch=2,
             early_stopping_patience=0, plateau_patience=0, snapshot_ensemble=2, progress=False)  # fmt: skip
CPU = torch.device("cpu")


def states_equal(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0, msg=k)


@pytest.fixture(scope="module")
def runs(tiny_dataset, tmp_path_factory):
    where = tmp_path_factory.mktemp("seeds")
    together = train(tiny_dataset, "dlrm", seed=3, seed_ensemble=2, save_checkpoint=where / "e.pt",
                     log_path=where / "log.jsonl", **SMALL)  # fmt: skip
    alone = [train(tiny_dataset, "dlrm", seed=s, seed_ensemble=1, save_checkpoint=where / f"s{s}.pt", **SMALL)
             for s in (3, 4)]  # fmt: skip
    return together, alone, where


def test_members_are_their_seeds_runs_and_the_kept_model_is_their_mean(runs, tiny_dataset):
    together, alone, where = runs
    ckpt = load_checkpoint(where / "e.pt")
    assert [m["seed"] for m in ckpt.members] == [3, 4] and ckpt.member == 1
    test = SplitBinaryDataset(tiny_dataset, "test")
    labels = test.labels()
    member_logits = []
    for member, result, s in zip(ckpt.members, alone, (3, 4)):
        single = load_checkpoint(where / f"s{s}.pt")
        assert member["best_step"] == result["best_step"]
        kept = single.build_model()
        states = [m.state_dict() for m in kept.members] if isinstance(kept, Ensemble) else [kept.state_dict()]
        assert len(states) == len(member["models"])
        for got, want in zip(member["models"], states):  # the same training, the same kept weights
            states_equal(got, want)
        member_logits.append(predict_logits(kept, test, CPU).astype(np.float64))
        assert result["auc"] == pytest.approx(roc_auc(labels, member_logits[-1]), abs=1e-7)
    model = ckpt.build_model()
    # on this data validation prefers the mean of the two members' logits (the first member alone: below)
    assert together["member_ensemble"] == [3, 4] and ckpt.member_ensemble == [0, 1]
    want = np.mean(member_logits, axis=0)
    assert isinstance(model, Ensemble) and together["single"]["auc"] == pytest.approx(alone[0]["auc"], abs=1e-7)
    got = predict_logits(model, test, CPU).astype(np.float64)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    assert together["auc"] == pytest.approx(roc_auc(labels, want), abs=1e-6)
    from ctrkit.cli.train import summary_line

    line = summary_line(together)
    assert line.startswith("done: 2 models (--seed-ensemble) of 20 / 20 steps; ")
    assert "kept the mean of the models of seeds 3, 4 (their best steps" in line and "seed 3's model alone" in line
    assert together["models_per_request"] == ckpt.models_averaged >= 2
    gain = together["validation"]["auc"] - together["single_validation"]["auc"]
    assert f"the ensemble gained {gain:+.4f} validation AUC over its best single model" in line
    assert f"each request to it runs {ckpt.models_averaged} models" in line
    records = [json.loads(line) for line in (where / "log.jsonl").read_text().splitlines()]
    assert {r.get("member") for r in records if r["event"] == "eval"} == {0, 1}  # each member's own records
    # the first-order regression is fitted once: the second member takes the first's (and ends with the same
    # weights as seed 4 alone, which fitted its own: above)
    fits = [r for r in records if r["event"] == "warm_start"]
    assert [(r["member"], r.get("reused", False)) for r in fits] == [(0, False), (1, True)]
    assert fits[1]["C"] == fits[0]["C"] and fits[1]["validation_auc"] == fits[0]["validation_auc"]
    run_records = [r for r in records if r.get("member") is None]  # one test score, after the mean's calibration
    assert [r["event"] for r in run_records] == ["seed_ensemble", "calibration", "test"]
    assert run_records[0]["selected"] == (together["member_ensemble"] == [3, 4])


def test_evaluate_report_and_export_take_the_ensemble(runs, tiny_dataset, tmp_path, capsys):
    import onnxruntime as ort

    together, _, where = runs
    code, out, _ = run_cli("evaluate", "--checkpoint", where / "e.pt", "--dataset", tiny_dataset, capsys=capsys)
    assert code == 0 and f"AUC {together['auc']:.4f}" in out
    from ctrkit.report import build_report

    data = build_report(where / "e.pt", tmp_path / "report.html", dataset=tiny_dataset)
    assert data["final"]["seed_ensemble"] == together["member_ensemble"]
    code, _, _ = run_cli("export", "--checkpoint", where / "e.pt", "--format", "onnx", "--out", tmp_path / "x",
                         capsys=capsys)  # fmt: skip
    assert code == 0
    batch = SplitBinaryDataset(tiny_dataset, "test").slice(0, 64)
    session = ort.InferenceSession(str(tmp_path / "x" / "model.onnx"))
    names = [i.name for i in session.get_inputs()]
    feeds = {n: v for n, v in zip(names, (batch.numerical.numpy(), batch.categorical.numpy()))}
    got = session.run(None, feeds)[0].reshape(-1)
    logits = load_checkpoint(where / "e.pt").build_model()(batch.numerical, batch.categorical)
    np.testing.assert_allclose(got, torch.sigmoid(logits).detach().numpy(), rtol=1e-5, atol=1e-6)  # probabilities
    from ctrkit.serve.predictor import Predictor

    for store in ("memory", "mmap"):  # what `serve` answers with, either embedding store
        predictor = Predictor.from_checkpoint(where / "e.pt", embedding_store=store)
        served = predictor(batch.numerical.numpy(), batch.categorical.numpy())
        np.testing.assert_allclose(np.asarray(served).reshape(-1), torch.sigmoid(logits).detach().numpy(),
                                   rtol=1e-5, atol=1e-6, err_msg=store)  # fmt: skip
    code, _, err = run_cli("convert-checkpoint", "--checkpoint", where / "e.pt", "--out", tmp_path / "s.pt",
                           "--world-size", "2", capsys=capsys)  # fmt: skip
    assert code == 2 and "an ensemble of 2 models" in err


def test_the_first_member_is_kept_unless_validation_prefers_the_mean(tiny_dataset, tmp_path):
    # min_delta 1: no AUC gain counts, so each member keeps its warm start and the mean is never taken
    got = train(tiny_dataset, "dlrm", seed=3, seed_ensemble=2, save_checkpoint=tmp_path / "f.pt",
                **{**SMALL, "min_delta": 1.0})  # fmt: skip
    assert got["member_ensemble"] == [3] and "single" not in got
    ckpt = load_checkpoint(tmp_path / "f.pt")
    assert ckpt.member_ensemble == [0] and len(ckpt.members) == 2
    test = SplitBinaryDataset(tiny_dataset, "test")
    model = ckpt.build_model()  # the first member's model alone, not an ensemble
    states_equal(model.state_dict(), ckpt.members[0]["models"][0])
    states_equal(ckpt.model, ckpt.members[0]["models"][0])
    logits = predict_logits(model, test, CPU)
    assert got["auc"] == pytest.approx(roc_auc(test.labels(), logits), abs=1e-7)


def test_resume_inside_the_second_member_gives_the_uninterrupted_result(runs, tiny_dataset, tmp_path):
    together, _, _ = runs
    path = tmp_path / "r.pt"
    with stop_after_save(member=1, step=5), pytest.raises(Interrupted):  # the second member's, at step 5 or later
        train(tiny_dataset, "dlrm", seed=3, seed_ensemble=2, save_checkpoint=path, checkpoint_every=5, **SMALL)
    mid = load_checkpoint(path)
    assert mid.member == 1 and [m["seed"] for m in mid.members] == [3] and mid.member_ensemble is None
    assert 5 <= mid.step < together["members"][1]["steps"]
    with pytest.raises(ValueError, match="taken in member 2 of a seed ensemble; this run asks for 1"):
        train(tiny_dataset, "dlrm", seed=3, seed_ensemble=1, load_checkpoint=path, **SMALL)
    resumed = train(tiny_dataset, "dlrm", seed=3, seed_ensemble=2, load_checkpoint=path, save_checkpoint=path,
                    checkpoint_every=5, **SMALL)  # fmt: skip
    for key in ("auc", "logloss", "best_step", "member_ensemble", "members", "calibration"):  # the same scale refitted
        assert resumed[key] == together[key], key
    again = train(tiny_dataset, "dlrm", seed=3, seed_ensemble=2, load_checkpoint=path, **SMALL)  # finished: re-formed
    assert again["auc"] == together["auc"] and again["member_ensemble"] == together["member_ensemble"]
    with pytest.raises(ValueError, match="holds 2 trained members; this run asks for 1"):
        train(tiny_dataset, "dlrm", seed=3, seed_ensemble=1, load_checkpoint=path, **SMALL)
    ckpt = load_checkpoint(path)  # finished: its model is the first kept member's, its members every seed's
    states_equal(ckpt.model, ckpt.members[ckpt.member_ensemble[0]]["models"][0])
    with pytest.raises(ValueError, match="finished seed ensemble whose members trained 20 steps.* up to 40"):
        train(tiny_dataset, "dlrm", seed=3, seed_ensemble=2, load_checkpoint=path, **{**SMALL, "epochs": 4})


def test_the_default_trains_one_model_on_small_data_too(tiny_dataset):
    result = train(tiny_dataset, "dlrm", **{k: v for k, v in SMALL.items() if k != "snapshot_ensemble"})
    assert "members" not in result and "member_ensemble" not in result and "ensemble" not in result
