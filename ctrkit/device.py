"""Run-time device choice: CUDA when present, else CPU; never hard-coded below the CLI. And the precision
rule: bf16 on a CPU only where the cores compute it natively (AVX512-BF16 or AMX on x86, BF16 on Arm).

On an AVX2-only CPU every bf16 operation is emulated and autocast trains many times slower than fp32
(docs/decisions/precision.md); so ``--amp`` and ``serve --dtype bf16`` fall back to fp32 there and say so in
one line. ``CTRKIT_CPU_BF16=0`` or ``1`` overrides the
detection (tests use it to act as the other kind of machine).
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

NATIVE_BF16_FLAGS = {"avx512_bf16", "amx_bf16", "bf16"}  # x86 AVX512-BF16 / AMX, Arm FEAT_BF16
# the flags that decide how fast matrix arithmetic runs: vector width, fused multiply-add, native bf16 and
# AMX's tile units (benchmark results are kept per machine kind)
MATRIX_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8",
                "asimd", "bf16", "sve")  # fmt: skip
_said: set = set()  # what has been said once


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags from /proc/cpuinfo (x86 "flags", Arm "Features"); empty where unreadable."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    return frozenset(value.split())
    except OSError:
        pass
    return frozenset()


def cpu_matrix_features() -> list[str]:
    """Which of ``MATRIX_FLAGS`` this CPU has, in that order (what separates the AVX2, AVX-512 and AMX kinds
    of machine beyond torch's capability string, which says ``AVX512`` on all but the first)."""
    flags = cpu_flags()
    return [f for f in MATRIX_FLAGS if f in flags]


def cpu_native_bf16() -> bool:
    """Whether this CPU computes bf16 natively (else bf16 is emulated: many times slower than fp32)."""
    override = os.environ.get("CTRKIT_CPU_BF16")
    if override in ("0", "1"):
        return override == "1"
    return bool(NATIVE_BF16_FLAGS & cpu_flags())


def cpu_kind() -> str:
    """torch's CPU capability plus whether bf16 is native, e.g. "AVX512 + native bf16" or "AVX2"."""
    return torch.backends.cpu.get_cpu_capability() + (" + native bf16" if cpu_native_bf16() else "")


@dataclass(frozen=True)
class DeviceFacts:
    """What the precision rules read of a device (``device_facts``), so that a plan is decided from facts alone:
    ``kind`` (cpu, cuda, mps), ``native_bf16`` (a CPU with AVX512-BF16, AMX or Arm BF16; a GPU with bf16 tensor
    cores), ``tf32`` (TF32 tensor cores) and ``name`` (said in messages: the CPU's capability, the GPU's name)."""

    kind: str
    native_bf16: bool = False
    tf32: bool = False
    name: str = ""


AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}  # a precision's autocast dtype (none for fp32, tf32)


@dataclass(frozen=True)
class Precision:
    """What a run computes in, as its plan decides it (``plan.decide_precision``): ``name`` fp32, tf32, bf16 or
    fp16 (``precision_of``), ``why`` it is fp32 where more was asked ("" otherwise), and ``scored_in``, the autocast
    precision its evaluations score in (bf16 or fp16; None: fp32; ``eval_dtype_for``)."""

    name: str = "fp32"
    why: str = ""
    scored_in: str | None = None

    @property
    def autocast(self) -> torch.dtype | None:
        """The training's autocast dtype (None: none)."""
        return AUTOCAST.get(self.name)

    @property
    def scoring(self) -> torch.dtype | None:
        """The evaluations' autocast dtype (None: fp32)."""
        return AUTOCAST.get(self.scored_in) if self.scored_in else None


def device_facts(device: torch.device) -> DeviceFacts:
    """``device``'s facts, read from the hardware (``CTRKIT_CPU_BF16`` overrides a CPU's bf16)."""
    if device.type == "cpu":
        return DeviceFacts("cpu", cpu_native_bf16(), False, torch.backends.cpu.get_cpu_capability())
    if device.type == "cuda":
        tensor_cores = cuda_native_bf16(device)  # bf16 and TF32 tensor cores came together (compute capability 8.0)
        return DeviceFacts("cuda", tensor_cores, tensor_cores, torch.cuda.get_device_name(device))
    return DeviceFacts(device.type, False, False, device.type)


def cpu_bf16_or_fp32(what: str, facts: DeviceFacts | None = None) -> bool:
    """True when ``what`` (a flag asking for bf16 on the CPU) may use bf16 on the CPU of ``facts`` (None: this
    one); otherwise says once, in one line on stderr, that it runs in fp32 and why, and returns False."""
    facts = facts or device_facts(torch.device("cpu"))
    if facts.native_bf16:
        return True
    if what not in _said:
        _said.add(what)
        print(
            f"ctrkit: {what}: this CPU ({facts.name}) has no native bf16 (AVX512-BF16, AMX or Arm BF16), where bf16 "
            "runs many times slower than fp32; running in fp32",
            file=sys.stderr,
            flush=True,
        )
    return False


def openmp_threads_sleep() -> bool:
    """Whether OpenMP's idle threads sleep between parallel regions: ``OMP_WAIT_POLICY=passive`` without a
    ``GOMP_SPINCOUNT`` (libgomp then spins 0 times; `make` and the benchmarks run so). Each parallel region then
    pays for waking them (docs/decisions/omp-wait-policy.md); by default libgomp spins a while first and the next
    region finds them awake."""
    spin = os.environ.get("GOMP_SPINCOUNT", "").strip()
    return os.environ.get("OMP_WAIT_POLICY", "").strip().lower() == "passive" and spin in ("", "0")


@contextmanager
def one_thread(when: bool = True) -> Iterator[None]:
    """Runs the block on one intra-op thread where ``when`` holds, the process's count back afterwards (also after
    an error); otherwise it changes nothing."""
    threads = torch.get_num_threads()
    if not when or threads == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def one_thread_where_threads_sleep(device: torch.device):
    """``one_thread`` when ``device`` is the CPU and idle threads sleep (``openmp_threads_sleep``): for short work
    made of parallel regions that each wake the other threads, such as the sort of a batch's ids (a radix sort of
    several passes). Elsewhere it changes nothing."""
    return one_thread(device.type == "cpu" and openmp_threads_sleep())


def resolve_device(name: str | None = None) -> torch.device:
    """``None``/``"auto"``: CUDA if available, else CPU; otherwise the named device, checked."""
    if name in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"`device` {name}: CUDA was requested but no CUDA device is available")
    return device


def cuda_native_bf16(device: torch.device) -> bool:
    """Whether this GPU has bf16 tensor cores (compute capability 8.0 on: Ampere, Hopper and later)."""
    return torch.cuda.get_device_capability(device)[0] >= 8


# On CUDA, autocast pays only with large batches: below these, a step is bound by launching kernels, not by
# arithmetic, and autocast's casts add kernels (measured on an H100: docs/decisions/precision.md).
CUDA_AMP_MIN_TRAIN_BATCH = 16_384
CUDA_AMP_MIN_SCORE_BATCH = 32_768


def amp_dtype_for(
    device: DeviceFacts, amp: bool, amp_dtype: str | None, batch: int | None = None, training: bool = True
) -> torch.dtype | None:
    """The autocast dtype for ``--amp`` unless ``amp_dtype`` names one: bf16 on CPU; on CUDA bf16 where the
    GPU has bf16 tensor cores (no loss scaling needed; faster than fp16 on an H100: docs/decisions/precision.md),
    else fp16. None (fp32) on a CPU without native bf16, and, when ``amp_dtype`` is not named, on CUDA when
    ``batch`` (the samples one process's step or forward pass takes) is below ``CUDA_AMP_MIN_TRAIN_BATCH``
    (``training``) or ``CUDA_AMP_MIN_SCORE_BATCH``; each said once on stderr."""
    if not amp:
        return None
    name = amp_dtype or ("fp16" if device.kind == "cuda" and not device.native_bf16 else "bf16")
    if name == "fp16" and device.kind == "cpu":
        raise ValueError("`amp_dtype` fp16 is not supported on CPU; use bf16")
    if device.kind == "cpu" and not cpu_bf16_or_fp32("--amp", device):
        return None
    least = CUDA_AMP_MIN_TRAIN_BATCH if training else CUDA_AMP_MIN_SCORE_BATCH
    if device.kind == "cuda" and amp_dtype is None and batch is not None and batch < least:
        what = "a training step" if training else "a forward pass"
        if ("cuda", training) not in _said:
            _said.add(("cuda", training))
            forced = "--amp-dtype bf16 or fp16 forces it" if training else f"--batch-size {least} or more takes it"
            print(
                f"ctrkit: --amp: {batch:,} samples {what} on CUDA is below {least:,}, where {name} autocast runs "
                f"slower than fp32 (the step is bound by launching kernels, not by arithmetic); running in fp32 "
                f"({forced})",
                file=sys.stderr,
                flush=True,
            )
        return None
    return torch.float16 if name == "fp16" else torch.bfloat16


def eval_dtype_for(
    device: DeviceFacts, eval_dtype: str | None, amp_dtype: torch.dtype | None, asked: bool
) -> torch.dtype | None:
    """The autocast dtype a run scores in (``--eval-dtype``). Unset: the training's ``amp_dtype`` where its
    precision was asked for (``asked``: ``--amp`` or ``--precision``), else None: a run in its device's default
    precision scores in fp32, as ``evaluate``, ``predict`` and ``serve`` score its checkpoint. None for fp32, and
    for bf16 bfloat16 on a CPU with native bf16 (else fp32, said once) or on CUDA (fp16 on GPUs without bf16 tensor
    cores)."""
    if eval_dtype is None:
        return amp_dtype if asked else None
    if eval_dtype == "fp32":
        return None
    if device.kind == "cpu":
        return torch.bfloat16 if cpu_bf16_or_fp32("--eval-dtype bf16", device) else None
    return torch.bfloat16 if device.kind != "cuda" or device.native_bf16 else torch.float16


def default_precision(device: DeviceFacts, batch: int | None = None) -> str:
    """What a run on ``device`` computes in where neither a precision nor ``--amp`` is given, as measured for each
    kind of device (docs/decisions/precision.md): bf16 autocast on a CPU that computes bf16 natively, and on a GPU
    with bf16 tensor cores where one process's step takes ``CUDA_AMP_MIN_TRAIN_BATCH`` samples or more (``batch``;
    None: unknown, taken as large); fp32 on other CPUs (bf16 emulated), on older GPUs and at smaller GPU steps
    (bound by launching kernels, where autocast's casts cost more than its arithmetic saves)."""
    if device.kind == "cpu":
        return "bf16" if device.native_bf16 else "fp32"
    if device.kind == "cuda" and device.native_bf16 and (batch is None or batch >= CUDA_AMP_MIN_TRAIN_BATCH):
        return "bf16"
    return "fp32"


def precision_of(
    device: DeviceFacts, precision: str | None, amp: bool, amp_dtype: str | None, batch: int | None = None
) -> tuple[str, torch.dtype | None, str]:
    """What a training run computes in, by name, its autocast dtype (None: none), and why it computes in fp32 where
    something else was asked ("" otherwise). ``precision`` named: fp32; tf32 (fp32 weights and activations, matmuls on
    TF32 tensor cores: CUDA GPUs that have them; fp32 elsewhere, said once); bf16 or fp16 autocast at any batch (as
    ``--amp --amp-dtype``; the CPU's bf16 rule applies). Unnamed: ``amp_dtype`` at any batch where it is named (with
    or without ``amp``), ``--amp``'s rule (``amp_dtype_for``), else the device's default (``default_precision``)."""
    if precision is None and not amp and amp_dtype is None:
        precision = default_precision(device, batch)
    if precision == "fp16" and device.kind == "cpu":
        raise ValueError("`precision` fp16 is not supported on CPU; use bf16")
    if precision == "tf32":
        if device.kind == "cuda" and device.tf32:
            return "tf32", None, ""
        where = "a CPU" if device.kind == "cpu" else "this GPU"
        if "tf32" not in _said:
            _said.add("tf32")
            print(f"ctrkit: --precision tf32: {where} has no TF32 tensor cores; running in fp32", file=sys.stderr,
                  flush=True)  # fmt: skip
        return "fp32", None, f"{where} has no TF32 tensor cores"
    if precision == "fp32":
        return "fp32", None, ""
    dtype = amp_dtype_for(device, True, precision or amp_dtype, batch)
    if dtype is not None:
        return ("bf16" if dtype == torch.bfloat16 else "fp16"), dtype, ""
    if device.kind == "cpu":
        return "fp32", None, "this CPU has no native bf16"
    return "fp32", None, f"{batch:,} samples a step is below {CUDA_AMP_MIN_TRAIN_BATCH:,}, where autocast is slower"


@contextmanager
def tf32_matmuls(on: bool) -> Iterator[None]:
    """Within, with ``on``, CUDA matmuls and convolutions of fp32 tensors run on TF32 tensor cores; torch's flags
    are as they were afterwards (a run's precision, not the process's)."""
    if not on:
        yield
        return
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before
