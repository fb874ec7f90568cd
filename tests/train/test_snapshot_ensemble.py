"""Snapshot ensembles: the pool of the best epochs' best evaluations, the ensemble's selection, exact resume, and
the ensemble through checkpoint, export and serving, checked against members scored one by one."""

from __future__ import annotations

import json

import numpy as np
import onnxruntime as ort
import pytest
import torch
from sklearn.metrics import roc_auc_score

from ctrkit.checkpoint import kept_model, load_checkpoint
from ctrkit.config import TrainConfig
from ctrkit.data.dataset import SplitBinaryDataset, split_tail
from ctrkit.models.ensemble import Ensemble
from ctrkit.models.registry import create_model, make_config
from ctrkit.serve.predictor import Predictor
from tests.conftest import run_cli
from tests.train.test_trainer import build

# on tiny_dataset the mean of this run's best three epochs beats its best single evaluation by 0.006 on validation
CFG = dict(batch_size=512, epochs=4, evals_per_epoch=2, reinit_embeddings="on", early_stopping_patience=0,
           plateau_patience=0, seed=5, snapshot_ensemble=3)  # fmt: skip


@pytest.fixture(scope="module")
def run(tiny_dataset, tmp_path_factory):
    where = tmp_path_factory.mktemp("ensemble")
    trainer = build(tiny_dataset, TrainConfig(**CFG), save=where / "e.pt", log=where / "log.jsonl")
    result = trainer.fit()
    records = [json.loads(line) for line in (where / "log.jsonl").read_text().splitlines()]
    return result, where / "e.pt", records


def member_logits(ckpt, dataset) -> np.ndarray:
    """Each ensemble member built on its own from its snapshot and scored: (members, N) float64."""
    states = {s["step"]: s["model"] for s in ckpt.snapshots}
    batch = dataset.slice(0, len(dataset))
    out = []
    for step in ckpt.ensemble:
        model = create_model(ckpt.model_name, make_config(ckpt.model_name, ckpt.model_config))
        model.load_state_dict(states[step])
        with torch.no_grad():
            out.append(model.eval()(batch.numerical, batch.categorical).double().numpy())
    return np.stack(out)


def test_the_pool_holds_each_best_epochs_best_evaluation(run):
    result, path, records = run
    evals = [r for r in records if r["event"] == "eval" and r["step"] > 0]
    spe = next(r for r in records if r["event"] == "start")["steps_per_epoch"]
    best: dict[int, dict] = {}
    for r in evals:  # the first evaluation of the highest AUC in each epoch
        epoch = (r["step"] - 1) // spe
        if epoch not in best or r["auc"] > best[epoch]["auc"]:
            best[epoch] = r
    want = sorted(best.values(), key=lambda r: (-r["auc"], r["step"]))[:3]
    ckpt = load_checkpoint(path)
    assert [(s["epoch"], s["step"]) for s in ckpt.snapshots] == [((r["step"] - 1) // spe, r["step"]) for r in want]
    assert [s["score"] for s in ckpt.snapshots] == pytest.approx([r["auc"] for r in want], abs=1e-12)
    assert len(best) == 4 and len(ckpt.snapshots) == 3  # one epoch left out: the pool keeps the best three


def test_the_ensemble_is_selected_on_validation_and_scores_as_its_members_mean(run, tiny_dataset):
    result, path, records = run
    ckpt = load_checkpoint(path)
    assert result["ensemble"] == ckpt.ensemble and len(ckpt.ensemble) >= 2
    assert result["models_per_request"] == ckpt.models_averaged == len(ckpt.ensemble)
    from ctrkit.cli.train import summary_line

    gain = result["validation"]["auc"] - result["single_validation"]["auc"]
    assert gain > 0 and (f"the ensemble gained {gain:+.4f} validation AUC over its best single model, and each "
                         f"request to it runs {len(ckpt.ensemble)} models") in summary_line(result)  # fmt: skip
    assert ckpt.ensemble == [s["step"] for s in ckpt.snapshots[: len(ckpt.ensemble)]]  # the best k of the pool
    validation = split_tail(SplitBinaryDataset(tiny_dataset, "train"), 0.1)[1]
    test = SplitBinaryDataset(tiny_dataset, "test")
    v_logits, t_logits = member_logits(ckpt, validation), member_logits(ckpt, test)
    v_auc = roc_auc_score(validation.labels(), v_logits.mean(0))
    assert result["validation"]["auc"] == pytest.approx(v_auc, abs=1e-6)
    assert result["auc"] == pytest.approx(roc_auc_score(test.labels(), t_logits.mean(0)), abs=1e-6)
    # it beat the selected single model, and every other size of ensemble scored lower on validation
    single = ckpt.selection["best_metrics"]["auc"]
    assert v_auc > single + TrainConfig().min_delta and ckpt.selection["best_step"] in ckpt.ensemble
    sizes = {k: roc_auc_score(validation.labels(), member_logits_all(ckpt, validation)[:k].mean(0))
             for k in range(2, len(ckpt.snapshots) + 1)}  # fmt: skip
    assert max(sizes, key=sizes.get) == len(ckpt.ensemble)
    single_logits = member_logits_all(ckpt, test)[
        [s["step"] for s in ckpt.snapshots].index(ckpt.selection["best_step"])
    ]
    assert result["single"]["auc"] == pytest.approx(roc_auc_score(test.labels(), single_logits), abs=1e-6)
    (event,) = [r for r in records if r["event"] == "ensemble"]
    assert event["selected"] and event["members"] == ckpt.ensemble
    # the checkpoint's model is that ensemble; the single selected weights stay in `model`
    model = ckpt.build_model().eval()
    batch = test.slice(0, len(test))
    with torch.no_grad():
        got = model(batch.numerical, batch.categorical).double().numpy()
    np.testing.assert_allclose(got, t_logits.mean(0), atol=1e-5)
    assert set(ckpt.model) == set(ckpt.snapshots[0]["model"])


def member_logits_all(ckpt, dataset) -> np.ndarray:
    """Every snapshot of the pool scored on its own, in pool order."""
    kept = ckpt.kept
    ckpt.kept = kept_model([s["step"] for s in ckpt.snapshots])
    try:
        return member_logits(ckpt, dataset)
    finally:
        ckpt.kept = kept


def test_resume_gives_the_uninterrupted_ensemble(run, tiny_dataset, tmp_path):
    result, path, _ = run
    # stopped at an evaluation of the uninterrupted run (38 steps per epoch, evaluations every 19), mid-epoch 2
    first = build(tiny_dataset, TrainConfig(**{**CFG, "max_steps": 95}), save=tmp_path / "mid.pt")
    first.fit()
    mid = load_checkpoint(tmp_path / "mid.pt")
    assert mid.step == 95 and 95 in [s["step"] for s in mid.snapshots]  # epoch 2's best so far
    resumed = build(tiny_dataset, TrainConfig(**CFG), save=tmp_path / "end.pt")
    resumed.store.restore(mid)
    got = resumed.fit()
    assert (got["ensemble"], got["auc"], got["validation"]) == (result["ensemble"], result["auc"], result["validation"])
    end, want = load_checkpoint(tmp_path / "end.pt"), load_checkpoint(path)
    assert [s["step"] for s in end.snapshots] == [s["step"] for s in want.snapshots]
    for a, b in zip(end.snapshots, want.snapshots):
        for k, v in b["model"].items():
            torch.testing.assert_close(a["model"][k], v, rtol=0, atol=0, msg=k)


def test_one_model_trains_the_same_without_a_pool(run, tiny_dataset, tmp_path):
    result, path, _ = run
    trainer = build(tiny_dataset, TrainConfig(**{**CFG, "snapshot_ensemble": 1}), save=tmp_path / "one.pt")
    single = trainer.fit()
    ckpt, pooled = load_checkpoint(tmp_path / "one.pt"), load_checkpoint(path)
    assert "ensemble" not in single and ckpt.snapshots is None and ckpt.ensemble is None
    assert single["validation"] == pooled.selection["best_metrics"] and single["step"] == result["step"]
    for k, v in pooled.model.items():  # the pool changes what is kept, never the training
        torch.testing.assert_close(ckpt.model[k], v, rtol=0, atol=0, msg=k)
    assert not isinstance(ckpt.build_model(), Ensemble)


def test_an_ensemble_exports_and_serves_as_its_members_mean(run, tiny_dataset, tmp_path, capsys):
    _, path, _ = run
    ckpt = load_checkpoint(path)
    test = SplitBinaryDataset(tiny_dataset, "test")
    batch = test.slice(0, 300)
    numerical, categorical = batch.numerical.numpy(), batch.categorical.numpy()
    want = 1 / (1 + np.exp(-member_logits(ckpt, test)[:, :300].mean(0)))
    code, _, _ = run_cli("export", "--checkpoint", path, "--format", "onnx", "--out", tmp_path / "onnx", capsys=capsys)
    assert code == 0
    session = ort.InferenceSession(str(tmp_path / "onnx" / "model.onnx"), providers=["CPUExecutionProvider"])
    got = session.run(["probability"], {"numerical": numerical, "categorical": categorical})[0]
    np.testing.assert_allclose(got[:, 0], want, atol=1e-5)
    memory = Predictor.from_checkpoint(path)
    mmap = Predictor.from_checkpoint(path, "mmap", 50)
    np.testing.assert_allclose(memory(numerical, categorical)[:, 0], want, atol=1e-5)
    np.testing.assert_array_equal(mmap(numerical, categorical), memory(numerical, categorical))
    assert len(mmap.stores) == len(ckpt.ensemble)  # each member's tables memory-mapped


def test_a_sharded_form_of_an_ensemble_is_refused(run, tmp_path, capsys):
    _, path, _ = run
    code, _, err = run_cli("convert-checkpoint", "--checkpoint", path, "--out", tmp_path / "s.pt", "--world-size", "2",
                           capsys=capsys)  # fmt: skip
    assert code == 2 and "an ensemble of" in err and not (tmp_path / "s.pt").exists()


def test_evaluate_and_report_score_the_ensemble(run, tiny_dataset, tmp_path, capsys, monkeypatch):
    from ctrkit.eval.evaluator import Scoring

    result, path, _ = run
    code, out, _ = run_cli("evaluate", "--checkpoint", path, "--dataset", tiny_dataset, capsys=capsys)
    assert code == 0 and f"{result['auc']:.4f}" in out  # the ensemble's test AUC, as training reported it
    from ctrkit.report import build_report

    data = build_report(path, tmp_path / "report.html", dataset=tiny_dataset)
    assert data["final"]["ensemble"] == result["ensemble"]
    assert data["final"]["auc"] == pytest.approx(result["auc"], abs=1e-6)  # scored by the ensemble
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "test")  # as under torchrun: refused before any process group
    with pytest.raises(
        ValueError, match=f"an ensemble of {len(result['ensemble'])} models, which scores in one process"
    ):
        Scoring.load(path, tiny_dataset)
