"""In-process A/B timing of a training step under several variants (the scripts in benchmarks/results/*/ab.py):
the same model, optimizers and batches in one process, each variant switched on by a function, in interleaved rounds
so that a machine whose speed drifts (README, Benchmarks) moves every variant alike. Compare the medians of the
per-round ratios, not single rounds."""

from __future__ import annotations

import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ctrkit import native


def interleaved_rounds(step: Callable[[Any], Any], batches: Sequence, variants: Mapping[str, Callable[[], Any]],
                       rounds: int, steps: int, warmup: int = 2) -> dict[str, list[float]]:  # fmt: skip
    """ms per step of ``step`` over ``batches`` (cycled) under each variant, one figure per round: each round calls
    every variant's switch and runs ``warmup`` untimed steps, then ``steps`` timed ones; the variants' order rotates
    by one each round (two variants: alternating)."""
    names = list(variants)
    times: dict[str, list[float]] = {k: [] for k in names}
    for r in range(rounds):
        for k in names[r % len(names) :] + names[: r % len(names)]:
            variants[k]()
            for i in range(warmup):
                step(batches[i % len(batches)])
            t0 = time.perf_counter()
            for i in range(steps):
                step(batches[i % len(batches)])
            times[k].append((time.perf_counter() - t0) / steps * 1e3)
    return times


def summary(times: Mapping[str, Sequence[float]], base: str, label: str = "") -> list[str]:
    """One line a variant: the median ms a step, the median of the per-round ratios ``base`` / variant, and the
    rounds."""
    lines = []
    for k, v in times.items():
        ratio = statistics.median(a / b for a, b in zip(times[base], v))
        lines.append(f"{label}{k}: median {statistics.median(v):.2f} ms a step; {base} / {k} per round median "
                     f"{ratio:.3f}; rounds {[round(x, 2) for x in v]}")  # fmt: skip
    return lines


def native_library_at(commit: str):
    """ctrkit/native's kernels as they were at ``commit`` (its sources, from git, built with this tree's flags), for
    a script that swaps them in (``native._loaded[0] = ...``) or calls them beside this tree's."""
    with tempfile.TemporaryDirectory() as tmp:
        for name in (*native.SOURCES, *native.HEADERS):
            shown = subprocess.run(["git", "show", f"{commit}:ctrkit/native/{name}"], capture_output=True, text=True,
                                   check=True, cwd=Path(native.__file__).parent)  # fmt: skip
            (Path(tmp) / name).write_text(shown.stdout)
        return native.build(sources=tmp)
