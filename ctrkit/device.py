"""Run-time device choice: CUDA when present, else CPU; never hard-coded below the CLI."""

from __future__ import annotations

import torch


def resolve_device(name: str | None = None) -> torch.device:
    """``None``/``"auto"``: CUDA if available, else CPU; otherwise the named device, checked."""
    if name in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"`device` {name}: CUDA was requested but no CUDA device is available")
    return device


def amp_dtype_for(device: torch.device, amp: bool, amp_dtype: str | None) -> torch.dtype | None:
    """The autocast dtype for ``--amp``: bf16 on CPU, fp16 on CUDA unless ``amp_dtype`` says otherwise."""
    if not amp:
        return None
    name = amp_dtype or ("fp16" if device.type == "cuda" else "bf16")
    if name == "fp16" and device.type == "cpu":
        raise ValueError("`amp_dtype` fp16 is not supported on CPU; use bf16")
    return torch.float16 if name == "fp16" else torch.bfloat16
