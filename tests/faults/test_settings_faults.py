"""Settings changed or dropped without a word, and values that died in a traceback: each refused in one line (exit
2) naming the setting, or honoured."""

from __future__ import annotations

import pytest

from tests.conftest import run_cli, small_model_flags
from tests.faults.conftest import one_line_error


@pytest.mark.parametrize(
    "yaml_text, needles",
    [
        ("train_config:\n  lr: abc\n", ("'lr' holds \"abc\"", "expected a finite number")),
        ("train_config:\n  lr: [1, 2]\n", ("'lr' holds [1, 2]", "expected a finite number")),
        ("train_config:\n  lr: 1e-3\n", ("'lr' holds \"1e-3\"", "write 1.0e-3")),
        ("model_config:\n  embedding_dim: x\n", ("'embedding_dim' holds \"x\"", "expected an integer")),
        ("model: [dlrm]\n", ("'model' holds ['dlrm']", "expected text")),
    ],
)
def test_run_yaml_values_are_type_checked(tiny_dataset, tmp_path, capsys, yaml_text, needles):
    run = tmp_path / "run.yaml"
    run.write_text(f"dataset: {tiny_dataset}\n{yaml_text}")
    code, _, err = run_cli("train", "--config", run, "--max-steps", "1", "--no-progress", capsys=capsys)
    assert code == 2, err
    one_line_error(err, "train", "run.yaml", *needles)


def test_a_dataset_that_is_not_text_is_refused(tmp_path, capsys):
    (tmp_path / "run.yaml").write_text("dataset: 5\n")
    code, _, err = run_cli("train", "--config", tmp_path / "run.yaml", capsys=capsys)
    assert code == 2
    one_line_error(err, "train", "'dataset' holds 5", "expected text")


def test_capacities_are_checked_where_they_are_given(tmp_path, capsys):
    """A capacity beyond a dynamic table's int32 rows, or not finite, is refused by preprocess and synth rather than
    written into a spec that `train` then died on in torch.zeros; such a spec is refused by the model in one line."""
    from ctrkit.models.dynamic import DynamicIds

    (tmp_path / "t.csv").write_text("label,user\n" + "".join(f"{i % 2},u{i}\n" for i in range(40)))
    code, _, err = run_cli("preprocess", "table", tmp_path / "t.csv", "--out", tmp_path / "d", "--label", "label",
                           "--raw-ids", "user", "--capacity", "99999999999999999999", "--no-progress",
                           capsys=capsys)  # fmt: skip
    assert code == 2
    one_line_error(err, "preprocess table", "--capacity: expected an integer from 2 to 2147483647")
    for capacity in ("1e30", "inf"):
        code, _, err = run_cli("synth", "stream", "--out", tmp_path / "s", "--rows", "100", "--days", "1",
                               "--capacity", capacity, capsys=capsys)  # fmt: skip
        assert code == 2, capacity
        one_line_error(err, "synth", "--capacity")
    assert not (tmp_path / "d").exists() and not (tmp_path / "s").exists()
    with pytest.raises(ValueError, match="capacity .* must be from 2 rows"):
        DynamicIds([0], [2**40])


def test_a_cache_smaller_than_one_step_is_refused_by_the_plan(tiny_dataset, tmp_path, capsys):
    code, _, err = run_cli("train", "--dataset", tiny_dataset, "--embedding-storage", "disk", "--embedding-cache-rows",
                           "100", "--batch-size", "256", "--dry-run", "--save-checkpoint", tmp_path / "c.pt",
                           capsys=capsys)  # fmt: skip
    assert code == 2
    one_line_error(err, "train", "--embedding-cache-rows 100 is fewer than the rows one step can look up",
                   "a batch of 256 x 8 features")  # fmt: skip


def test_the_plan_compares_what_it_adds_with_the_room_beside_the_process(tiny_dataset, capsys):
    code, out, err = run_cli("train", "--dataset", tiny_dataset, "--dry-run", capsys=capsys)
    assert code == 0
    line = next(line for line in (out + err).splitlines() if line.strip().startswith("memory"))
    assert "this process now" in line and "more of" in line and "available beside it" in line, line


def test_continued_runs_keep_their_settings_or_refuse(tiny_dataset, tmp_path, capsys):
    """A checkpoint of a continued run resumed without --continue-from would switch to a fresh run's rates: refused,
    naming the flag; shape flags that a run from a checkpoint cannot apply are refused, naming each."""
    first, second = tmp_path / "first.pt", tmp_path / "second.pt"
    base = ["--dataset", tiny_dataset, "--batch-size", "512", "--no-progress", *small_model_flags()]
    assert run_cli("train", *base, "--max-steps", "4", "--save-checkpoint", first)[0] == 0
    assert run_cli("train", *base, "--max-steps", "3", "--continue-from", first, "--save-checkpoint", second)[0] == 0
    capsys.readouterr()
    code, _, err = run_cli("train", *base, "--max-steps", "6", "--load-checkpoint", second, "--save-checkpoint",
                           second, capsys=capsys)  # fmt: skip
    assert code == 2
    one_line_error(err, "train", "second.pt: written by a run continued from", "--continue-from")
    code, _, err = run_cli("train", *base, "--max-steps", "6", "--load-checkpoint", second, "--continue-from", first,
                           "--save-checkpoint", second, capsys=capsys)  # fmt: skip
    assert code == 0, err
    code, _, err = run_cli("train", "--dataset", tiny_dataset, "--continue-from", first, "--embedding-dim", "4",
                           "--bottom-mlp", "16,4", "--save-checkpoint", tmp_path / "x.pt", capsys=capsys)  # fmt: skip
    assert code == 2
    one_line_error(err, "train", "cannot apply bottom_mlp [16, 4] (the checkpoint's: [32, 8]), embedding_dim 4 (the")


def test_every_number_flag_and_field_refuses_nan_and_the_infinities(tmp_path, capsys):
    """One rule for every float flag (the option machinery's) and every float field of a YAML config: NaN, inf and
    numbers beyond a float refused in one line, whatever the command."""
    cases = [["train", "--dataset", tmp_path, "--lr", "nan"], ["serve", "--checkpoint", "x", "--max-body-mb", "inf"],
             ["preprocess", "table", "t.csv", "--out", tmp_path / "o", "--label", "click", "--test-fraction", "1e999"],
             ["serve", "--checkpoint", "x", "--header-timeout-s=-inf"]]  # fmt: skip
    for args in cases:
        code, _, err = run_cli(*args, capsys=capsys)
        assert code == 2 and "expected a finite number" in err and "Traceback" not in err, (args, err)
    (tmp_path / "run.yaml").write_text("train_config:\n  lr: .nan\n")
    code, _, err = run_cli("train", "--config", tmp_path / "run.yaml", "--dataset", tmp_path, capsys=capsys)
    assert code == 2 and "'lr' holds NaN; expected a finite number" in err, err
