"""The precision rule: bf16 on a CPU only where its cores compute bf16 natively; elsewhere `--amp` and
`serve --dtype bf16` run in fp32 and say so in one line. CTRKIT_CPU_BF16 makes this machine act as
either kind."""

import pytest
import torch

from ctrkit import device as dev
from tests.conftest import run_process, small_model_flags


@pytest.mark.parametrize("native", ["0", "1"])
def test_amp_on_a_cpu_follows_its_bf16_support(tiny_dataset, tmp_path, native, monkeypatch):
    monkeypatch.setenv("CTRKIT_CPU_BF16", native)
    flags = ("--dataset", tiny_dataset, "--amp", "--max-steps", "2", "--no-progress", "--device", "cpu")
    done = run_process("train", *flags, *small_model_flags())
    assert done.returncode == 0, done.stderr[-2000:]
    said = [line for line in done.stderr.splitlines() if line.startswith("ctrkit:") and "no native bf16" in line]
    if native == "0":  # said once (the plan's execution line says why too), and no autocast
        assert len(said) == 1 and "running in fp32" in said[0] and "with bfloat16 autocast" not in done.stderr
        assert "fp32 (autocast asked: this CPU has no native bf16)" in done.stderr
    else:
        assert not said and "with bfloat16 autocast" in done.stderr


def test_amp_dtype_rule(monkeypatch, capsys):
    assert dev.amp_dtype_for(dev.DeviceFacts("cpu", native_bf16=True), True, None) == torch.bfloat16
    monkeypatch.setattr(dev, "_said", set())
    cpu = dev.DeviceFacts("cpu", native_bf16=False, name="AVX2")
    assert dev.amp_dtype_for(cpu, True, None) is None and dev.amp_dtype_for(cpu, True, "bf16") is None
    assert capsys.readouterr().err.count("this CPU (AVX2) has no native bf16") == 1  # said once
    assert dev.amp_dtype_for(cpu, False, None) is None
    for native, dtype in ((True, torch.bfloat16), (False, torch.float16)):  # CUDA: not the CPU rule
        cuda = dev.DeviceFacts("cuda", native_bf16=native)
        assert dev.amp_dtype_for(cuda, True, None) == dtype
        assert dev.amp_dtype_for(cuda, True, "fp16") == torch.float16
    # the facts read from this machine: CTRKIT_CPU_BF16 makes it either kind
    for native in ("0", "1"):
        monkeypatch.setenv("CTRKIT_CPU_BF16", native)
        assert dev.device_facts(torch.device("cpu")).native_bf16 is (native == "1")


def test_amp_on_cuda_takes_autocast_only_at_batches_where_it_pays(monkeypatch, capsys):
    cuda = dev.DeviceFacts("cuda", native_bf16=True, tf32=True)
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
    # --amp-dtype named without --amp is taken at any batch too (it was left to the device's default)
    assert dev.precision_of(cuda, None, False, "bf16", 512)[:2] == ("bf16", torch.bfloat16)
    assert dev.precision_of(cuda, None, False, "fp16", 512)[:2] == ("fp16", torch.float16)
    said = capsys.readouterr().err.splitlines()
    assert len(said) == 2, said  # once for training, once for scoring
    assert "16,384" in said[0] and "running in fp32" in said[0] and "--amp-dtype" in said[0]
    assert "32,768" in said[1] and "--batch-size 32768" in said[1]
    cpu = dev.DeviceFacts("cpu", native_bf16=True)  # the batch rule is CUDA's: a native-bf16 CPU takes it at any batch
    assert dev.amp_dtype_for(cpu, True, None, 64) == torch.bfloat16


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_amp_on_a_gpu_follows_the_batch(tiny_dataset):
    dtype = "bfloat16" if dev.device_facts(torch.device("cuda")).native_bf16 else "float16"
    for batch in (2048, dev.CUDA_AMP_MIN_TRAIN_BATCH):
        flags = ("--dataset", tiny_dataset, "--amp", "--max-steps", "2", "--batch-size", batch, "--no-progress")
        done = run_process("train", *flags, "--device", "cuda", *small_model_flags())
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


def test_precision_by_name_follows_the_device(monkeypatch, capsys):
    cpu = dev.DeviceFacts("cpu", native_bf16=True)
    monkeypatch.setattr(dev, "_said", set())
    assert dev.precision_of(cpu, None, False, None) == ("bf16", torch.bfloat16, "")  # the default where native
    assert dev.precision_of(cpu, "fp32", False, None) == ("fp32", None, "")
    assert dev.precision_of(cpu, "bf16", False, None, 64) == ("bf16", torch.bfloat16, "")
    assert dev.precision_of(cpu, None, True, None) == ("bf16", torch.bfloat16, "")  # --amp: the shorthand
    assert dev.precision_of(cpu, "tf32", False, None) == ("fp32", None, "a CPU has no TF32 tensor cores")
    assert capsys.readouterr().err.count("no TF32 tensor cores; running in fp32") == 1
    with pytest.raises(ValueError, match="fp16 is not supported on CPU"):
        dev.precision_of(cpu, "fp16", False, None)
    cpu = dev.DeviceFacts("cpu", native_bf16=False)
    assert dev.precision_of(cpu, "bf16", False, None) == ("fp32", None, "this CPU has no native bf16")
    capsys.readouterr()
    assert dev.precision_of(cpu, None, False, None) == ("fp32", None, "")  # the default: nothing asked, nothing said
    assert capsys.readouterr().err == ""
    for cores, want in ((True, "tf32"), (False, "fp32")):  # TF32 tensor cores from Ampere on
        assert dev.precision_of(dev.DeviceFacts("cuda", cores, cores), "tf32", False, None)[0] == want
    least = dev.CUDA_AMP_MIN_TRAIN_BATCH
    for native, want in ((False, "fp32"), (True, "bf16")):  # a GPU's default: bf16 with bf16 tensor cores ...
        cuda = dev.DeviceFacts("cuda", native, native)
        assert dev.precision_of(cuda, None, False, None, least)[0] == want
        assert dev.precision_of(cuda, None, False, None, None)[0] == want  # the batch unknown: taken as large
    capsys.readouterr()
    assert dev.precision_of(cuda, None, False, None, least - 1) == ("fp32", None, "")  # ... at batches where it pays
    assert capsys.readouterr().err == ""  # nothing was asked: nothing said
    assert dev.precision_of(cuda, "bf16", False, None, 512)[:2] == ("bf16", torch.bfloat16)  # named: any batch
    assert dev.precision_of(cuda, "fp16", False, None, 512)[:2] == ("fp16", torch.float16)
    name, dtype, note = dev.precision_of(cuda, None, True, None, 512)  # --amp's batch rule
    assert (name, dtype) == ("fp32", None) and "16,384" in note


def test_precision_and_amp_that_contradict_are_refused():
    from ctrkit.config import TrainConfig

    with pytest.raises(ValueError, match="`precision` tf32 and `amp` contradict"):
        TrainConfig(precision="tf32", amp=True).validate()
    with pytest.raises(ValueError, match="`precision` bf16 and `amp_dtype` fp16 contradict"):
        TrainConfig(precision="bf16", amp_dtype="fp16").validate()
    TrainConfig(precision="bf16", amp=True, amp_dtype="bf16").validate()  # the same thing, said twice


def test_tf32_matmuls_hold_only_within():
    flags = lambda: (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)  # noqa: E731
    before = flags()
    with dev.tf32_matmuls(True):
        assert flags() == (True, True)
    assert flags() == before
    with dev.tf32_matmuls(False):
        assert flags() == before


def test_a_named_precision_trains_as_its_shorthand_and_is_recorded(tiny_dataset, tmp_path, monkeypatch):
    from ctrkit.checkpoint import load_checkpoint
    from ctrkit.train.run import train

    monkeypatch.setenv("CTRKIT_CPU_BF16", "1")
    common = dict(embedding_dim=8, epochs=1, max_steps=6, batch_size=512, progress=False, seed=3)
    runs = {
        "amp": {"amp": True},
        "bf16": {"precision": "bf16"},
        "default": {},  # a CPU with native bf16 (as CTRKIT_CPU_BF16=1 says): bf16 autocast
        "fp32": {"precision": "fp32"},
        "tf32": {"precision": "tf32"},
    }
    for name, flags in runs.items():
        train(tiny_dataset, "dlrm", save_checkpoint=tmp_path / f"{name}.pt", **common, **flags)
    ckpt = {n: load_checkpoint(tmp_path / f"{n}.pt") for n in runs}
    assert [ckpt[n].plan["precision"] for n in runs] == ["bf16", "bf16", "bf16", "fp32", "fp32"]
    weights = {n: c.resume_weights for n, c in ckpt.items()}  # the last step's (the kept may be the warm start)
    for a, b in (("amp", "bf16"), ("default", "bf16"), ("fp32", "tf32")):  # the same run, bit for bit
        assert all(torch.equal(weights[a][k], weights[b][k]) for k in weights[a]), (a, b)
    assert not all(torch.equal(weights["bf16"][k], weights["fp32"][k]) for k in weights["fp32"])
    lines = {n: {line["topic"]: line["what"] for line in c.plan["lines"]} for n, c in ckpt.items()}
    assert "fp32 (tf32 asked: a CPU has no TF32 tensor cores)" in lines["tf32"]["execution"]
    assert "bf16 autocast (this device's default; --precision fp32 computes in fp32)" in lines["default"]["execution"]
    assert "default" not in lines["bf16"]["execution"]
    assert ckpt["tf32"].train_config["precision"] == "tf32"  # what was asked; the plan says what ran
