"""Validation split, model selection (best weights, plateau decay, early stopping) and exact resume."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from ctrkit.checkpoint import load_checkpoint
from ctrkit.cli.train import summary_line
from ctrkit.config import TrainConfig
from ctrkit.data.dataset import SplitBinaryDataset, split_tail
from ctrkit.train.plan import DEFAULT_EPOCHS, PATIENCE, SMALL_DATA_PATIENCE, default_epochs, default_patience
from ctrkit.train.selection import Selection
from tests.train.test_trainer import build, params


def test_validation_split_is_deterministic_disjoint_and_the_tail(tiny_dataset):
    train = SplitBinaryDataset(tiny_dataset, "train")
    head, tail = split_tail(train, 0.1)
    again = split_tail(train, 0.1)
    assert (len(head), len(tail)) == (19_440, 2_160) and (again[0].stop, again[1].start) == (head.stop, tail.start)
    assert head.stop == tail.start and tail.stop == len(train)  # disjoint, together the whole mapping
    np.testing.assert_array_equal(np.concatenate([head.labels(), tail.labels()]), train.labels())
    whole = train.slice(len(train) - 100, len(train))
    np.testing.assert_array_equal(tail.slice(len(tail) - 100, len(tail)).categorical, whole.categorical)
    with pytest.raises(ValueError, match="`validation_fraction`: expected a number above 0"):
        split_tail(train, 1.0)


def test_selection_on_a_planted_curve():
    sel = Selection(patience=3, plateau_patience=2, plateau_factor=0.5, min_delta=0.001)
    curve = [0.60, 0.70, 0.7005, 0.69, 0.68, 0.75]  # best at step 2; 0.7005 is within min_delta
    improved = []
    for step, auc in enumerate(curve, 1):
        improved.append(sel.update(step, {"auc": auc, "logloss": 0.5}))
        if sel.stopped:
            break
    # stops after the third evaluation without improvement, before ever seeing 0.75
    assert improved == [True, True, False, False, False] and sel.stopped
    assert sel.best_step == 2 and sel.best_metrics["auc"] == 0.70
    assert sel.lr_scale == 0.5  # halved once, after two evaluations without improvement
    assert Selection.from_state(sel.state()) == sel


def test_plateau_decay_compounds_and_restarts_after_an_improvement():
    sel = Selection(plateau_patience=1, plateau_factor=0.1)
    for step, auc in enumerate([0.7, 0.6, 0.6, 0.8, 0.6], 1):
        sel.update(step, {"auc": auc})
    assert sel.lr_scale == pytest.approx(0.001) and sel.best_step == 4 and not sel.stopped


def test_one_class_validation_selects_by_log_loss():
    sel = Selection()
    sel.update(1, {"auc": float("nan"), "logloss": 0.4})
    assert not sel.update(2, {"auc": float("nan"), "logloss": 0.5}) and sel.update(
        3, {"auc": float("nan"), "logloss": 0.3}
    )


class PlantedValidation:
    """Replaces the validation score with a planted curve (test scores stay real)."""

    def __init__(self, trainer, curve):
        self.trainer, self.curve, self.calls, self.states = trainer, list(curve), 0, {}

        def score():
            self.states[trainer.step] = params(trainer.model)
            self.calls += 1
            metrics = {"auc": self.curve[self.calls - 1], "logloss": 0.5, "samples": len(trainer.validation_set)}
            return metrics, None

        trainer.selector.score_validation = score


def test_trainer_keeps_the_best_weights_decays_the_lr_and_stops_early(tiny_dataset, tmp_path):
    cfg = TrainConfig(batch_size=256, epochs=5, evals_per_epoch=4, early_stopping_patience=3, plateau_patience=2,
                      plateau_factor=0.5, print_freq=1, seed=1)  # fmt: skip
    trainer = build(tiny_dataset, cfg, save=tmp_path / "c.pt", log=tmp_path / "log.jsonl")
    planted = PlantedValidation(trainer, [0.60, 0.70, 0.65, 0.66, 0.64] + [0.9] * 20)
    result = trainer.fit()
    spe = trainer.steps_per_epoch  # 76
    eval_steps = sorted(trainer.eval_steps())
    assert planted.calls == 5 and result["stopped_early"] and trainer.step == eval_steps[4] < 5 * spe
    assert result["best_step"] == eval_steps[1] and result["validation"]["auc"] == 0.70
    best = planted.states[eval_steps[1]]
    for k, v in params(trainer.model).items():  # the model ends with the weights of the best evaluation
        torch.testing.assert_close(v, best[k], rtol=0, atol=0)
    ckpt = load_checkpoint(tmp_path / "c.pt")
    for k, v in ckpt.model.items():
        torch.testing.assert_close(v, best[k], rtol=0, atol=0)
    assert ckpt.resume_model is not None and ckpt.selection["best_step"] == eval_steps[1]
    records = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    lrs = {r["step"]: r["lr"] for r in records if r["event"] == "train"}
    schedule = lambda step: trainer.schedule(step - 1)  # noqa: E731
    # halved after the 2nd evaluation without improvement (the 4th evaluation)
    assert lrs[eval_steps[3]] == pytest.approx(schedule(eval_steps[3]))
    assert lrs[eval_steps[3] + 1] == pytest.approx(0.5 * schedule(eval_steps[3] + 1))
    assert [r["event"] for r in records].count("test") == 1 and "auc" in result


def test_resume_past_the_best_step_gives_the_uninterrupted_result(tiny_dataset, tmp_path):
    cfg = TrainConfig(batch_size=512, epochs=3, evals_per_epoch=3, early_stopping_patience=0, plateau_patience=1,
                      seed=4, calibrate="on")  # fmt: skip
    straight = build(tiny_dataset, cfg)
    curve = [0.6, 0.7, 0.65, 0.66, 0.67, 0.64, 0.68, 0.69, 0.61]
    PlantedValidation(straight, curve)
    want = straight.fit()

    first = build(tiny_dataset, TrainConfig(**{**cfg.to_dict(), "max_steps": 60}), save=tmp_path / "mid.pt")
    PlantedValidation(first, curve)
    first.fit()
    ckpt = load_checkpoint(tmp_path / "mid.pt")
    assert ckpt.step == 60 and ckpt.resume_model is not None and ckpt.selection["lr_scale"] < 1

    resumed = build(tiny_dataset, cfg)
    planted = PlantedValidation(resumed, curve)
    planted.calls = sum(1 for s in resumed.eval_steps() if s <= 60)
    resumed.store.restore(ckpt)
    got = resumed.fit()
    assert (got["step"], got["best_step"], got["auc"]) == (want["step"], want["best_step"], want["auc"])
    assert got["calibration"] == want["calibration"] and got["logloss"] == want["logloss"]  # the same scale, refitted
    # the 60-step run ended there with a scale of its own; training on from it refits the scale at the new end
    assert want["calibration"]["applied"] and ckpt.calibration is not None
    for k, v in params(straight.model).items():
        torch.testing.assert_close(params(resumed.model)[k], v, rtol=0, atol=0, msg=k)


def test_a_gain_over_the_baseline_counts_for_patience_but_selects_only_when_significant():
    sel = Selection(patience=2, baseline_z=1.0)
    assert sel.update(0, {"auc": 0.70}, baseline=True) and sel.baseline_step == 0
    assert not sel.update(5, {"auc": 0.705, "baseline_z": 0.8})  # higher, but within a standard error
    assert (sel.best_step, sel.since_best, sel.peak_score) == (0, 0, 0.705)  # the peak moved: patience restarts
    assert sel.update(10, {"auc": 0.704, "baseline_z": 1.5})  # significant: selected, though below the peak
    assert (sel.best_step, sel.since_best, sel.stopped) == (10, 1, False)  # and not an improvement for patience
    assert sel.update(15, {"auc": 0.71, "baseline_z": 1.2}) and sel.best_step == 15
    assert sel.update(20, {"auc": 0.711})  # past the baseline, any gain over the selected model counts
    assert Selection.from_state(sel.state()) == sel
    old = {k: v for k, v in sel.state().items() if k not in ("peak_score", "baseline_step", "baseline_z")}
    assert Selection.from_state(old).peak_score == sel.best_score  # a state written before the rule


def test_a_model_replaces_the_baseline_only_with_a_lower_log_loss_too():
    sel = Selection(patience=3, baseline_logloss=True)
    assert sel.baseline_metrics() is None
    assert sel.update(0, {"auc": 0.70, "logloss": 0.50}, baseline=True)
    assert sel.baseline_metrics() == {"step": 0, "auc": 0.70, "logloss": 0.50}
    assert not sel.update(5, {"auc": 0.71, "logloss": 0.51})  # ranks better, predicts worse: not selected
    assert (sel.best_step, sel.peak_score, sel.since_best) == (0, 0.71, 0)  # but the gain counts for patience
    assert not sel.update(10, {"auc": 0.70, "logloss": 0.49})  # better probabilities, no AUC gain
    assert sel.best_step == 0
    assert sel.update(15, {"auc": 0.702, "logloss": 0.499}) and sel.best_step == 15  # better on both (below the peak)
    # past the baseline, a model must still predict better than the baseline did, not than the selected one
    assert not sel.update(20, {"auc": 0.703, "logloss": 0.6}) and sel.best_step == 15
    assert sel.update(25, {"auc": 0.704, "logloss": 0.4995}) and sel.best_step == 25  # worse than step 15's loss
    assert Selection.from_state(sel.state()) == sel
    assert not Selection.from_state({k: v for k, v in sel.state().items() if k != "baseline_logloss"}).baseline_logloss
    # a state written before the baseline's loss was kept: the rule guards the baseline only while it is selected
    old = Selection.from_state({k: v for k, v in sel.state().items() if k != "baseline_loss"})
    assert old.baseline_loss is None and old.update(30, {"auc": 0.705, "logloss": 0.6})
    # a state written before the baseline's AUC was kept reports no baseline
    assert (
        Selection.from_state({k: v for k, v in sel.state().items() if k != "baseline_auc"}).baseline_metrics() is None
    )
    assert sel.baseline_metrics() == {"step": 0, "auc": 0.70, "logloss": 0.50}  # later models do not move it
    plain = Selection()
    plain.update(0, {"auc": 0.70, "logloss": 0.50}, baseline=True)
    assert plain.update(5, {"auc": 0.71, "logloss": 0.51})  # without the rule, AUC alone


def test_trainer_keeps_the_regression_when_a_gain_comes_with_a_worse_log_loss(tiny_dataset, tmp_path):
    base = dict(batch_size=512, epochs=2, evals_per_epoch=3, early_stopping_patience=0, plateau_patience=0, seed=2)
    runs = {}
    for rule in (False, True):
        trainer = build_with_linear_term(tiny_dataset, TrainConfig(**base, warm_start_logloss=rule),
                                         log=tmp_path / f"{rule}.jsonl")  # fmt: skip
        trainer.selector.score_validation = lambda real=trainer.selector.score_validation, t=trainer: (  # noqa: E731
            lambda m, lg: ({**m, "logloss": 0.9 if t.step else m["logloss"]}, lg)  # every trained model: worse
        )(*real())
        runs[rule] = (trainer.fit(), eval_records(tmp_path / f"{rule}.jsonl"))
    assert runs[False][0]["best_step"] > 0  # on this data training beats the regression by AUC
    result, records = runs[True]
    assert result["best_step"] == 0 and all(r["best_step"] == 0 for r in records)
    # the regression's own validation scores come back beside the kept model's (the same model here)
    first = records[0]
    assert first["step"] == 0 and result["baseline"] == {"step": 0, "auc": first["auc"], "logloss": first["logloss"]}
    assert result["validation"]["auc"] == first["auc"]
    line = summary_line(result)
    assert "kept step 0" in line and "the first-order regression it started from; no trained step beat it" in line
    trained, _ = runs[False]
    assert trained["baseline"]["auc"] == first["auc"] and trained["validation"]["auc"] > first["auc"]
    line = summary_line(trained)
    assert f"kept step {trained['best_step']}" in line
    assert f"against the first-order regression it started from: AUC {first['auc']:.4f}" in line
    assert result["step"] == runs[False][0]["step"]  # the same training, another selection


def build_with_linear_term(dataset, cfg, save=None, log=None):
    from ctrkit.data.feature_spec import FeatureSpec
    from ctrkit.models import DLRMConfig, create_model
    from ctrkit.train.trainer import Placement, RunInfo, RunOutputs, TrainData
    from tests.conftest import trainer_of

    spec = FeatureSpec.from_yaml(dataset)
    model_cfg = DLRMConfig(len(spec.numerical_features), tuple(spec.cardinalities), embedding_dim=8,
                           bottom_mlp=(32, 8), top_mlp=(32, 1))  # fmt: skip
    torch.manual_seed(cfg.seed)
    return trainer_of(create_model("dlrm", model_cfg), RunInfo("dlrm", model_cfg, spec.summary()),
                   TrainData(SplitBinaryDataset(spec, "train"), SplitBinaryDataset(spec, "test")), cfg,
                   Placement(torch.device("cpu")), RunOutputs(save, log, progress=False))  # fmt: skip


def eval_records(log):
    return [r for r in map(json.loads, log.read_text().splitlines()) if r["event"] == "eval"]


def test_warm_start_z_keeps_the_regression_unless_a_model_beats_it_significantly(tiny_dataset, tmp_path):
    from ctrkit.metrics import auc_difference

    base = dict(batch_size=512, epochs=2, evals_per_epoch=3, early_stopping_patience=0, plateau_patience=0, seed=2)
    any_gain = build_with_linear_term(tiny_dataset, TrainConfig(**base, warm_start_z=0.0), log=tmp_path / "a.jsonl")
    seen = {}
    real = any_gain.scorer.logits
    any_gain.scorer.logits = lambda ds: (  # noqa: E731
        seen.setdefault(any_gain.step, real(ds)) if ds is any_gain.validation_set else real(ds)
    )
    result = any_gain.fit()
    records = eval_records(tmp_path / "a.jsonl")
    assert records[0]["step"] == 0 and result["best_step"] > 0  # on this data training beats the regression
    assert all("baseline_z" not in r for r in records)
    labels = any_gain.validation_set.labels()
    z = {s: np.divide(*auc_difference(labels, seen[s], seen[0])) for s in seen if s}

    strict = build_with_linear_term(tiny_dataset, TrainConfig(**base, warm_start_z=1e6), log=tmp_path / "b.jsonl")
    kept = strict.fit()
    records = eval_records(tmp_path / "b.jsonl")
    assert kept["best_step"] == 0 and kept["step"] == result["step"]  # the same training, another selection
    for r in records[1:]:  # the same weights as the first run at each evaluation, and their z against step 0
        assert r["baseline_z"] == pytest.approx(z[r["step"]], rel=1e-6) and r["best_step"] == 0

    # a resume while the regression is still selected recomputes its logits from the kept weights
    mid = build_with_linear_term(tiny_dataset, TrainConfig(**base, warm_start_z=1e6, max_steps=50),
                                 save=tmp_path / "mid.pt")  # fmt: skip
    mid.fit()
    resumed = build_with_linear_term(tiny_dataset, TrainConfig(**base, warm_start_z=1e6), log=tmp_path / "c.jsonl")
    resumed.store.restore(load_checkpoint(tmp_path / "mid.pt"))
    again = resumed.fit()
    assert (again["best_step"], again["auc"]) == (0, kept["auc"])
    after = {r["step"]: r["baseline_z"] for r in eval_records(tmp_path / "c.jsonl")}
    assert after and all(after[s] == pytest.approx(z[s], rel=1e-6) for s in after)


def test_unset_epochs_give_small_data_at_least_min_steps(tiny_dataset):
    assert [default_epochs(s) for s in (1, 3, 9, 10, 11, 500)] == [100, 34, 12, 10, 10, 10]
    small = build(tiny_dataset, TrainConfig(batch_size=8192))  # 19,440 rows after the held-out tail: 3 batches
    assert (small.steps_per_epoch, small.epochs, small.total_steps) == (3, 34, 102)
    assert max(small.eval_steps()) == 102 and small.schedule(101) == pytest.approx(0.0, abs=1e-6)
    named = build(tiny_dataset, TrainConfig(batch_size=8192, epochs=DEFAULT_EPOCHS))  # a given maximum is kept
    assert (named.epochs, named.total_steps) == (DEFAULT_EPOCHS, 30)
    large = build(tiny_dataset, TrainConfig(batch_size=512))  # 38 batches an epoch: the plain default
    assert (large.epochs, large.total_steps) == (DEFAULT_EPOCHS, DEFAULT_EPOCHS * large.steps_per_epoch)


def test_unset_patience_is_longer_on_small_data(tiny_dataset):
    assert default_patience(3) == SMALL_DATA_PATIENCE and default_patience(38) == PATIENCE
    small = build(tiny_dataset, TrainConfig(batch_size=8192))  # 3 batches an epoch
    assert (small.selection.patience, small.selection.plateau_patience) == SMALL_DATA_PATIENCE
    large = build(tiny_dataset, TrainConfig(batch_size=512))
    assert (large.selection.patience, large.selection.plateau_patience) == PATIENCE
    named = build(tiny_dataset, TrainConfig(batch_size=8192, early_stopping_patience=3, plateau_patience=0))
    assert (named.selection.patience, named.selection.plateau_patience) == (3, 0)
