"""A resumed run applies the rates it is given (issue #81: they were recorded in the run's files, and the
checkpoint's optimizer settings silently replaced them): with the same settings it lands exactly where the run that
never stopped does; with another `--lr`, `--embedding-lr`, `--wide-lr` or `--weight-decay` its weights differ from
that plain resume's; with another optimizer it is refused in one line."""

from __future__ import annotations

import pytest
import torch

from ctrkit.checkpoint import load_checkpoint
from tests.conftest import run_cli, small_model_flags


@pytest.fixture(scope="module")
def stopped(tiny_dataset, tmp_path_factory):
    """A run stopped at step 6 of 12, and the same run not stopped."""
    work = tmp_path_factory.mktemp("resume")
    base = ["train", "--dataset", tiny_dataset, "--batch-size", "512", "--no-progress", "--seed", "3",
            "--early-stopping-patience", "0", "--evals-per-epoch", "4", *small_model_flags()]  # fmt: skip
    assert run_cli(*base, "--max-steps", "6", "--save-checkpoint", work / "part.pt")[0] == 0
    assert run_cli(*base, "--max-steps", "12", "--save-checkpoint", work / "whole.pt")[0] == 0
    return work, base


def _resumed(stopped, name: str, *flags: str) -> dict[str, torch.Tensor]:
    work, base = stopped
    out = work / f"{name}.pt"
    code = run_cli(*base, "--max-steps", "12", "--load-checkpoint", work / "part.pt", "--save-checkpoint", out,
                   *flags)[0]  # fmt: skip
    assert code == 0
    return load_checkpoint(out).resume_weights


def test_a_plain_resume_lands_where_the_run_that_never_stopped_does(stopped):
    whole = load_checkpoint(stopped[0] / "whole.pt").resume_weights
    resumed = _resumed(stopped, "plain")
    assert all(torch.equal(whole[k], resumed[k]) for k in whole)


@pytest.mark.parametrize(("flag", "value"), [("--lr", "0.05"), ("--embedding-lr", "0.5"), ("--wide-lr", "0.5"),
                                             ("--weight-decay", "0.01")])  # fmt: skip
def test_a_resume_applies_the_rates_it_is_given(stopped, flag, value):
    plain = load_checkpoint(stopped[0] / "whole.pt").resume_weights
    changed = _resumed(stopped, flag.strip("-"), flag, value)
    differ = [k for k in plain if not torch.equal(plain[k], changed[k])]
    assert differ, f"{flag} {value} left every weight as a plain resume's"


def test_a_resume_with_another_optimizer_is_refused_in_one_line(stopped, capsys):
    work, base = stopped
    code, _, err = run_cli(*base, "--max-steps", "12", "--load-checkpoint", work / "part.pt", "--optimizer", "sgd",
                           "--save-checkpoint", work / "sgd.pt", capsys=capsys)  # fmt: skip
    assert code == 2 and len(err.strip().splitlines()) == 1 and "resume with the same optimizer" in err


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
    assert not (work / f"{field}.pt").exists()
