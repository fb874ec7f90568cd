"""A resume honours or refuses every `train` flag (issue #81): with the same settings it lands exactly where the run
that never stopped does; given a flag with another value it shows the value applied from its step on (its weights,
steps, evaluations, kept models or log differ from a plain resume's, or from a resume with the flag's other value) or
is refused in one line (exit 2). The flags that say where a run's files go and how it computes (device, threads,
storage, distributed layout) are listed apart, each with what it leaves alone; every flag of the parser is in one of
the three tables, so a new flag must be placed."""

from __future__ import annotations

import argparse
import json

import pytest
import torch

from ctrkit.checkpoint import load_checkpoint
from ctrkit.cli import build_parser
from ctrkit.data.synthetic_stream import write_stream
from tests.conftest import run_cli, small_model_flags

# flag: (the resume's flags, the flags of the resume it is compared with (None: the plain resume), what differs)
APPLIED = {
    "--lr": (["--lr", "0.05"], None, "weights"),
    "--embedding-lr": (["--embedding-lr", "0.5"], None, "weights"),
    "--wide-lr": (["--wide-lr", "0.5"], None, "weights"),
    "--weight-decay": (["--weight-decay", "0.01"], None, "weights"),
    "--embedding-l2": (["--embedding-l2", "0.001"], None, "weights"),
    "--max-steps": (["--max-steps", "14"], None, "steps"),
    "--epochs": (["--epochs", "1", "--max-steps", "40"], ["--max-steps", "40"], "steps"),
    "--warmup-steps": (["--warmup-steps", "10"], None, "weights"),
    "--decay-start-step": (["--decay-start-step", "8", "--decay-steps", "4"], None, "weights"),
    "--decay-steps": (
        ["--decay-start-step", "4", "--decay-steps", "4"],
        ["--decay-start-step", "4", "--decay-steps", "20"],
        "weights",
    ),
    "--decay-power": (
        ["--decay-start-step", "4", "--decay-steps", "20", "--decay-power", "1"],
        ["--decay-start-step", "4", "--decay-steps", "20"],
        "weights",
    ),
    "--end-lr": (
        ["--decay-start-step", "4", "--decay-steps", "8", "--end-lr", "0.0005"],
        ["--decay-start-step", "4", "--decay-steps", "8"],
        "weights",
    ),
    "--lr-schedule": (["--lr-schedule", "step"], None, "weights"),
    "--schedule-wide": (["--warmup-steps", "10", "--no-schedule-wide"], ["--warmup-steps", "10"], "weights"),
    "--evals-per-epoch": (["--evals-per-epoch", "19"], None, "evaluations"),
    "--early-stopping-patience": (
        ["--evals-per-epoch", "8", "--min-delta", "0.5", "--early-stopping-patience", "1"],
        ["--evals-per-epoch", "8", "--min-delta", "0.5"],
        "steps",
    ),
    "--plateau-patience": (
        ["--evals-per-epoch", "8", "--min-delta", "0.5", "--plateau-patience", "1"],
        ["--evals-per-epoch", "8", "--min-delta", "0.5"],
        "weights",
    ),
    "--plateau-factor": (
        ["--evals-per-epoch", "8", "--min-delta", "0.5", "--plateau-patience", "1", "--plateau-factor", "0.1"],
        ["--evals-per-epoch", "8", "--min-delta", "0.5", "--plateau-patience", "1"],
        "weights",
    ),
    "--min-delta": (["--max-steps", "40", "--min-delta", "0.01"], ["--max-steps", "40"], "weights"),
    "--reinit-embeddings": (["--max-steps", "40", "--reinit-embeddings", "on"], ["--max-steps", "40"], "weights"),
    "--reinit-drop": (
        ["--max-steps", "80", "--evals-per-epoch", "8", "--reinit-drop", "0"],
        ["--max-steps", "80", "--evals-per-epoch", "8", "--reinit-drop", "0.5"],
        "events",
    ),
    "--snapshot-ensemble": (["--max-steps", "80", "--snapshot-ensemble", "2"], ["--max-steps", "80"], "events"),
    "--seed-ensemble": (["--seed-ensemble", "2"], None, "events"),
    "--small-batch": (["--small-batch", "64"], None, "weights"),
    "--calibrate": (["--calibrate", "off"], ["--calibrate", "on"], "calibration"),
    "--precision": (["--precision", "fp32"], ["--precision", "bf16"], "weights"),
    "--eval-dtype": (["--eval-dtype", "bf16"], ["--eval-dtype", "fp32"], "evaluations"),
    "--print-freq": (["--print-freq", "1"], None, "events"),
    "--checkpoint-every": (["--checkpoint-every", "1"], None, "events"),
}
# flag: its other value; each refused in one line
REFUSED = {
    "--seed": ["--seed", "4"],
    "--linear-warm-start": ["--no-linear-warm-start"],
    "--warm-start-z": ["--warm-start-z", "1"],
    "--warm-start-logloss": ["--warm-start-logloss"],
    "--optimizer": ["--optimizer", "sgd"],
    "--embedding-optimizer": ["--embedding-optimizer", "rowwise_adagrad"],
    "--wide-optimizer": ["--wide-optimizer", "adam"],
    "--batch-size": ["--batch-size", "256"],
    "--validation-fraction": ["--validation-fraction", "0.2"],
    "--model": ["--model", "dcnv2"],
    "--recipe": ["--recipe", "plain"],
    "--embedding-dim": ["--embedding-dim", "4"],
    "--bottom-mlp": ["--bottom-mlp", "16,8"],
    "--top-mlp": ["--top-mlp", "16,1"],
    "--numerical-buckets": ["--numerical-buckets", "8"],
    "--embedding-sizes": ["--embedding-sizes", "auto"],
    "--model-config": [],  # a YAML of model settings: given in the test
    "--combiner": ["--combiner", "sum"],  # this dataset has no multi-hot feature to pool
    "--admit-after": ["--admit-after", "3"],  # nor dynamic features (applied where there are: below)
    "--eviction": ["--eviction", "lru"],
    "--count-half-life": ["--count-half-life", "3"],
}
# flag: what it leaves alone (the run's files and how it computes, not what it trains)
ELSEWHERE = {
    "--config": "a run YAML: a layer of the settings above (tests/test_cli.py)",
    "--dataset": "the data; another one is refused by its feature spec",
    "--save-checkpoint": "where the checkpoint goes",
    "--load-checkpoint": "the checkpoint resumed",
    "--continue-from": "a new run from a checkpoint's model, not a resume (refused beside --load-checkpoint)",
    "--allow-other-vocabulary": "scoring a dataset of another vocabulary; the weights are the checkpoint's",
    "--log-path": "where the log goes",
    "--tensorboard": "where TensorBoard's events go",
    "--device": "where it computes",
    "--threads": "how many threads compute the same step",
    "--no-progress": "the progress bar",
    "--dry-run": "prints the plan and trains nothing",
    "--eval-batch-size": "rows a scoring pass holds; the scores are the same",
    "--amp": "on a CPU the default precision already is what --amp picks; --precision is tested above",
    "--amp-dtype": "the autocast dtype (--amp implied): on a CPU bf16, its default precision, and fp16 is refused",
    "--compile": "compiles the same step (float rounding apart)",
    "--split-batch": "splits the same step over threads (tests/train/test_split.py)",
    "--best-weights": "where the kept weights wait: memory or disk",
    "--embedding-storage": "where the tables live; the weights are the same (tests/train/test_tiered_tables.py)",
    "--embedding-cache-rows": "the tiered tables' cache; the weights are the same",
    "--print-sharding-plan": "prints the sharding plan",
    "--sharding": "how a torchrun job splits the tables (tests/distributed)",
    "--column-split-dim": "how a torchrun job splits the tables",
    "--row-budget-mb": "how a torchrun job splits the tables",
    "--replicate-below-kb": "how a torchrun job splits the tables",
    "--dist-timeout": "how long a torchrun job's ranks wait for each other",
}


def test_every_train_flag_is_applied_refused_or_placed_apart():
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["train"]
    flags = {a.option_strings[0] for a in sub._actions if a.option_strings and a.option_strings[0] != "-h"}
    assert flags == APPLIED.keys() | REFUSED.keys() | ELSEWHERE.keys()
    assert not (
        APPLIED.keys() & REFUSED.keys() or APPLIED.keys() & ELSEWHERE.keys() or REFUSED.keys() & ELSEWHERE.keys()
    )


@pytest.fixture(scope="module")
def stopped(tiny_dataset, tmp_path_factory):
    """A run stopped at step 6 of 12, and the same run not stopped."""
    work = tmp_path_factory.mktemp("resume")
    base = ["train", "--dataset", tiny_dataset, "--batch-size", "512", "--no-progress", "--seed", "3",
            "--early-stopping-patience", "0", "--evals-per-epoch", "4", *small_model_flags()]  # fmt: skip
    assert run_cli(*base, "--max-steps", "6", "--save-checkpoint", work / "part.pt")[0] == 0
    assert run_cli(*base, "--max-steps", "12", "--save-checkpoint", work / "whole.pt")[0] == 0
    return work, base


def _resumed(stopped, name: str, *flags: str):
    """The checkpoint and the log's events of the stopped run resumed with ``flags`` (to step 12 unless they say)."""
    work, base = stopped
    out, log = work / f"{name}.pt", work / f"{name}.jsonl"
    code = run_cli(*base, "--max-steps", "12", "--load-checkpoint", work / "part.pt", "--save-checkpoint", out,
                   "--log-path", log, *flags)[0]  # fmt: skip
    assert code == 0
    return load_checkpoint(out), [json.loads(line) for line in log.read_text().splitlines()]


def test_a_plain_resume_lands_where_the_run_that_never_stopped_does(stopped):
    whole = load_checkpoint(stopped[0] / "whole.pt").resume_weights
    resumed = _resumed(stopped, "plain")[0].resume_weights
    assert all(torch.equal(whole[k], resumed[k]) for k in whole)


def _shown(ckpt, events, what: str):
    """What a resume's ``what`` is: its weights, steps, evaluations' metrics, calibration or logged events."""
    if what == "weights":
        return {k: v.clone() for k, v in ckpt.resume_weights.items()}
    if what == "steps":
        return int(ckpt.step)
    if what == "evaluations":
        return [(e["step"], e["auc"]) for e in events if e["event"] == "eval"]
    if what == "calibration":
        return ckpt.calibration
    return [(e["event"], e["step"]) for e in events if e["event"] not in ("start", "first_step")]


def _same(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    return a == b


@pytest.mark.parametrize("flag", sorted(APPLIED))
def test_a_resume_applies_the_flag_it_is_given(stopped, flag, monkeypatch):
    if flag in ("--precision", "--eval-dtype"):  # bf16 on a CPU without it runs fp32: computed in bf16 all the same
        monkeypatch.setenv("CTRKIT_CPU_BF16", "1")
    given, reference, what = APPLIED[flag]
    changed = _shown(*_resumed(stopped, flag.strip("-"), *given), what)
    plain = _shown(*_resumed(stopped, flag.strip("-") + "-ref", *(reference or [])), what)
    assert not _same(changed, plain), f"{' '.join(given)} left the resume's {what} as they were"


@pytest.mark.parametrize("flag", sorted(REFUSED))
def test_a_resume_refuses_the_flag_it_cannot_apply(stopped, flag, capsys, tmp_path):
    work, base = stopped
    given = REFUSED[flag]
    if flag == "--model-config":
        (tmp_path / "m.yaml").write_text("numerical_buckets: 8\n")
        given = [flag, tmp_path / "m.yaml"]
    out = work / f"{flag.strip('-')}.pt"
    code, _, err = run_cli(*base, "--max-steps", "12", "--load-checkpoint", work / "part.pt", *given,
                           "--save-checkpoint", out, capsys=capsys)  # fmt: skip
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert not out.exists()


@pytest.mark.parametrize(("flag", "value", "field"), [("--seed", "4", "seed"), ("--no-linear-warm-start", None,
                         "linear_warm_start"), ("--warm-start-z", "1", "warm_start_z"),
                         ("--warm-start-logloss", None, "warm_start_logloss")])  # fmt: skip
def test_a_resume_refuses_what_acted_before_its_step(stopped, capsys, flag, value, field):
    """The start's fit, its test and the seed of the batch order acted before the checkpoint's step: a resume that
    changes one would be neither run (with another seed it trained on a third data order), so it is refused."""
    work, base = stopped
    given = [flag] if value is None else [flag, value]
    code, _, err = run_cli(*base, "--max-steps", "12", "--load-checkpoint", work / "part.pt", *given,
                           "--save-checkpoint", work / f"{field}.pt", capsys=capsys)  # fmt: skip
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"cannot apply {field} " in err and "--continue-from" in err


def test_a_resume_on_raw_ids_applies_admission_and_eviction(tmp_path):
    """Where the dataset has dynamic features, ``--admit-after``, ``--eviction`` and ``--count-half-life`` given to
    a resume change its weights."""
    (day,) = write_stream(tmp_path / "s", 1, 6000, (3000, 800, 50, 5, 2000), capacity=0.5, seed=2, progress=False,
                          num_numerical=3)  # fmt: skip
    base = ["train", "--dataset", day, "--batch-size", "200", "--small-batch", "0", "--no-progress",
            *small_model_flags()]  # fmt: skip
    assert run_cli(*base, "--max-steps", "6", "--save-checkpoint", tmp_path / "part.pt")[0] == 0

    def resumed(name, *flags):
        out = tmp_path / f"{name}.pt"
        assert run_cli(*base, "--max-steps", "12", "--load-checkpoint", tmp_path / "part.pt", "--save-checkpoint",
                       out, *flags)[0] == 0  # fmt: skip
        return load_checkpoint(out).resume_weights

    plain = resumed("plain")
    for flags in (["--admit-after", "5"], ["--eviction", "lru"], ["--count-half-life", "3"]):
        changed = resumed(flags[0].strip("-"), *flags)
        assert not _same(plain, changed), flags
