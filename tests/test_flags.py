"""Every numeric flag of every command has a range stated beside its field and refuses a value outside it in one line;
the YAML and Python layers hold the same ranges; a path a command writes is refused where it names one of its
inputs."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import inspect

import numpy as np
import pytest

from ctrkit.cli import build_parser
from ctrkit.cli.options import finite_number
from ctrkit.config import TrainConfig
from ctrkit.field_types import check_ranges
from tests.conftest import run_cli

EDGES = ["0", "-1", "1", "1e308", "nan", "inf", "9223372036854775807", "9223372036854775808", "12x"]
CONFIG_MODULES = ("ctrkit.config", "ctrkit.data_config", "ctrkit.eval_config", "ctrkit.serve_config",
                  "ctrkit.refresh_config", "ctrkit.bench.config")  # fmt: skip


def _actions():
    """(command, action) of every flag of every command and subcommand."""
    stack = [((), build_parser())]
    while stack:
        path, parser = stack.pop()
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                stack.extend(((*path, name), sub) for name, sub in action.choices.items())
            else:
                yield " ".join(path), action


NUMERIC = [
    (command, a) for command, a in _actions() if a.type in (int, float, finite_number) or hasattr(a.type, "bounds")
]


def test_every_numeric_flag_states_its_range():
    assert len(NUMERIC) > 100  # every command's: train, serve, preprocess, refresh, bench ...
    unbounded = [f"{command} {a.option_strings[-1]}" for command, a in NUMERIC if not hasattr(a.type, "bounds")]
    assert not unbounded, f"numeric flags without a stated range (option(..., bounds=Range(...))): {unbounded}"


@pytest.mark.parametrize("text", EDGES)
def test_every_numeric_flag_takes_or_refuses_an_edge_value_in_one_line(text):
    for command, action in NUMERIC:
        try:
            value = action.type(text)
        except argparse.ArgumentTypeError as e:  # argparse prints it as one line and exits 2
            assert "\n" not in str(e) and "expected" in str(e), (command, action.dest, str(e))
            continue
        assert np.isfinite(value) and action.type.bounds.holds(value), (command, action.dest, text)


@pytest.mark.parametrize(("args", "said"), [
    (["serve", "--checkpoint", "m.pt", "--batch-window-ms", "1e308"], "--batch-window-ms: expected a number from 0"),
    (["serve", "--checkpoint", "m.pt", "--threads", "-1"], "--threads: expected an integer from 1 to 4096"),
    (["serve", "--checkpoint", "m.pt", "--max-body-mb", "1e308"], "--max-body-mb: expected a number above 0"),
    (["train", "--dataset", "d", "--max-steps", "nan"], "--max-steps: expected an integer from 1"),
    (["train", "--dataset", "d", "--lr", "-0.1"], "--lr: expected a number above 0"),
])  # fmt: skip
def test_the_cases_that_hung_or_failed_are_refused_at_the_flag(args, said, capsys):
    code, _, err = run_cli(*args, capsys=capsys)
    assert code == 2 and said in err and "Traceback" not in err, err


def test_the_yaml_and_python_layers_hold_the_same_ranges(tmp_path):
    with pytest.raises(ValueError, match="'lr' holds -1; expected a number above 0"):
        TrainConfig.from_dict({"lr": -1})
    with pytest.raises(ValueError, match="'seed_ensemble' holds 0; expected an integer from 1 to 1000"):
        TrainConfig.from_dict({"seed_ensemble": 0})
    checked = 0
    for module in CONFIG_MODULES:
        for _, cls in inspect.getmembers(importlib.import_module(module), dataclasses.is_dataclass):
            for f in dataclasses.fields(cls):
                bounds = f.metadata.get("bounds")
                if bounds is None or not all(g.default is not dataclasses.MISSING or g.default_factory
                                             is not dataclasses.MISSING for g in dataclasses.fields(cls)):  # fmt: skip
                    continue
                outside = bounds.lo - 1 if bounds.lo > -1e38 else bounds.hi * 2
                config = object.__new__(cls)
                for g in dataclasses.fields(cls):
                    object.__setattr__(config, g.name, g.default)
                object.__setattr__(config, f.name, outside)
                with pytest.raises(ValueError, match=f"`{f.name}`: expected"):
                    check_ranges(config)
                checked += 1
    assert checked > 100


def test_an_output_that_names_an_input_is_refused(tmp_path, capsys):
    checkpoint = tmp_path / "m.pt"
    checkpoint.write_bytes(b"a checkpoint")
    (tmp_path / "day.csv").write_text("a,b\n1,2\n")
    code, _, err = run_cli("predict", "--checkpoint", checkpoint, "--input", tmp_path / "day.csv", "--out", checkpoint,
                           capsys=capsys)  # fmt: skip
    assert code == 2 and f"--out {checkpoint}: the output is the input" in err, err
    assert checkpoint.read_bytes() == b"a checkpoint"  # not replaced by the scores
    from ctrkit.cli.options import check_paths

    elsewhere = ["predict", "--checkpoint", str(checkpoint), "--input", str(tmp_path / "day.csv"), "--out",
                 str(tmp_path / "scores.csv")]  # fmt: skip
    check_paths(build_parser().parse_args(elsewhere))
    # a directory a command replaces whole may not hold its input
    code, _, err = run_cli("preprocess", "table", tmp_path / "day.csv", "--out", tmp_path, "--label", "a",
                           "--overwrite", capsys=capsys)  # fmt: skip
    assert code == 2 and "the output holds the input" in err and (tmp_path / "day.csv").is_file(), err
    # the same file by another spelling
    code, _, err = run_cli("predict", "--checkpoint", checkpoint, "--dataset", tmp_path, "--out",
                           tmp_path / "." / "m.pt", capsys=capsys)  # fmt: skip
    assert code == 2 and "the output is the input" in err, err


def test_a_resumed_run_may_save_over_its_checkpoint_and_a_file_is_not_a_directory(tmp_path, capsys):
    from ctrkit.cli.options import check_paths

    parser = build_parser()
    args = parser.parse_args(["train", "--dataset", str(tmp_path), "--load-checkpoint", str(tmp_path / "m.pt"),
                              "--save-checkpoint", str(tmp_path / "m.pt")])  # fmt: skip
    check_paths(args)  # resuming saves over the checkpoint it resumed from: meant, not refused
    args = parser.parse_args(["train", "--dataset", str(tmp_path), "--save-checkpoint", str(tmp_path)])
    with pytest.raises(ValueError, match="`save_checkpoint` .*: the output is the input"):
        check_paths(args)
    (tmp_path / "in.csv").write_text("a,b\n1,2\n")
    (tmp_path / "plain").write_text("a file")
    code, _, err = run_cli("preprocess", "table", tmp_path / "in.csv", "--out", tmp_path / "plain", "--label", "a",
                           capsys=capsys)  # fmt: skip
    assert code == 2 and "is a file, not a directory" in err, err


def test_a_count_no_disk_holds_is_refused_before_anything_is_written(tmp_path, capsys):
    """`synth --rows` at its range's top (int64's maximum): refused at once naming the space it needs, not written
    until the disk fills."""
    code, _, err = run_cli("synth", "--out", tmp_path / "big", "--rows", str(2**63 - 1), capsys=capsys)
    assert code == 2 and "not enough space" in err and "Traceback" not in err, err
    assert not (tmp_path / "big").exists()


def test_the_library_reads_the_flags_ranges(tmp_path):
    """A recipe or function that Python reaches without a config refuses what the flag refuses, in the same words:
    the range is one object, read by both."""
    from ctrkit import data_config
    from ctrkit.data.synthetic import generate_dataset
    from ctrkit.field_types import CTR_FOLDS, FRACTION, FREQUENCY_THRESHOLD
    from ctrkit.preprocess.criteo import CriteoRecipe
    from ctrkit.preprocess.outbrain_files import OutbrainRecipe
    from ctrkit.preprocess.table_recipe import TableRecipe

    configs = (data_config.CriteoPreprocessConfig, data_config.TablePreprocessConfig,
               data_config.OutbrainPreprocessConfig)  # fmt: skip
    flags = {f.name: f.metadata["bounds"] for cls in configs for f in dataclasses.fields(cls) if "bounds" in f.metadata}
    assert flags["frequency_threshold"] is FREQUENCY_THRESHOLD and flags["ctr_folds"] is CTR_FOLDS
    words = FREQUENCY_THRESHOLD.words(True)
    for make in (lambda: CriteoRecipe(frequency_threshold=0).validate(),
                 lambda: TableRecipe(label="y", frequency_threshold=2**31).validate(),
                 lambda: OutbrainRecipe(frequency_threshold=0)):  # fmt: skip
        with pytest.raises(ValueError, match=f"`frequency_threshold`: expected {words}"):
            make()
    with pytest.raises(ValueError, match=f"`ctr_folds`: expected {CTR_FOLDS.words(True)}, got 1"):
        OutbrainRecipe(ctr_folds=1)
    with pytest.raises(ValueError, match=f"`test_fraction`: expected {FRACTION.words(False)}"):
        generate_dataset(tmp_path / "d", rows=10, test_fraction=1.0)
