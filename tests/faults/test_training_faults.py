"""Training, evaluation and checkpoints under faults: divergence, corrupt weights, concurrent runs,
killed runs, settings from elsewhere. Each asserts what the user sees and that the last good
checkpoint survives."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import torch
import yaml

from ctrkit.checkpoint import load_checkpoint, save_checkpoint
from ctrkit.data.synthetic import generate_dataset
from tests.conftest import run_process, small_model_flags
from tests.faults.conftest import digest, hidden_temporaries, one_line_error


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    out = tmp_path_factory.mktemp("faults") / "data"
    generate_dataset(out, 6_000, (5, 20, 300), num_numerical=3, test_fraction=0.2, seed=2, progress=False)
    return out


def train(data, ckpt, *extra):
    return run_process("train", "--dataset", data, "--save-checkpoint", ckpt, "--no-progress", "--batch-size", "128",
                       *small_model_flags(), *map(str, extra))  # fmt: skip


def all_finite(ckpt) -> bool:
    c = load_checkpoint(ckpt)
    return all(bool(torch.isfinite(t).all()) for t in c.model.values() if t.is_floating_point())


def test_divergence_never_overwrites_the_last_good_checkpoint(data, tmp_path):
    ckpt = tmp_path / "m.pt"
    sgd = ["--optimizer", "sgd", "--embedding-optimizer", "sgd"]
    assert train(data, ckpt, "--max-steps", "10", *sgd).returncode == 0
    # a new run on the same path with an absurd learning rate, a checkpoint every step, the loss printed rarely
    proc = train(data, ckpt, "--max-steps", "60", "--lr", "1e30", "--embedding-lr", "1e30", "--checkpoint-every", "1",
                 "--print-freq", "1000", "--warmup-steps", "0", *sgd)  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    one_line_error(proc.stderr, "train", "by step", "last checkpoint was kept")
    assert all_finite(ckpt)  # the good run's checkpoint, or one saved before the weights diverged
    assert load_checkpoint(ckpt).step < 60


def test_evaluate_and_predict_refuse_a_checkpoint_with_nan_weights(data, tmp_path):
    ckpt = tmp_path / "m.pt"
    assert train(data, ckpt, "--max-steps", "5").returncode == 0
    c = load_checkpoint(ckpt)
    name = next(k for k, v in c.model.items() if v.is_floating_point() and "top_mlp" in k)
    c.model[name].fill_(float("nan"))
    save_checkpoint(ckpt, c)
    for command in ("evaluate", "predict"):
        extra = ["--out", tmp_path / "p.npy"] if command == "predict" else []
        proc = run_process(command, "--checkpoint", ckpt, "--dataset", data, *extra)
        assert proc.returncode == 2, proc.stderr
        one_line_error(proc.stderr, command, "NaN or infinite", "samples")
    assert not (tmp_path / "p.npy").exists()


def test_a_live_run_holds_its_checkpoint_path(data, tmp_path):
    """Two runs on one path used to mix their weights and run YAMLs; the second is refused now, and a
    lock left by a dead process is taken over."""
    ckpt = tmp_path / "m.pt"
    assert train(data, ckpt, "--max-steps", "3").returncode == 0
    before = digest(tmp_path)
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / "m.pt.lock").write_text(f"{holder.pid}\n")
        proc = train(data, ckpt, "--max-steps", "3", "--lr", "0.5")
        assert proc.returncode == 2
        one_line_error(proc.stderr, "train", f"pid {holder.pid}", "m.pt")
        assert {k: v for k, v in digest(tmp_path).items() if not k.endswith(".lock")} == before
    finally:
        holder.kill()
        holder.wait()
    proc = train(data, ckpt, "--max-steps", "3", "--lr", "0.5")  # the holder is gone: taken over
    assert proc.returncode == 0, proc.stderr
    assert not (tmp_path / "m.pt.lock").exists()
    assert yaml.safe_load((tmp_path / "m.yaml").read_text())["train_config"]["lr"] == 0.5


def test_concurrent_runs_on_one_path_never_mix(data, tmp_path):
    ckpt = tmp_path / "m.pt"
    cmd = [sys.executable, "-m", "ctrkit", "train", "--dataset", str(data), "--save-checkpoint", str(ckpt),
           "--no-progress", "--batch-size", "64", "--max-steps", "150", *small_model_flags()]  # fmt: skip
    runs = [subprocess.Popen([*cmd, "--lr", lr], stderr=subprocess.PIPE, text=True) for lr in ("0.001", "0.002")]
    results = [(p.wait(120), p.stderr.read()) for p in runs]
    codes = sorted(code for code, _ in results)
    winner_lr = None
    for (code, err), lr in zip(results, ("0.001", "0.002")):
        if code == 0:
            winner_lr = float(lr)
        else:
            assert code == 2
            one_line_error(err, "train", "another live process")
    assert codes[0] == 0  # at least one ran; when both did, they ran one after the other
    run_yaml = yaml.safe_load((tmp_path / "m.yaml").read_text())
    assert load_checkpoint(ckpt).train_config["lr"] == run_yaml["train_config"]["lr"]
    if codes == [0, 2]:
        assert run_yaml["train_config"]["lr"] == winner_lr


def test_a_run_that_saves_nothing_leaves_the_old_run_yaml(data, tmp_path):
    """The run YAML used to be rewritten when a run started; it is written with the run's first checkpoint."""
    ckpt = tmp_path / "m.pt"
    sgd = ["--optimizer", "sgd", "--embedding-optimizer", "sgd"]
    assert train(data, ckpt, "--max-steps", "3", *sgd).returncode == 0
    before = digest(tmp_path)
    proc = train(data, ckpt, "--max-steps", "30", "--lr", "1e30", "--embedding-lr", "1e30", "--print-freq", "1",
                 "--warmup-steps", "0", *sgd)  # diverges before its first save  # fmt: skip
    assert proc.returncode == 2
    assert digest(tmp_path) == before


def test_run_yaml_works_from_another_directory(data, tmp_path):
    ckpt = tmp_path / "m.pt"
    rel = os.path.relpath(data, tmp_path)
    proc = subprocess.run([sys.executable, "-m", "ctrkit", "train", "--dataset", rel, "--save-checkpoint", "m.pt",
                           "--max-steps", "2", "--no-progress", *small_model_flags()], cwd=tmp_path,
                          capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    cmd = [sys.executable, "-m", "ctrkit", "train", "--config", str(ckpt.with_suffix(".yaml")), "--max-steps", "2",
           "--no-progress", "--save-checkpoint", "again.pt"]  # fmt: skip
    proc = subprocess.run(cmd, cwd=elsewhere, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert (elsewhere / "again.pt").exists()


def test_training_killed_mid_run_resumes_to_the_uninterrupted_result(data, tmp_path):
    """kill -9 at a random moment (mid-step or mid-save): the checkpoint is whole, the next write clears
    the killed run's temporaries, and resuming lands where an uninterrupted run does."""
    flags = ["--max-steps", "120", "--checkpoint-every", "7", "--seed", "3"]
    straight = tmp_path / "straight.pt"
    assert train(data, straight, *flags).returncode == 0
    ckpt = tmp_path / "m.pt"
    cmd = [sys.executable, "-m", "ctrkit", "train", "--dataset", str(data), "--save-checkpoint", str(ckpt),
           "--no-progress", "--batch-size", "128", *small_model_flags(), *flags]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not ckpt.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.01)
    time.sleep(0.3)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_at = load_checkpoint(ckpt).step  # a whole checkpoint, whatever the moment
    assert 0 < killed_at <= 120
    resumed = train(data, ckpt, *flags, "--load-checkpoint", ckpt)
    assert resumed.returncode == 0, resumed.stderr
    a, b = load_checkpoint(straight).model, load_checkpoint(ckpt).model
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert hidden_temporaries(tmp_path) == [] and not (tmp_path / "m.pt.lock").exists()


def test_a_distributed_job_whose_peer_never_comes_is_one_line(data, tmp_path):
    """Rank 0 of a 2-rank job whose other rank never starts: the timeout is one line and exit 2."""
    from tests.conftest import free_port

    env = {**os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}  # fmt: skip
    cmd = [sys.executable, "-m", "ctrkit", "train", "--dataset", str(data), "--max-steps", "2", "--no-progress",
           "--dist-timeout", "3", "--save-checkpoint", str(tmp_path / "m.pt")]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    one_line_error(proc.stderr, "train", "distributed")
    assert not (tmp_path / "m.pt").exists()
