"""The precision rule: bf16 on a CPU only where its cores compute bf16 natively; elsewhere `--amp` and
`serve --dtype bf16` run in fp32 and say so in one line. CTRKIT_CPU_BF16 makes this machine act as
either kind."""

import os
import subprocess
import sys

import pytest
import torch

from ctrkit import device as dev
from tests.conftest import small_model_flags


@pytest.mark.parametrize("native", ["0", "1"])
def test_amp_on_a_cpu_follows_its_bf16_support(tiny_dataset, tmp_path, native):
    env = {**os.environ, "CTRKIT_CPU_BF16": native}
    cmd = [sys.executable, "-m", "ctrkit", "train", "--dataset", str(tiny_dataset), "--amp", "--max-steps", "2",
           "--no-progress", "--device", "cpu", *small_model_flags()]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    said = [line for line in done.stderr.splitlines() if "no native bf16" in line]
    if native == "0":
        assert len(said) == 1 and "running in fp32" in said[0] and "autocast" not in done.stderr
    else:
        assert not said and "with bfloat16 autocast" in done.stderr


def test_amp_dtype_rule(monkeypatch, capsys):
    cpu = torch.device("cpu")
    monkeypatch.setenv("CTRKIT_CPU_BF16", "1")
    assert dev.amp_dtype_for(cpu, True, None) == torch.bfloat16
    monkeypatch.setenv("CTRKIT_CPU_BF16", "0")
    monkeypatch.setattr(dev, "_said", set())
    assert dev.amp_dtype_for(cpu, True, None) is None and dev.amp_dtype_for(cpu, True, "bf16") is None
    assert capsys.readouterr().err.count("no native bf16") == 1  # said once
    assert dev.amp_dtype_for(cpu, False, None) is None
    cuda = torch.device("cuda")  # CUDA: bf16 with bf16 tensor cores, else fp16 (not the CPU rule)
    for native, dtype in ((True, torch.bfloat16), (False, torch.float16)):
        monkeypatch.setattr(dev, "cuda_native_bf16", lambda _device, native=native: native)
        assert dev.amp_dtype_for(cuda, True, None) == dtype
        assert dev.amp_dtype_for(cuda, True, "fp16") == torch.float16


def test_amp_on_cuda_takes_autocast_only_at_batches_where_it_pays(monkeypatch, capsys):
    cuda = torch.device("cuda")
    monkeypatch.setattr(dev, "cuda_native_bf16", lambda _device: True)
    monkeypatch.setattr(dev, "_said", set())
    train, score = dev.CUDA_AMP_MIN_TRAIN_BATCH, dev.CUDA_AMP_MIN_SCORE_BATCH
    assert dev.amp_dtype_for(cuda, True, None, train - 1) is None
    assert dev.amp_dtype_for(cuda, True, None, 512) is None
    assert dev.amp_dtype_for(cuda, True, None, train) == torch.bfloat16
    assert dev.amp_dtype_for(cuda, True, None, train, training=False) is None  # scoring needs larger batches
    assert dev.amp_dtype_for(cuda, True, None, score, training=False) == torch.bfloat16
    assert dev.amp_dtype_for(cuda, True, "bf16", 512) == torch.bfloat16  # a named dtype is taken as asked
    assert dev.amp_dtype_for(cuda, True, "fp16", 512) == torch.float16
    assert dev.amp_dtype_for(cuda, True, None) == torch.bfloat16  # no batch given: the dtype rule alone
    said = capsys.readouterr().err.splitlines()
    assert len(said) == 2, said  # once for training, once for scoring
    assert "16,384" in said[0] and "running in fp32" in said[0] and "--amp-dtype" in said[0]
    assert "32,768" in said[1] and "--batch-size 32768" in said[1]
    cpu = torch.device("cpu")  # the batch rule is CUDA's: a CPU with native bf16 takes bf16 at any batch
    monkeypatch.setenv("CTRKIT_CPU_BF16", "1")
    assert dev.amp_dtype_for(cpu, True, None, 64) == torch.bfloat16


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_amp_on_a_gpu_follows_the_batch(tiny_dataset):
    dtype = "bfloat16" if dev.cuda_native_bf16(torch.device("cuda")) else "float16"
    for batch in (2048, dev.CUDA_AMP_MIN_TRAIN_BATCH):
        cmd = [sys.executable, "-m", "ctrkit", "train", "--dataset", str(tiny_dataset), "--amp", "--max-steps", "2",
               "--batch-size", str(batch), "--no-progress", "--device", "cuda", *small_model_flags()]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        if batch < dev.CUDA_AMP_MIN_TRAIN_BATCH:
            assert "running in fp32" in done.stderr and f"with {dtype} autocast" not in done.stderr, done.stderr[-2000:]
        else:
            assert f"with {dtype} autocast" in done.stderr and "running in fp32" not in done.stderr


def test_cpu_flags_decide_native_bf16(monkeypatch):
    monkeypatch.delenv("CTRKIT_CPU_BF16", raising=False)
    monkeypatch.setattr(dev, "cpu_flags", lambda: frozenset({"avx2", "fma"}))
    assert not dev.cpu_native_bf16()
    monkeypatch.setattr(dev, "cpu_flags", lambda: frozenset({"avx512f", "avx512_bf16"}))
    assert dev.cpu_native_bf16()
    monkeypatch.setattr(dev, "cpu_flags", lambda: frozenset({"fp", "asimd", "bf16"}))  # Arm
    assert dev.cpu_native_bf16()


def test_serving_bf16_weights_follows_the_rule(tiny_checkpoint, monkeypatch):
    from ctrkit.serve.predictor import Predictor

    monkeypatch.setattr(dev, "_said", set())
    monkeypatch.setenv("CTRKIT_CPU_BF16", "0")
    assert Predictor.from_checkpoint(tiny_checkpoint, dtype="bf16").backend == "torch"
    monkeypatch.setenv("CTRKIT_CPU_BF16", "1")
    assert Predictor.from_checkpoint(tiny_checkpoint, dtype="bf16").backend == "torch-bf16"
