"""Training throughput on synthetic in-memory batches (no I/O in the timed loop)."""

from __future__ import annotations

import statistics
import tempfile
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

from ctrkit import native, thread_split
from ctrkit.bench.config import TrainBenchConfig
from ctrkit.bench.peak import machine, matmul_gflops, matmul_peaks
from ctrkit.config import TrainConfig
from ctrkit.data.batch import Batch
from ctrkit.data.synthetic import power_law_ids
from ctrkit.device import amp_dtype_for, device_facts
from ctrkit.models.inputs import BottomTopConfig
from ctrkit.models.registry import config_class, config_to_dict, create_model, make_config
from ctrkit.models.storage import in_host, on_disk
from ctrkit.models.tiered_tables import tiers
from ctrkit.train.optim import SparseRowOptimizer, build_optimizers
from ctrkit.train.run import layered
from ctrkit.train.step import TrainStep


def make_batches(cfg: TrainBenchConfig, rng: np.random.Generator) -> list[Batch]:
    """Distinct random batches with power-law ids (so lookups hit hot and cold rows as real data does)."""
    out = []
    for _ in range(cfg.distinct_batches):
        sparse = np.stack(
            [power_law_ids(rng, cfg.table_rows, cfg.batch_size, 1.2) for _ in range(cfg.num_tables)], axis=1
        )  # (B, F)
        dense = rng.normal(0.0, 1.0, (cfg.batch_size, cfg.num_numerical)).astype(np.float32)  # (B, N)
        labels = (rng.random(cfg.batch_size) < 0.25).astype(np.float32)  # (B,)
        out.append(Batch(torch.from_numpy(dense), torch.from_numpy(sparse), torch.from_numpy(labels)))
    return out


def dense_flops_per_sample(model: torch.nn.Module, batch: Batch) -> dict[str, float]:
    """The model's matrix-multiply FLOPs per sample (its dense layers, DLRM's interaction, DCNv2's cross
    layers; embedding lookups are memory traffic, not FLOPs), counted from the operations' shapes by
    torch's FlopCounterMode over one forward and one backward of ``batch``: ``forward`` and ``train_step``
    (forward + backward)."""
    from torch.utils.flop_counter import FlopCounterMode

    n = len(batch.labels)
    # ATen's operations (not ctrkit/native's kernels, which the counter cannot see): the same model's FLOPs
    with native.suspended(), FlopCounterMode(display=False) as counter:
        logits = model(batch.numerical, batch.categorical)
        forward = counter.get_total_flops()
        torch.nn.functional.binary_cross_entropy_with_logits(logits.float(), batch.labels).backward()
    model.zero_grad(set_to_none=True)
    return {"forward": forward / n, "train_step": counter.get_total_flops() / n}


MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear")


def _optimizer_label(opt: torch.optim.Optimizer) -> str:
    name = type(opt).__name__ + (f"({opt.kind})" if isinstance(opt, SparseRowOptimizer) else "")
    part = "first-order " if opt.is_wide else ""
    return f"{name} on {part}{'tables' if opt.is_table_optimizer else 'dense weights'}"


def step_breakdown(step: TrainStep, batches: list[Batch], steps: int, sync) -> dict:
    """Where a training step's time goes: ``steps`` calls of ``step`` itself, with the model's forward and
    each optimizer's ``step`` timed (a forward hook and a wrapper on the optimizer's instance, removed
    afterwards); ``backward`` is the rest of the call (the loss, zeroing gradients, backward). ms per step,
    medians; then the matrix multiplies' self time (ms per step) from a profiled pass over the same steps."""
    if step._slice_count(batches[0]) > 1:
        return _split_breakdown(step, batches, steps)
    labels = [_optimizer_label(o) for o in step.optimizers]
    times: dict[str, list[float]] = {"forward": [], "backward": [], **{k: [] for k in labels}}
    started: list[float] = []

    def forward_started(*_):
        started.append(time.perf_counter())

    def forward_done(*_):
        sync()
        times["forward"].append(time.perf_counter() - started.pop())

    hooks = [step.model.register_forward_pre_hook(forward_started), step.model.register_forward_hook(forward_done)]
    try:
        with _timed_optimizers(step.optimizers, labels, times, sync):
            for i in range(steps):
                t0 = time.perf_counter()
                step(batches[i % len(batches)])
                sync()
                parts = [times[k][-1] for k in ("forward", *labels)]
                times["backward"].append(time.perf_counter() - t0 - sum(parts))
    finally:
        for h in hooks:
            h.remove()
    out = {k: statistics.median(v) * 1000 for k, v in times.items()}
    matmul, profiled = _profiled_pass(step, batches, steps)
    return {"ms": out, "total_ms": sum(out.values()), "matmul_ms": matmul, "profiled_step_ms": profiled}


@contextmanager
def _timed_optimizers(optimizers: list, labels: list[str], times: dict[str, list[float]], sync=lambda: None):
    """Inside the block, each optimizer's ``step`` appends its seconds to ``times[label]`` (a wrapper on the
    optimizer's instance, removed after)."""

    def timed(opt: torch.optim.Optimizer, label: str):
        original = opt.step

        def run(*args, **kwargs):
            t0 = time.perf_counter()
            out = original(*args, **kwargs)
            sync()
            times[label].append(time.perf_counter() - t0)
            return out

        return run

    for opt, label in zip(optimizers, labels):
        opt.step = timed(opt, label)
    try:
        yield
    finally:
        for opt in optimizers:
            del opt.step  # the class's step again


def _profiled_pass(step: TrainStep, batches: list[Batch], steps: int) -> tuple[float, float]:
    """The matrix multiplies' self time per step, summed over threads, from a profiled pass of ``steps`` steps, and
    that pass's wall time per step (profiled: slower than the timed steps, and the bound the matmuls' time lies
    within, times the threads)."""
    from torch.profiler import ProfilerActivity, profile

    started = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for i in range(steps):
            step(batches[i % len(batches)])
    wall = (time.perf_counter() - started) * 1000 / steps
    return sum(e.self_cpu_time_total for e in prof.key_averages() if e.key in MATMUL_OPS) / 1000 / steps, wall


def _split_breakdown(step: TrainStep, batches: list[Batch], steps: int) -> dict:
    """``step_breakdown`` of a step split over threads: the slices' forward and backward (the workers' first
    meeting), the optimizers (the next: each optimizer on one worker, several at once, and the tables' row updates in
    pieces taken by whichever worker is free) and the rest of the call; each optimizer's own time is listed beside
    (``optimizer_ms``: they overlap, so they do not add up). No matrix multiplies' time: torch's profiler does not see
    the workers."""
    n = step._slice_count(batches[0])
    team = thread_split.team(n)
    phases: list[float] = []
    labels = [_optimizer_label(o) for o in step.optimizers]
    own: dict[str, list[float]] = {k: [] for k in labels}

    def timed_run(jobs):
        t0 = time.perf_counter()
        out = thread_split.ThreadTeam.run(team, jobs)
        phases.append(time.perf_counter() - t0)
        return out

    team.run = timed_run
    totals = []
    try:
        with _timed_optimizers(step.optimizers, labels, own):
            for i in range(steps):
                t0 = time.perf_counter()
                step(batches[i % len(batches)])
                totals.append(time.perf_counter() - t0)
    finally:
        del team.run
    meetings = len(phases) // steps  # 2: the slices, then the optimizers with the tables' rows
    slices_s = phases[0::meetings]
    optimizers_s = [sum(phases[i + 1 : i + meetings]) for i in range(0, len(phases), meetings)]
    ms = lambda v: statistics.median(v) * 1000
    out = {
        f"forward and backward, {n} slices on {n} threads": ms(slices_s),
        f"optimizers and the tables' rows, spread over {n} threads": ms(optimizers_s),
        "the rest (slicing, gradients' bookkeeping)": ms(
            [t - a - b for t, a, b in zip(totals, slices_s, optimizers_s)]
        ),
    }
    # torch's profiler records the thread that starts it (and autograd's), not these workers: no matmul time
    return {"ms": out, "total_ms": sum(out.values()), "matmul_ms": None, "profiled_step_ms": None,
            "optimizer_ms": {k: ms(v) for k, v in own.items() if v}}  # fmt: skip


@dataclass
class BenchSetup:
    """What ``run_train_bench`` times: the model, its config, the training step and the batches (an in-process
    comparison takes the same from ``bench_setup``)."""

    model: torch.nn.Module
    model_cfg: Any
    step: TrainStep
    batches: list[Batch]
    amp_dtype: torch.dtype | None
    optimizers: dict[str, str]


def bench_setup(cfg: TrainBenchConfig, device: torch.device) -> BenchSetup:
    """The benchmark's model (seeded), its default optimizers at a small lr, its TrainStep and its batches."""
    torch.manual_seed(cfg.seed)
    shape = {
        "num_numerical": cfg.num_numerical,
        "cardinalities": (cfg.table_rows,) * cfg.num_tables,
        "embedding_dim": cfg.embedding_dim,
        "sparse_gradients": not cfg.dense_gradients,
    }
    shape.update({k: v for k, v in (("bottom_mlp", cfg.bottom_mlp), ("top_mlp", cfg.top_mlp)) if v is not None})
    # unless given, the Criteo-Kaggle bottom MLP, ending in the benchmark's width (a run's rule: ``run.layered``)
    has_bottom = "bottom_mlp" in config_class(cfg.model).__dataclass_fields__
    kaggle = [{"bottom_mlp": BottomTopConfig.bottom_mlp}] if has_bottom else []
    model_cfg = make_config(cfg.model, layered(cfg.model, *kaggle, shape))
    rows = cfg.embedding_cache_rows or cfg.table_rows * cfg.num_tables
    if cfg.embedding_storage == "disk":  # the tables in files of the temporary directory, unlinked at once
        model = create_model(cfg.model, model_cfg, on_disk(tempfile.gettempdir(), rows))
    elif cfg.embedding_storage == "host":  # the tables in the CPU's memory, their cache and the rest on the device
        model = create_model(cfg.model, model_cfg, in_host(rows, device)).to(device)
    else:
        model = create_model(cfg.model, model_cfg).to(device)
    # what `train --amp` would run on this device
    amp_dtype = amp_dtype_for(device_facts(device), cfg.amp, cfg.amp_dtype, cfg.batch_size)
    # the model's own optimizers unless given (a run's defaults: ``TrainConfig.resolve``), at a small lr so weights
    # stay sane
    names = TrainConfig(optimizer=cfg.optimizer, embedding_optimizer=cfg.embedding_optimizer).resolve(cfg.model)
    dense_opt, emb_opt = names.optimizer, names.embedding_optimizer
    optimizers = build_optimizers(model, dense_opt, 1e-3, emb_opt, 1e-3, names.wide_optimizer, 1e-3)
    step = TrainStep(model, optimizers, device, amp_dtype, compile=cfg.compile, split=cfg.split_batch)
    batches = [b.to(device) for b in make_batches(cfg, np.random.default_rng(cfg.seed))]
    return BenchSetup(model, model_cfg, step, batches, amp_dtype, {"dense": dense_opt, "embedding": emb_opt})


def run_train_bench(cfg: TrainBenchConfig, device: torch.device) -> dict:
    """Runs ``warmup`` untimed steps, then ``repeats`` x ``steps`` timed steps; reports the median."""
    setup = bench_setup(cfg, device)
    model, step, batches, amp_dtype = setup.model, setup.step, setup.batches, setup.amp_dtype
    flops = dense_flops_per_sample(model, batches[0])
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for i in range(cfg.warmup):
        step(batches[i % len(batches)])
    sync()
    times, paired = [], []
    peak_dtype = torch.float32 if amp_dtype is None else amp_dtype
    for _ in range(cfg.repeats):
        t0 = time.perf_counter()
        for i in range(cfg.steps):
            step(batches[i % len(batches)])
        sync()
        times.append((time.perf_counter() - t0) / cfg.steps)
        # the peak right after each repeat: a shared machine's speed drifts within a run
        paired.append(matmul_gflops(peak_dtype, seconds=0.2, rounds=1, device=device))
    ms = statistics.median(times) * 1000
    samples_per_s = cfg.batch_size / (ms / 1000)
    peaks = matmul_peaks(device)
    peak = peaks.get("bf16" if amp_dtype is not None else "fp32") or peaks["fp32"]
    achieved = flops["train_step"] * samples_per_s / 1e9
    fractions = [flops["train_step"] * cfg.batch_size / t / 1e9 / p for t, p in zip(times, paired)]
    breakdown = step_breakdown(step, batches, cfg.steps, sync) if cfg.breakdown else None
    return {
        "benchmark": "train",
        "breakdown": breakdown,
        "split_threads": step._slice_count(batches[0]),
        "config": asdict(cfg),
        "model_config": {k: v for k, v in config_to_dict(setup.model_cfg).items() if k != "cardinalities"},
        "samples_per_s": samples_per_s,
        "flops_per_sample": flops,
        "achieved_gflops": achieved,
        "fraction_of_peak": achieved / peak if peak else None,
        "peak_after_each_repeat_gflops": paired,
        "fraction_of_peak_per_repeat": fractions,
        "fraction_of_peak_paired": statistics.median(fractions),
        "ms_per_step": ms,
        "ms_per_step_all": [t * 1000 for t in times],
        "amp_dtype": str(amp_dtype).replace("torch.", "") if amp_dtype else None,
        "optimizers": setup.optimizers,
        "device": str(device),
        "machine": machine(),
        "matmul_peak_gflops": peaks,
        "embedding_cache": [
            {"rows": t.cache_rows, "hits": t.hits, "misses": t.misses, "evicted": t.evicted} for t in tiers(model)
        ],  # fmt: skip
    }
