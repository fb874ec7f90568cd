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
