"""`ctrkit train/evaluate/predict` under a real torchrun (2 processes, gloo, CPU, loopback only)."""

import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from ctrkit.checkpoint import load_checkpoint
from tests.conftest import TINY_TABLES, free_port, small_model_flags

TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
# fp32 whatever the machine: the ranks' weights are compared with one process's to fp32 rounding, and bf16 (a CPU's
# default where native) rounds each rank's partial sums apart
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "CTRKIT_CPU_BF16": "0"}
# --calibrate on: the kept model's logit scale is fitted on every rank and stored, so the runs compare it too
TRAIN = ["--epochs", "1", "--max-steps", "12", "--batch-size", "333", "--calibrate", "on", "--no-progress",
         *small_model_flags()]  # fmt: skip


def single(*args) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "ctrkit", *map(str, args)], capture_output=True, text=True, env=ENV)
    assert done.returncode == 0, done.stderr[-2000:]
    return done


def torchrun(*args, nproc: int = 2, timeout: float = 240, **popen) -> subprocess.CompletedProcess:
    launch = [
        *TORCHRUN,
        "--nproc-per-node",
        str(nproc),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(free_port()),
    ]
    done = subprocess.run(
        [*launch, "-m", "ctrkit", *map(str, args)], capture_output=True, text=True, env=ENV, timeout=timeout, **popen
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def dynamic_maps(weights: dict) -> tuple[dict, dict]:
    """The id maps of a model with dynamic tables, per feature as id -> (row, count, seen), and the other weights: two
    runs' maps hold the same ids in other slots (each model hashes under its own key)."""
    import re

    layout = re.compile(r"dynamic_ids\.(hash_key|(keys|state|row|count|seen|sizes)\d+)$")
    maps = {}
    for k in [k for k in weights if k.startswith("dynamic_ids.keys")]:
        j = k.removeprefix("dynamic_ids.keys")
        used = weights[f"dynamic_ids.state{j}"] == 1
        ids = weights[k][used].tolist()
        rest = zip(*(weights[f"dynamic_ids.{name}{j}"][used].tolist() for name in ("row", "count", "seen")))
        maps[j] = (dict(zip(ids, rest)), int(weights[f"dynamic_ids.sizes{j}"][0]))
    return maps, {k: v for k, v in weights.items() if not layout.search(k)}


def assert_same_weights(a: Path, b: Path, atol: float = 1e-5) -> None:
    wa, wb = load_checkpoint(a).model, load_checkpoint(b).model  # a 2-rank run's is sharded: assembled
    assert sorted(wa) == sorted(wb)
    (maps_a, wa), (maps_b, wb) = dynamic_maps(wa), dynamic_maps(wb)
    assert maps_a == maps_b
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=1e-4, atol=atol, msg=k)


@pytest.fixture(scope="module")
def one_process(tiny_dataset, tmp_path_factory) -> Path:
    """The single-process run of TRAIN on the tiny data set, which the distributed runs here are compared with."""
    out = tmp_path_factory.mktemp("one") / "one.pt"
    single("train", "--dataset", tiny_dataset, *TRAIN, "--save-checkpoint", out)
    return out


@pytest.mark.parametrize("sharding", ["table", "column", "row"])
def test_two_ranks_train_like_one_process(tiny_dataset, one_process, tmp_path, sharding):
    done = torchrun(
        "train", "--dataset", tiny_dataset, *TRAIN, "--save-checkpoint", tmp_path / "two.pt",
        "--sharding", sharding, "--print-sharding-plan",
    )  # fmt: skip
    assert f"{sharding}-wise" in done.stderr and "hybrid parallel: 2 ranks (gloo)" in done.stderr
    assert_same_weights(one_process, tmp_path / "two.pt")
    scales = [load_checkpoint(p).calibration for p in (one_process, tmp_path / "two.pt")]
    assert scales[0] is not None and scales[1] == pytest.approx(scales[0], rel=1e-4)
    # saved by 2 ranks, read by 1 (and the reverse): the same predictions
    single("predict", "--checkpoint", tmp_path / "two.pt", "--dataset", tiny_dataset, "--out", tmp_path / "p1.npy")
    torchrun(
        "predict", "--checkpoint", one_process, "--dataset", tiny_dataset, "--out", tmp_path / "p2.npy",
        "--sharding", sharding,
    )  # fmt: skip
    np.testing.assert_allclose(np.load(tmp_path / "p1.npy"), np.load(tmp_path / "p2.npy"), atol=1e-5)
    if sharding == "row":  # read by 2 ranks of the layout it was written with: each reads its own file only
        torchrun(
            "predict", "--checkpoint", tmp_path / "two.pt", "--dataset", tiny_dataset, "--out", tmp_path / "p3.npy",
            "--sharding", sharding,
        )  # fmt: skip
        np.testing.assert_allclose(np.load(tmp_path / "p1.npy"), np.load(tmp_path / "p3.npy"), atol=1e-5)


def test_two_ranks_redraw_their_shards_each_epoch_like_one_process(tiny_dataset, tmp_path):
    """reinit_embeddings across epoch boundaries (3 epochs of 6 steps): each rank redraws only its row
    shards, and the result is the single process's."""
    run = ["--dataset", tiny_dataset, "--epochs", "3", "--batch-size", "4000", "--evals-per-epoch", "0",
           "--validation-fraction", "0", "--no-progress", *small_model_flags()]  # fmt: skip
    redraw = [*run, "--reinit-embeddings", "on"]
    single("train", *redraw, "--save-checkpoint", tmp_path / "one.pt")
    torchrun("train", *redraw, "--save-checkpoint", tmp_path / "two.pt", "--sharding", "row")
    assert_same_weights(tmp_path / "one.pt", tmp_path / "two.pt")
    single("train", *run, "--save-checkpoint", tmp_path / "kept.pt", "--reinit-embeddings", "off")
    kept, redrawn = load_checkpoint(tmp_path / "kept.pt").model, load_checkpoint(tmp_path / "one.pt").model
    assert not torch.allclose(kept["embeddings.onehot.weight"], redrawn["embeddings.onehot.weight"], atol=1e-3)


def test_one_rank_job_takes_the_distributed_path(tiny_dataset, one_process, tmp_path):
    """torchrun with one rank runs the hybrid-parallel path (its collectives on a group of one), and
    trains the same weights as a plain process."""
    done = torchrun("train", "--dataset", tiny_dataset, *TRAIN, "--save-checkpoint", tmp_path / "rank.pt", nproc=1)
    assert "hybrid parallel: 1 rank (gloo)" in done.stderr
    assert_same_weights(one_process, tmp_path / "rank.pt")


def test_two_node_rendezvous_on_loopback(tiny_dataset, one_process, tmp_path):
    port = free_port()
    nodes = [
        subprocess.Popen(
            [
                *TORCHRUN,
                "--nnodes",
                "2",
                "--node-rank",
                str(rank),
                "--nproc-per-node",
                "1",
                "--rdzv-backend",
                "c10d",
                "--rdzv-endpoint",
                f"127.0.0.1:{port}",
                "--rdzv-id",
                "ctrkit-test",
                "-m",
                "ctrkit",
                "train",
                "--dataset",
                str(tiny_dataset),
                *TRAIN,
                "--save-checkpoint",
                str(tmp_path / "two.pt"),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=ENV,
        )  # fmt: skip
        for rank in (0, 1)
    ]
    for node in nodes:
        _, err = node.communicate(timeout=240)
        assert node.returncode == 0, err[-3000:]
    assert_same_weights(one_process, tmp_path / "two.pt")


def test_resuming_a_two_rank_run_gives_the_same_weights(tiny_dataset, tmp_path):
    """DCNv2 with Adam on its tables (and Adagrad on its linear term's): the optimizer states are sharded
    and come back per rank with the same layout, and are cut anew for another world size or sharding:
    2 ranks -> 1 process and 3 ranks, 1 process -> 2 ranks, all reaching the unstopped 2-rank run."""
    base = ["train", "--model", "dcnv2", "--dataset", tiny_dataset, "--epochs", "1", "--batch-size", "500",
            "--no-progress", "--embedding-dim", "8", "--bottom-mlp", "16,8", "--top-mlp", "16,1"]  # fmt: skip
    torchrun(*base, "--max-steps", "8", "--save-checkpoint", tmp_path / "straight.pt")
    half = tmp_path / "half.pt"
    torchrun(*base, "--max-steps", "4", "--save-checkpoint", half)
    torchrun(*base, "--max-steps", "8", "--load-checkpoint", half, "--save-checkpoint", tmp_path / "resumed.pt")
    assert_same_weights(tmp_path / "straight.pt", tmp_path / "resumed.pt", atol=1e-6)
    # another layout: the table optimizers' states are resharded (float sums reorder: within 1e-5)
    single(*base, "--max-steps", "8", "--load-checkpoint", half, "--save-checkpoint", tmp_path / "one.pt")
    assert_same_weights(tmp_path / "straight.pt", tmp_path / "one.pt")
    torchrun(*base, "--max-steps", "8", "--load-checkpoint", half, "--sharding", "row",
             "--save-checkpoint", tmp_path / "three.pt", nproc=3)  # fmt: skip
    assert_same_weights(tmp_path / "straight.pt", tmp_path / "three.pt")
    single(*base, "--max-steps", "4", "--save-checkpoint", tmp_path / "one_half.pt")
    torchrun(*base, "--max-steps", "8", "--load-checkpoint", tmp_path / "one_half.pt", "--sharding", "column",
             "--save-checkpoint", tmp_path / "from_one.pt")  # fmt: skip
    assert_same_weights(tmp_path / "straight.pt", tmp_path / "from_one.pt")


def _children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(stat[1]) == pid:
                out.append(int(entry))
    return out


def test_a_dead_rank_ends_the_job_instead_of_hanging(tiny_dataset, tmp_path):
    log = tmp_path / "log.jsonl"
    launch = [*TORCHRUN, "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", str(free_port())]
    job = subprocess.Popen(
        [*launch, "-m", "ctrkit", "train", "--dataset", str(tiny_dataset), "--epochs", "50", "--batch-size", "64",
         "--no-progress", "--print-freq", "1", "--log-path", str(log), "--dist-timeout", "30", *small_model_flags()],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not (log.exists() and log.read_text().count('"train"') >= 3):
            assert job.poll() is None and time.monotonic() < deadline, "training did not start"
            time.sleep(0.2)
        workers = _children(job.pid)
        assert len(workers) == 2
        os.kill(max(workers), signal.SIGKILL)  # one rank dies mid-training
        started = time.monotonic()
        _, err = job.communicate(timeout=90)
        assert job.returncode != 0
        assert time.monotonic() - started < 90
        assert "Signal 9" in err or "SIGKILL" in err or "exitcode" in err
    finally:
        if job.poll() is None:
            job.kill()


def test_a_two_rank_checkpoint_is_sharded_and_resumes_in_one_process(tiny_dataset, tmp_path):
    """Each rank writes its own file, the manifest names them (earlier saves' files removed); one
    process reads the checkpoint as whole tables, resumes it (stateless tables: any world size) and
    reaches the weights of a 2-rank run that never stopped (within float reordering)."""
    sgd = ["--optimizer", "sgd", "--embedding-optimizer", "sgd", "--wide-optimizer", "sgd", "--lr", "0.1",
           "--embedding-lr", "0.1", "--early-stopping-patience", "0", "--validation-fraction", "0"]  # fmt: skip
    flags = ["--dataset", tiny_dataset, "--epochs", "1", "--batch-size", "333", "--no-progress",
             *small_model_flags(), *sgd]  # fmt: skip
    torchrun("train", *flags, "--max-steps", "6", "--checkpoint-every", "2", "--save-checkpoint", tmp_path / "a.pt")
    raw = torch.load(tmp_path / "a.pt", weights_only=True)
    assert raw["model"] == {} and raw["shard_files"] == [f"a.pt.shards/step6-rank{r}-of-2.pt" for r in range(2)]
    assert sorted(p.name for p in (tmp_path / "a.pt.shards").iterdir()) == [
        "step6-rank0-of-2.pt",
        "step6-rank1-of-2.pt",
    ]
    ckpt = load_checkpoint(tmp_path / "a.pt")
    assert ckpt.step == 6 and ckpt.model["embeddings.onehot.weight"].shape[0] == sum(TINY_TABLES)
    single("convert-checkpoint", "--checkpoint", tmp_path / "a.pt", "--out", tmp_path / "one.pt")
    one = torch.load(tmp_path / "one.pt", weights_only=True)
    assert one["shard_files"] is None and set(one["model"]) == set(ckpt.model)
    assert all(torch.equal(one["model"][k], v) for k, v in ckpt.model.items())
    single("train", *flags, "--max-steps", "12", "--load-checkpoint", tmp_path / "a.pt",
           "--save-checkpoint", tmp_path / "resumed.pt")  # fmt: skip
    torchrun("train", *flags, "--max-steps", "12", "--save-checkpoint", tmp_path / "straight.pt")
    assert_same_weights(tmp_path / "resumed.pt", tmp_path / "straight.pt", atol=1e-4)


def test_converted_checkpoints_carry_optimizer_states(tiny_dataset, tmp_path):
    """One process (Adam on the tables, Adagrad on the linear term's) -> convert-checkpoint --world-size 2
    -> 2 ranks resume; their checkpoint -> one file (the optimizer states whole, as one process keeps
    them) -> one process resumes; the end equals the run that never stopped. (No validation data: each
    stop's end-of-run evaluation would be a selection point that the unstopped run does not have.)"""
    flags = ["--dataset", tiny_dataset, "--epochs", "1", "--batch-size", "500", "--no-progress",
             "--validation-fraction", "0", *small_model_flags()]  # fmt: skip
    single("train", *flags, "--max-steps", "8", "--save-checkpoint", tmp_path / "straight.pt")
    single("train", *flags, "--max-steps", "3", "--save-checkpoint", tmp_path / "a.pt")
    single("convert-checkpoint", "--checkpoint", tmp_path / "a.pt", "--out", tmp_path / "s.pt", "--world-size", "2",
           "--sharding", "row")  # fmt: skip
    torchrun("train", *flags, "--max-steps", "6", "--sharding", "row", "--load-checkpoint", tmp_path / "s.pt",
             "--save-checkpoint", tmp_path / "b.pt")  # fmt: skip
    single("convert-checkpoint", "--checkpoint", tmp_path / "b.pt", "--out", tmp_path / "one.pt")
    one = torch.load(tmp_path / "one.pt", weights_only=True)
    assert one["sharding"] is None and one["resume"]["rank_optimizers"] is None
    tables = one["model"]["embeddings.onehot.weight"]
    assert any(s.get("exp_avg") is not None and s["exp_avg"].shape == tables.shape
               for opt in one["resume"]["optimizers"] for s in opt["state"].values())  # fmt: skip
    single("train", *flags, "--max-steps", "8", "--load-checkpoint", tmp_path / "one.pt",
           "--save-checkpoint", tmp_path / "resumed.pt")  # fmt: skip
    assert_same_weights(tmp_path / "straight.pt", tmp_path / "resumed.pt")


DATA_LIMIT = 880 * 2**20  # bytes of private writable memory (RLIMIT_DATA) each process may map


def _limit_memory() -> None:
    """In the child before exec: caps only that process (and its own children), never the machine."""
    resource.setrlimit(resource.RLIMIT_DATA, (DATA_LIMIT, DATA_LIMIT))


def test_tables_one_process_cannot_hold_train_save_resume_and_evaluate_on_two_ranks(tmp_path):
    """640 MB of tables (two of 5M rows at dim 16): one process under the limit with the tables in memory is
    refused by its plan before allocating (a one-line error naming the limit); two ranks under it train 20 steps
    and save; resumed to 40 they score the test mapping as one unlimited process trained the same 40 steps. (One
    process under the limit left to its plan keeps the tables on disk: tests/train/test_memory_plan.py.)"""
    data = tmp_path / "big"
    single("synth", "--out", data, "--rows", "4000", "--tables", "5000000,5000000,1000", "--num-numerical", "4")
    flags = ["train", "--dataset", data, "--batch-size", "256", "--epochs", "4", "--embedding-dim", "16",
             "--optimizer", "sgd", "--embedding-optimizer", "sgd", "--lr", "0.1", "--embedding-lr", "0.1",
             "--validation-fraction", "0", "--no-progress"]  # fmt: skip
    limited = [sys.executable, "-m", "ctrkit", *map(str, flags), "--max-steps", "40", "--save-checkpoint",
               str(tmp_path / "one.pt"), "--embedding-storage", "memory"]  # fmt: skip
    done = subprocess.run(limited, capture_output=True, text=True, env=ENV, preexec_fn=_limit_memory)
    assert done.returncode == 2 and "needs a peak of about" in done.stderr and "RLIMIT_DATA" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "one.pt").exists()
    single(*flags, "--max-steps", "40", "--log-path", tmp_path / "one.jsonl")
    half = tmp_path / "half.pt"
    torchrun(*flags, "--max-steps", "20", "--save-checkpoint", half, preexec_fn=_limit_memory)
    # resuming maps each rank file whole (a private mapping, which RLIMIT_DATA counts): without the limit
    torchrun(*flags, "--max-steps", "40", "--load-checkpoint", half, "--save-checkpoint", tmp_path / "two.pt",
             "--log-path", tmp_path / "two.jsonl")  # fmt: skip

    def test_metrics(log):
        events = [json.loads(line) for line in log.read_text().splitlines()]
        return next(e for e in events if e["event"] == "test")

    one, two = test_metrics(tmp_path / "one.jsonl"), test_metrics(tmp_path / "two.jsonl")
    assert one["step"] == two["step"] == 40
    assert two["logloss"] == pytest.approx(one["logloss"], abs=1e-4) and two["auc"] == pytest.approx(
        one["auc"], abs=1e-4
    )


def test_two_ranks_train_dynamic_tables_like_one_process(tmp_path, sharding="row"):
    """Raw ids: every rank counts the whole batch, so the maps (admissions, evictions) match the single process's,
    and the admitted rows start from the rare row whichever rank holds it."""
    from ctrkit.data.synthetic_stream import write_stream

    day = write_stream(tmp_path / "s", 1, 4000, (3000, 400, 30, 5), capacity=0.15, seed=6, progress=False,
                       num_numerical=3)[0]  # fmt: skip
    admit = "1"
    run = ["train", "--dataset", day, "--epochs", "1", "--max-steps", "10", "--batch-size", "301", "--admit-after",
           admit, "--count-half-life", "3", "--small-batch", "0", "--no-progress", *small_model_flags()]  # fmt: skip
    single(*run, "--save-checkpoint", tmp_path / "one.pt")
    torchrun(*run, "--save-checkpoint", tmp_path / "two.pt", "--sharding", sharding)
    assert_same_weights(tmp_path / "one.pt", tmp_path / "two.pt")
    ckpt = load_checkpoint(tmp_path / "one.pt")
    assert int(ckpt.resume_weights["dynamic_ids.batches"]) == 10 and ckpt.model["dynamic_ids.held0"].sum() > 100
    if admit == "1":  # every id seen got a row: more ids than the table holds (10 steps of 301 rows: all but 190)
        from ctrkit.data.dataset import SplitBinaryDataset
        from ctrkit.data.feature_spec import FeatureSpec

        train = SplitBinaryDataset(FeatureSpec.from_yaml(day), "train")
        seen = len(np.unique(train.slice(0, len(train)).categorical[:, 0].numpy()))
        assert seen - 190 > ckpt.model_config["cardinalities"][0]  # so evictions ran
