"""Where a benchmark ran (``machine``: CPU model, capability and matrix features, cores, torch build, threads
and how idle OpenMP threads wait) and the machine's measured matrix-multiply peak, taken in the same run as a
benchmark so that achieved throughput can be read as a fraction of what these cores do (not of a datasheet
figure)."""

from __future__ import annotations

import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from ctrkit.device import cpu_matrix_features, cpu_native_bf16


def machine() -> dict[str, Any]:
    """Where the benchmark ran: CPU model, capability and matrix features (AMX among them), cores, torch
    build, threads and how idle OpenMP threads wait (the environment's OMP_WAIT_POLICY and GOMP_SPINCOUNT)."""
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": model, "capability": torch.backends.cpu.get_cpu_capability(), "native_bf16": cpu_native_bf16(),
            "cpu_features": cpu_matrix_features(),
            "cores": os.cpu_count(), "torch": torch.__version__,
            "threads": torch.get_num_threads(), "python": platform.python_version(),
            # how idle OpenMP threads wait moves CPU throughput (docs/decisions/omp-wait-policy.md)
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"), "gomp_spincount": os.environ.get("GOMP_SPINCOUNT"),
            "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None}  # fmt: skip


def matmul_gflops(dtype: torch.dtype = torch.float32, n: int = 2048, seconds: float = 0.3, rounds: int = 3,
                  device: torch.device | None = None) -> float:  # fmt: skip
    """GFLOP/s of (m x m) @ (m x m) in ``dtype``: the median of ``rounds`` rounds of ``seconds`` each. ``m`` is
    ``n`` unless one multiply at ``n`` would outlast a round: then the largest power of two from 256 up whose
    multiply fits (a dtype the hardware only emulates, bf16 on a CPU without it, runs ~100x slower, and one
    2048-square multiply would take minutes)."""
    device = device or torch.device("cpu")
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def square(m: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(m, m, device=device).to(dtype), torch.randn(m, m, device=device).to(dtype)

    m = min(256, n)
    while m < n:  # doubling m takes 8x the time: grow while the next size's multiply still fits a round
        a, b = square(m)
        a @ b  # (the first multiply of a size pays for its setup)
        sync()
        start = time.perf_counter()
        a @ b
        sync()
        if 8 * (time.perf_counter() - start) > seconds:
            break
        m *= 2
    a, b = square(m)
    for _ in range(2):
        a @ b
    sync()
    rates = []
    for _ in range(rounds):
        count, start = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - start) < seconds:
            a @ b
            sync()
            count += 1
        rates.append(2 * m**3 * count / elapsed / 1e9)
    return statistics.median(rates)


def matmul_peaks(device: torch.device | None = None) -> dict[str, float | None]:
    """fp32 and (where the hardware computes it natively) bf16 matmul GFLOP/s on ``device``."""
    device = device or torch.device("cpu")
    bf16 = device.type == "cuda" or cpu_native_bf16()
    return {
        "fp32": matmul_gflops(torch.float32, device=device),
        "bf16": matmul_gflops(torch.bfloat16, device=device) if bf16 else None,
    }


def where_it_ran(device: torch.device | None = None) -> dict[str, Any]:
    """``machine()`` and ``matmul_peaks(device)`` as a benchmark's JSON records them (keys ``machine`` and
    ``matmul_peak_gflops``)."""
    return {"machine": machine(), "matmul_peak_gflops": matmul_peaks(device)}
