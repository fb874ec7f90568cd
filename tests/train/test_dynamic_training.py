"""Raw ids day by day: `ctrkit synth stream`, training on dynamic features, `train --continue-from` and its resume."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from ctrkit.checkpoint import load_checkpoint
from ctrkit.data.dataset import SplitBinaryDataset
from ctrkit.data.feature_spec import FeatureSpec
from ctrkit.data.synthetic_stream import write_stream

VOCAB = (3000, 800, 50, 5, 2000)


def _ids(day, mapping="train"):
    data = SplitBinaryDataset(FeatureSpec.from_yaml(day), mapping)
    return data.slice(0, len(data)).categorical.numpy()


def test_stream_days_bring_new_ids_and_fade_old_ones(tmp_path):
    days = write_stream(tmp_path / "s", 3, 6000, VOCAB, capacity=0.5, seed=1, progress=False, num_numerical=3)
    spec = FeatureSpec.from_yaml(days[0])
    assert spec.dynamic_features == spec.onehot_features and len(spec.dynamic_features) == len(VOCAB)
    assert spec.cardinalities == [max(2, round(0.5 * v) + 1) for v in VOCAB]
    assert all(spec.feature_spec[n].dtype == "int64" for n in spec.dynamic_features)
    one, three = _ids(days[0]), _ids(days[2])
    assert np.abs(one).max() > 2**40  # raw 64-bit ids, far beyond any table
    big, small = 0, 3  # a feature that churns and one that keeps its ids
    new_on_three = ~np.isin(three[:, big], one[:, big])
    assert 0.2 < new_on_three.mean() < 0.9
    assert set(np.unique(three[:, small])) == set(np.unique(one[:, small]))
    gone = ~np.isin(np.unique(one[:, big]), three[:, big])
    assert gone.mean() > 0.2  # day 1's ids fade
    truth = np.fromfile(days[1] / "truth" / "test.f32", np.float32)
    assert len(truth) == len(SplitBinaryDataset(FeatureSpec.from_yaml(days[1]), "test")) and 0 < truth.min()
    assert 0.6 < FeatureSpec.from_yaml(days[1]).metadata["bayes_test_auc"] < 1


def _train(day, ckpt, *extra):
    args = [sys.executable, "-m", "ctrkit", "train", "--dataset", str(day), "--model", "dlrm", "--epochs", "1",
            "--batch-size", "600", "--embedding-dim", "8", "--bottom-mlp", "16,8", "--top-mlp", "16,1",
            "--small-batch", "0", "--save-checkpoint", str(ckpt), "--no-progress", *map(str, extra)]  # fmt: skip
    done = subprocess.run(args, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def test_continued_training_admits_new_ids_and_resumes_as_uninterrupted(tmp_path):
    days = write_stream(tmp_path / "s", 3, 6000, VOCAB, capacity=0.5, seed=2, progress=False, num_numerical=3)
    first = tmp_path / "day1.pt"
    _train(days[0], first, "--admit-after", "2")
    base = load_checkpoint(first)
    assert base.spec["dynamic_features"] == [f"cat_{i}.bin" for i in range(len(VOCAB))]
    whole, part = tmp_path / "whole" / "d2.pt", tmp_path / "part" / "d2.pt"
    done = _train(days[1], whole, "--continue-from", first, "--admit-after", "2")
    assert f"continues    from {first}" in done.stderr and "warm start   off (the run continues" in done.stderr
    assert "an id gets a row after 2 sightings" in done.stderr
    _train(days[1], part, "--continue-from", first, "--admit-after", "2", "--max-steps", "4")  # stopped at step 4
    _train(days[1], part, "--continue-from", first, "--admit-after", "2", "--load-checkpoint", part)
    a, b = load_checkpoint(whole), load_checkpoint(part)
    assert a.step == b.step == 8 and a.selection == b.selection
    # the continued run's rates are its plan's (half the dense and table defaults, four times the first-order one), not
    # the checkpoint's; no redraws; counts halving every 2 epochs of day 2 (8 batches each)
    assert "adam 0.0005 (dense), adam 0.005 (tables), adagrad 0.08 (first-order)  [a continued" in done.stderr
    assert "redraws      off  [a continued" in done.stderr
    assert "counts halving every 16 batches  [a continued run: every 2 epochs" in done.stderr
    rates = sorted(g["base_lr"] for o in a.optimizers for g in o["param_groups"])  # first-order ones: 0.08
    assert rates == pytest.approx([5e-4, 5e-3, 0.08, 0.08])
    for k in a.model:
        assert torch.equal(a.model[k], b.model[k]), k
    # the inputs' scales and buckets are the day-1 model's, not refitted on day 2
    norm = [k for k in base.model if k.startswith(("numerical_norm.", "wide_buckets.cuts"))]
    assert norm and all(torch.equal(a.model[k], base.model[k]) for k in norm)
    # the continued model holds day 2's frequent new ids, which day 1's model did not know
    ids2, ids1 = _ids(days[1])[:, 0], _ids(days[0])[:, 0]
    values, counts = np.unique(ids2[~np.isin(ids2, ids1)], return_counts=True)
    frequent_new = values[counts >= 3]
    assert len(frequent_new) > 5

    def admitted(ckpt):
        keys, state, row = (ckpt.model[f"dynamic_ids.{k}0"].numpy() for k in ("keys", "state", "row"))
        return set(keys[(state == 1) & (row > 0)].tolist())

    assert not admitted(base) & set(frequent_new.tolist())
    assert set(frequent_new.tolist()) <= admitted(a)
    assert admitted(a) & admitted(base)  # day 1's ids still seen on day 2 kept their rows
    # continued from day 1's kept model: its batches counted, then day 2's 8
    assert int(a.resume_weights["dynamic_ids.batches"]) == int(base.model["dynamic_ids.batches"]) + 8
    # evaluate and predict read raw ids: unseen ones to the rare row
    out = tmp_path / "p.npy"
    score = subprocess.run([sys.executable, "-m", "ctrkit", "evaluate", "--checkpoint", str(whole), "--dataset",
                            str(days[2]), "--mapping", "test", "--json"], capture_output=True, text=True)  # fmt: skip
    assert score.returncode == 0, score.stderr[-2000:]
    auc = json.loads(score.stdout)["auc"]
    assert 0.5 < auc < 1
    pred = subprocess.run([sys.executable, "-m", "ctrkit", "predict", "--checkpoint", str(whole), "--dataset",
                           str(days[2]), "--mapping", "test", "--out", str(out)],
                          capture_output=True, text=True)  # fmt: skip
    assert pred.returncode == 0, pred.stderr[-2000:]
    from ctrkit.metrics import roc_auc

    labels = SplitBinaryDataset(FeatureSpec.from_yaml(days[2]), "test").labels()
    pairs = int(labels.sum()) * int(len(labels) - labels.sum())
    assert abs(roc_auc(labels, np.load(out)) - auc) <= 1 / pairs  # float32 probabilities may tie one pair of logits


def test_continue_from_refuses_other_optimizers_in_one_line(tmp_path):
    days = write_stream(tmp_path / "s", 2, 3000, VOCAB, seed=3, progress=False, num_numerical=3)
    _train(days[0], tmp_path / "a.pt", "--max-steps", "2")
    args = [sys.executable, "-m", "ctrkit", "train", "--dataset", str(days[1]), "--continue-from",
            str(tmp_path / "a.pt"), "--embedding-optimizer", "sgd", "--max-steps", "2", "--no-progress"]  # fmt: skip
    done = subprocess.run(args, capture_output=True, text=True)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "differ from this run's" in done.stderr.strip().splitlines()[-1]
