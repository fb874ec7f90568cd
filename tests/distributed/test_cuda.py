"""CUDA: a 1-GPU training run, and a 2-rank NCCL job where two GPUs exist. Skipped without a GPU (no
GPU is lent; docs/parallel.md, "On a GPU")."""

import pytest
import torch

from ctrkit.checkpoint import load_checkpoint
from tests.conftest import run_process, small_model_flags
from tests.distributed.test_torchrun import assert_same_weights, torchrun

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
TWO_GPUS = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
# in fp32 on both devices, whatever each one's default precision (bf16 on a CPU with native bf16)
FLAGS = ["--max-steps", "12", "--batch-size", "333", "--no-progress", "--precision", "fp32", *small_model_flags()]


@CUDA
def test_one_gpu_trains_and_scores_like_the_cpu(tiny_dataset, tmp_path):
    for device in ("cpu", "cuda"):
        done = run_process("train", "--dataset", tiny_dataset, *FLAGS, "--device", device,
                           "--save-checkpoint", tmp_path / f"{device}.pt")  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
    a, b = load_checkpoint(tmp_path / "cpu.pt").model, load_checkpoint(tmp_path / "cuda.pt").model
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-3, atol=1e-4, msg=k)


@CUDA
def test_tables_made_on_the_gpu_are_the_tables_drawn_on_the_cpu():
    """A GPU run's tables are allocated and drawn on the GPU, in torch's operations (no copy of the tables in the
    CPU's memory): the same bits as the CPU's C kernel draws, the model built on the CPU and moved; a shard drawn
    on the GPU too."""
    from ctrkit.models.registry import create_model, make_config
    from ctrkit.models.storage import on_device

    cfg = make_config("dlrm", {"num_numerical": 3, "cardinalities": [70_000, 5, 140_000], "embedding_dim": 8,
                               "bottom_mlp": [16, 8], "top_mlp": [16, 1]})  # fmt: skip
    torch.manual_seed(4)
    want = create_model("dlrm", cfg).to("cuda").state_dict()
    torch.manual_seed(4)
    made = create_model("dlrm", cfg, on_device("cuda"))
    assert made.embeddings.onehot.weight.device.type == "cuda"
    got = made.to("cuda").state_dict()
    for k in want:
        assert torch.equal(want[k], got[k]), k
    init = made.embeddings.onehot.init
    shard = init.fill(torch.empty(1000, 5, device="cuda"), 2, 70_000, 71_000, 2, 7, draw=3)
    assert torch.equal(shard.cpu(), init.fill(torch.empty(1000, 5), 2, 70_000, 71_000, 2, 7, draw=3))


@CUDA
def test_one_rank_job_on_nccl_trains_like_one_process(tiny_dataset, tmp_path):
    """torchrun with one rank on one GPU: the hybrid-parallel path with every collective on NCCL, which
    rejects tensors that are not on the process group's device."""
    done = run_process("train", "--dataset", tiny_dataset, *FLAGS, "--device", "cuda",
                       "--save-checkpoint", tmp_path / "one.pt")  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    done = torchrun("train", "--dataset", tiny_dataset, *FLAGS, "--save-checkpoint", tmp_path / "rank.pt",
                    "--print-sharding-plan", nproc=1)  # fmt: skip
    assert "hybrid parallel: 1 rank (nccl)" in done.stderr
    assert_same_weights(tmp_path / "one.pt", tmp_path / "rank.pt", atol=1e-4)
    for args in (["evaluate"], ["predict", "--out", tmp_path / "p.npy"]):
        torchrun(*args, "--checkpoint", tmp_path / "rank.pt", "--dataset", tiny_dataset, nproc=1)


@TWO_GPUS
def test_two_gpus_on_nccl_train_like_one_process(tiny_dataset, tmp_path):
    done = run_process("train", "--dataset", tiny_dataset, *FLAGS, "--device", "cuda",
                       "--save-checkpoint", tmp_path / "one.pt")  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    done = torchrun("train", "--dataset", tiny_dataset, *FLAGS, "--save-checkpoint", tmp_path / "two.pt")
    assert "nccl" in done.stderr
    assert_same_weights(tmp_path / "one.pt", tmp_path / "two.pt", atol=1e-4)


@CUDA
def test_a_gpu_runs_best_tables_are_copied_to_disk_and_score_from_there(tmp_path, monkeypatch, tiny_dataset):
    """With ``best_weights disk`` a GPU run's selected tables go to a file (no second copy in the GPU's memory), the
    next selection reuses the file, and scoring those weights puts them on the GPU only for the while."""
    from ctrkit.data.dataset import SplitBinaryDataset
    from ctrkit.models.registry import create_model, make_config
    from ctrkit.train import best_weights
    from ctrkit.train.scoring import Scorer

    monkeypatch.setattr(best_weights, "ON_DISK_FROM", 1024)
    data = SplitBinaryDataset(tiny_dataset, "test")
    cfg = make_config("dlrm", {"num_numerical": 4, "cardinalities": list(data.spec.cardinalities),
                               "embedding_dim": 8, "bottom_mlp": [16, 8], "top_mlp": [16, 1]})  # fmt: skip
    torch.manual_seed(0)
    model = create_model("dlrm", cfg).to("cuda")
    copy = best_weights.copy_state(model.state_dict(), None, tmp_path)
    table = "embeddings.onehot.weight"
    assert copy[table].device.type == "cpu" and torch.equal(copy[table], model.state_dict()[table].cpu())
    assert best_weights.copy_state(model.state_dict(), copy, tmp_path)[table] is copy[table]  # the file reused
    scorer = Scorer(model, model, torch.device("cuda"), 4096, None, None)
    want = scorer.logits(data)
    with torch.no_grad():
        model.embeddings.onehot.weight.zero_()
    (got,) = scorer.logits_of([copy], data)
    assert copy[table].device.type == "cpu" and float(model.embeddings.onehot.weight.detach().abs().sum()) == 0
    torch.testing.assert_close(torch.as_tensor(got, dtype=torch.float32), torch.as_tensor(want))
