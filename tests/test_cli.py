"""End to end through the real command line, including its error messages and exit codes."""

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
import yaml
from sklearn.metrics import log_loss, roc_auc_score

from ctrkit.cli import build_parser
from ctrkit.data.dataset import SplitBinaryDataset
from ctrkit.metrics import mean_average_precision
from tests.conftest import run_cli, run_process, small_model_flags


@pytest.fixture(scope="module")
def trained(tiny_dataset, tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    code, _, _ = run_cli(
        "train",
        "--model",
        "dlrm",
        "--dataset",
        tiny_dataset,
        *small_model_flags(),
        "--batch-size",
        "256",
        "--epochs",
        "1",
        "--save-checkpoint",
        out / "m.pt",
        "--log-path",
        out / "log.jsonl",
        "--no-progress",
    )
    assert code == 0
    return out / "m.pt"


def test_train_writes_checkpoint_log_and_resolved_config(trained):
    records = [json.loads(line) for line in trained.with_name("log.jsonl").read_text().splitlines()]
    train_records = [r for r in records if r["event"] == "train"]
    assert train_records and all({"step", "loss", "lr", "samples_per_s"} <= set(r) for r in train_records)
    assert any(r["event"] == "eval" and "auc" in r for r in records)
    assert "embedding_dim: 8" in trained.with_suffix(".yaml").read_text()


def test_evaluate_json_and_predict_agree_with_sklearn(trained, tiny_dataset, tmp_path, capsys):
    capsys.readouterr()
    code, out, _ = run_cli("evaluate", "--checkpoint", trained, "--dataset", tiny_dataset, "--json", capsys=capsys)
    assert code == 0
    metrics = json.loads(out)
    code, _, _ = run_cli(
        "predict",
        "--checkpoint",
        trained,
        "--dataset",
        tiny_dataset,
        "--mapping",
        "test",
        "--out",
        tmp_path / "p.npy",
        capsys=capsys,
    )
    assert code == 0
    probs = np.load(tmp_path / "p.npy")
    labels = SplitBinaryDataset(tiny_dataset, "test").labels()
    assert probs.dtype == np.float32 and probs.shape == (2400,)
    assert metrics["samples"] == 2400
    assert metrics["auc"] == pytest.approx(roc_auc_score(labels, probs), abs=1e-5)
    assert metrics["logloss"] == pytest.approx(log_loss(labels, probs.astype(np.float64)), abs=1e-5)
    assert metrics["auc"] > 0.6


def test_resume_from_cli(tiny_dataset, tmp_path, capsys):
    common = ["train", "--dataset", tiny_dataset, "--batch-size", "256", "--save-checkpoint", tmp_path / "m.pt",
              "--no-progress", "--early-stopping-patience", "0"]  # fmt: skip  # runs to the end: this is about resuming
    assert run_cli(*common, "--epochs", "1", capsys=capsys)[0] == 0
    code, out, _ = run_cli(*common, "--epochs", "2", "--load-checkpoint", tmp_path / "m.pt", capsys=capsys)
    steps = 2 * -(-19_440 // 256)  # 2 epochs over 21,600 train rows less the 10% held out for validation
    assert code == 0 and f"done: {steps} steps" in out


def bad(capsys, *args):
    code, out, err = run_cli(*args, capsys=capsys)
    assert code == 2, (out, err)
    assert "Traceback" not in err
    return err


def test_bad_inputs_give_clear_errors(tiny_dataset, trained, tmp_path, capsys):
    err = bad(capsys, "train", "--dataset", tmp_path / "nowhere")
    assert "feature_spec.yaml" in err and "not found" in err

    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "feature_spec.yaml").write_text("feature_spec: {a: [1,\n")
    assert "not valid YAML" in bad(capsys, "evaluate", "--checkpoint", trained, "--dataset", tmp_path / "broken")

    err = bad(capsys, "train", "--model", "nosuchmodel", "--dataset", tiny_dataset)
    assert "unknown model 'nosuchmodel'; available: dcnv2, dlrm" in err

    copy = tmp_path / "copy"
    shutil.copytree(tiny_dataset, copy)
    ids = np.fromfile(copy / "test" / "cat_1.bin", dtype=np.int8)
    ids[10] = 10  # cardinality of cat_1 is 10
    ids.tofile(copy / "test" / "cat_1.bin")
    err = bad(capsys, "evaluate", "--checkpoint", trained, "--dataset", copy)
    assert "cat_1.bin" in err and "id 10 at sample 10" in err and "cardinality 10" in err

    ids[10] = -3
    ids.tofile(copy / "test" / "cat_1.bin")
    assert "negative id -3" in bad(capsys, "evaluate", "--checkpoint", trained, "--dataset", copy)

    (copy / "test" / "cat_1.bin").write_bytes(ids[:-7].tobytes())
    err = bad(capsys, "evaluate", "--checkpoint", trained, "--dataset", copy)
    assert "different numbers of samples" in err and "cat_1.bin: 2393" in err

    (copy / "test" / "cat_1.bin").unlink()
    err = bad(capsys, "predict", "--checkpoint", trained, "--dataset", copy, "--out", tmp_path / "x.npy")
    assert "cat_1.bin: file of categorical feature 'cat_1.bin' not found" in err


def test_checkpoint_from_different_feature_spec(trained, tmp_path, capsys):
    run_cli(
        "synth",
        "--out",
        tmp_path / "other",
        "--rows",
        "500",
        "--tables",
        "3,10,51,120,400,2000,7,900",
        "--num-numerical",
        "4",
        capsys=capsys,
    )
    err = bad(capsys, "evaluate", "--checkpoint", trained, "--dataset", tmp_path / "other")
    assert "different feature spec" in err and "'cat_2.bin' has cardinality 51" in err


def test_real_process_exit_codes(tiny_dataset, tmp_path):
    ok = run_process("evaluate", "--help")
    assert ok.returncode == 0 and "--mapping" in ok.stdout
    failed = run_process("train", "--dataset", tmp_path)
    assert failed.returncode == 2
    assert "error:" in failed.stderr and "Traceback" not in failed.stderr


def test_every_subcommand_and_flag_has_help():
    import argparse

    def check(parser: argparse.ArgumentParser, path: str) -> int:
        checked = 0
        for action in parser._actions:
            if action.dest == "help":
                continue
            assert action.help, f"{path} {action.option_strings or action.dest} has no help text"
            checked += 1
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    checked += check(sub, f"{path} {name}")
        return checked

    assert check(build_parser(), "ctrkit") > 80  # nested groups (preprocess criteo, bench train) included


def test_a_raw_table_given_as_a_dataset_points_to_preprocess(tmp_path, capsys):
    (tmp_path / "clicks.csv").write_text("country,clicked\nBR,1\n")
    code, _, err = run_cli("train", "--dataset", tmp_path / "clicks.csv", capsys=capsys)
    assert code == 2 and "a raw table, not a dataset" in err and "ctrkit preprocess table" in err


def test_every_command_that_shows_progress_takes_no_progress():
    """One set of common flags: each command with a progress bar turns it off the same way."""
    import argparse

    def sub(parser, *path):
        for name in path:
            action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
            parser = action.choices[name]
        return parser

    parser = build_parser()
    for path in (("train",), ("evaluate",), ("predict",), ("report",), ("preprocess", "criteo"),
                 ("preprocess", "outbrain"), ("preprocess", "table")):  # fmt: skip
        flags = {f for a in sub(parser, *path)._actions for f in a.option_strings}
        assert "--no-progress" in flags, path


def test_help_of_every_command_and_subcommand_prints(capsys):
    """`--help` of each command, group and subcommand exits 0 with its usage, and each usage line names every
    subcommand of its group."""
    import argparse

    def paths(parser: argparse.ArgumentParser, path: list[str]):
        yield path
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name in action.choices:
                    assert name in action.metavar, f"{' '.join(path)}: usage omits {name}"
                    yield from paths(action.choices[name], [*path, name])

    seen = 0
    for path in paths(build_parser(), []):
        with pytest.raises(SystemExit) as ended:
            build_parser().parse_args([*path, "--help"])
        out = capsys.readouterr().out
        assert ended.value.code == 0 and out.startswith("usage: ctrkit"), path
        seen += 1
    assert seen > 20


def test_model_config_flags_and_yaml(tiny_dataset, tmp_path, capsys):
    (tmp_path / "m.yaml").write_text("top_mlp: [24, 1]\nself_interaction: true\n")
    code, out, _ = run_cli(
        "train",
        "--dataset",
        tiny_dataset,
        "--embedding-dim",
        "4",
        "--model-config",
        tmp_path / "m.yaml",
        "--max-steps",
        "3",
        "--evals-per-epoch",
        "0",
        "--no-progress",
        "--save-checkpoint",
        tmp_path / "c.pt",
        capsys=capsys,
    )
    assert code == 0, out
    resolved = (tmp_path / "c.yaml").read_text()
    # --embedding-dim keeps the default bottom MLP but ends it in the requested width
    assert "- 256\n  - 4\n" in resolved and "self_interaction: true" in resolved and "- 24\n" in resolved


def test_synth_and_models_commands(tmp_path, capsys):
    code, out, _ = run_cli("synth", "--out", tmp_path / "d", "--rows", "1000", "--tables", "5,6,7", capsys=capsys)
    assert code == 0 and "900 train + 100 test samples, 3 categorical" in out
    assert SplitBinaryDataset(tmp_path / "d", "train").spec.cardinalities == [5, 6, 7]
    code, out, _ = run_cli("models", capsys=capsys)
    assert code == 0 and "\ndlrm: {'embedding_dim': 64" in out and out.startswith("dcnv2: ")
    err = bad(capsys, "synth", "--out", tmp_path / "d", "--rows", "1000")
    assert "not empty; set --overwrite" in err


def test_run_file_round_trip_with_flag_overrides(tiny_dataset, tmp_path, capsys):
    code, _, _ = run_cli(
        "train",
        "--dataset",
        tiny_dataset,
        *small_model_flags(),
        "--batch-size",
        "512",
        "--lr",
        "0.5",
        "--max-steps",
        "2",
        "--evals-per-epoch",
        "0",
        "--no-progress",
        "--save-checkpoint",
        tmp_path / "a.pt",
        capsys=capsys,
    )
    assert code == 0
    # the written run file reproduces the run; flags given on top of it win
    code, out, _ = run_cli(
        "train",
        "--config",
        tmp_path / "a.yaml",
        "--max-steps",
        "3",
        "--no-progress",
        "--save-checkpoint",
        tmp_path / "b.pt",
        capsys=capsys,
    )
    assert code == 0 and "done: 3 steps" in out
    first = yaml.safe_load((tmp_path / "a.yaml").read_text())
    second = yaml.safe_load((tmp_path / "b.yaml").read_text())
    assert second["train_config"] == {**first["train_config"], "max_steps": 3}
    assert second["model_config"] == first["model_config"] and second["dataset"] == str(tiny_dataset)
    assert second["train_config"]["batch_size"] == 512 and second["train_config"]["lr"] == 0.5


def test_run_file_errors(tmp_path, capsys):
    assert "no dataset: pass --dataset" in bad(capsys, "train")
    (tmp_path / "r.yaml").write_text("model: dlrm\nbatch_size: 3\n")
    assert "expected a mapping with keys among" in bad(capsys, "train", "--config", tmp_path / "r.yaml")
    assert "--config file not found" in bad(capsys, "train", "--config", tmp_path / "missing.yaml")


def test_dcnv2_trains_with_its_defaults_and_round_trips(tiny_dataset, tmp_path, capsys):
    code, out, _ = run_cli(
        "train",
        "--model",
        "dcnv2",
        "--dataset",
        tiny_dataset,
        "--embedding-dim",
        "8",
        "--top-mlp",
        "32,1",
        "--no-progress",
        "--save-checkpoint",
        tmp_path / "d.pt",
        capsys=capsys,
    )
    assert code == 0, out
    run = yaml.safe_load((tmp_path / "d.yaml").read_text())
    assert run["train_config"]["optimizer"] == "adam" and run["train_config"]["batch_size"] == 1024
    code, out, _ = run_cli(
        "evaluate", "--checkpoint", tmp_path / "d.pt", "--dataset", tiny_dataset, "--json", capsys=capsys
    )
    metrics = json.loads(out)
    assert metrics["model"] == "dcnv2" and metrics["auc"] > 0.62


def test_map_channel_in_the_test_mapping_gives_map_at_12(trained, tiny_dataset, tmp_path, capsys):
    data = tmp_path / "with_groups"
    shutil.copytree(tiny_dataset, data)
    n = len(SplitBinaryDataset(data, "test"))
    groups = (np.arange(n) // 6).astype(np.int32)  # displays of 6 consecutive rows
    groups.tofile(data / "test" / "display_id.bin")
    spec = yaml.safe_load((data / "feature_spec.yaml").read_text())
    spec["feature_spec"]["display_id"] = {"dtype": "int32"}
    spec["channel_spec"]["map"] = ["display_id"]
    spec["source_spec"]["test"].append(
        {"type": "split_binary", "features": ["display_id"], "files": ["test/display_id.bin"]}
    )
    (data / "feature_spec.yaml").write_text(yaml.safe_dump(spec))

    code, out, _ = run_cli("evaluate", "--checkpoint", trained, "--dataset", data, "--json", capsys=capsys)
    assert code == 0
    metrics = json.loads(out)
    run_cli("predict", "--checkpoint", trained, "--dataset", data, "--out", tmp_path / "p.npy", capsys=capsys)
    probs = np.load(tmp_path / "p.npy")
    labels = SplitBinaryDataset(data, "test").labels()
    expected, clicked = mean_average_precision(groups, labels, probs)
    assert metrics["map_groups"] == clicked > 300
    assert metrics["map@12"] == pytest.approx(expected, abs=1e-6)
    # the train mapping has no group ids, and training still works
    code, _, _ = run_cli("train", "--dataset", data, "--max-steps", "2", "--no-progress", capsys=capsys)
    assert code == 0


def test_flags_come_from_the_config_dataclasses():
    """Every TrainConfig/ParallelConfig/ServeConfig/EvalConfig field is a flag whose default is the field's."""
    from dataclasses import fields

    from ctrkit.config import ParallelConfig, TrainConfig
    from ctrkit.eval_config import EvalConfig
    from ctrkit.serve_config import ServeConfig

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices
    for command, classes in (("train", (TrainConfig, ParallelConfig)), ("serve", (ServeConfig,)),
                             ("evaluate", (EvalConfig, ParallelConfig))):  # fmt: skip
        actions = {a.dest: a for a in sub[command]._actions}
        for cls in classes:
            for f in fields(cls):
                if command == "evaluate" and f.name == "out":  # predict's own
                    assert f.name not in actions
                    continue
                action = actions[f.name]
                flag = "--" + f.name.replace("_", "-")
                on_by_default = f.default is True  # --name / --no-name
                assert action.option_strings == ([flag, "--no-" + flag[2:]] if on_by_default else [flag])
                if command != "train" or cls is ParallelConfig:  # train's TrainConfig flags defer to --config
                    assert action.default == f.default, (command, f.name)
                if f.metadata.get("choices"):
                    assert tuple(action.choices) == f.metadata["choices"]


def test_library_errors_name_the_flag_on_the_command_line(tmp_path, capsys):
    from ctrkit.data.transcode import transcode

    with pytest.raises(ValueError, match="`chunk_size`: expected an integer from 1"):  # Python: the parameter
        transcode(tmp_path, tmp_path / "out", chunk_size=0)
    code, _, err = run_cli("predict", "--checkpoint", tmp_path / "m.pt", "--input", tmp_path / "in.csv", "--out",
                           tmp_path / "out.csv", "--separator", "ab", capsys=capsys)  # fmt: skip
    assert code == 2 and "--separator" in err and "`" not in err, err  # the library's `separator`, as the flag


def test_progress_is_a_line_now_and_then_where_the_output_is_not_a_terminal(tmp_path):
    """A log file or pipe gets whole lines (the first and the last state, and one every LOG_INTERVAL_S seconds),
    never a bar redrawn with carriage returns; a terminal still gets tqdm's bar."""
    import io

    from ctrkit.progress import LOG_INTERVAL_S, tqdm

    proc = subprocess.run([sys.executable, "-m", "ctrkit", "synth", "--out", str(tmp_path / "d"), "--rows", "30000"],
                          capture_output=True, timeout=300)  # fmt: skip
    err = proc.stderr.decode()  # as bytes: text mode would turn carriage returns into newlines
    assert proc.returncode == 0, err
    lines = [line for line in err.split("\n") if line.startswith("synth")]
    assert "\r" not in err and 1 <= len(lines) <= 3 and "100%" in lines[-1], err
    log = io.StringIO()
    for _ in tqdm(range(1000), file=log, desc="x"):
        pass
    assert "\r" not in log.getvalue() and log.getvalue().count("\n") <= 3 and LOG_INTERVAL_S >= 10

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    screen = Terminal()
    for _ in tqdm(range(3), file=screen, desc="x", mininterval=0):
        pass
    assert "\r" in screen.getvalue()  # the bar, redrawn in place
