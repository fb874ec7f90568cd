"""The GPU check's measurements, one section a process (``benchmarks/run_gpu.sh`` runs them all on one GPU, in
about 7 minutes; each section also runs on the CPU at small sizes, which is how its test keeps it working):

- ``step``: ctrkit's training step (``TrainStep``, the ``nvidia`` recipe's DLRM) against a plain PyTorch DLRM (one
  flat ``nn.Embedding(sparse=True)``, ``bmm`` interaction, ``torch.optim.SGD``) on the same batches already on the
  device, in fp32, TF32 and bf16 autocast, interleaved rounds.
- ``e2e``: ``ctrkit train --recipe nvidia`` in each precision, as a user runs it but with no validation split (no
  model selection's copy at the end): its samples a second (the log's windows after the first) against the step
  alone of the same precision (the ``step`` section's JSON), and the seconds from the process's start to its first
  step (the log's ``first_step``).
- ``host``: the same model trained over the same stream of batches with its tables on the GPU, then in host memory
  (``--embedding-storage host``) with the process capped on the GPU (``torch.cuda.set_per_process_memory_fraction``)
  at ``--cap`` of the tables' bytes, its cache what the step leaves of that: samples a second of each over
  ``--steps`` batches after a quarter as many untimed (the cache filled from cold), and the cache's hit rate.
- ``syncs``: the training loop's host synchronisations: the feed and the step over ``--steps`` batches under
  ``torch.cuda.set_sync_debug_mode("warn")``, each synchronising call counted with where ctrkit made it.
- ``resume``: ``ctrkit train --recipe nvidia`` saving its checkpoint, then resumed from it: the start to the first
  step of each (the resumed run loads its tables instead of drawing them), and the checkpoint's size.
- ``profile``: where the step's time goes (issue #82): ``--steps`` steps of ctrkit's step in bf16 (fp32 on a CPU)
  under ``torch.profiler``, each operator's device time (CPU time on a CPU) put in one of ``PROFILE_PARTS`` (table
  lookups, the table update, the dense layers, the interaction, the optimizer, copies, the rest), beside each part's
  bound on this device: the bytes it must move at the bandwidth a large copy reaches here, the FLOPs at the rate a
  large matrix product reaches here.

Each section writes ``<section>.json`` into ``--out``; ``benchmarks/render.py`` does not read them (the docs'
benchmarks page quotes them).
"""

from __future__ import annotations

import argparse
import gc
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from contextlib import nullcontext
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from compare_train import F_LOSS, PlainDLRM  # noqa: E402

from ctrkit.bench.peak import machine  # noqa: E402
from ctrkit.data.dataset import SplitBinaryDataset  # noqa: E402
from ctrkit.data.device_feed import DeviceFeed, narrow_on  # noqa: E402
from ctrkit.data.feature_spec import FeatureSpec  # noqa: E402
from ctrkit.data.loader import BatchLoader  # noqa: E402
from ctrkit.device import tf32_matmuls  # noqa: E402
from ctrkit.models.registry import create_model  # noqa: E402
from ctrkit.models.storage import in_host, on_device  # noqa: E402
from ctrkit.models.tiered_tables import tiers  # noqa: E402
from ctrkit.train.optim import build_optimizers  # noqa: E402
from ctrkit.train.run import resolve_run  # noqa: E402
from ctrkit.train.step import TrainStep  # noqa: E402

PRECISIONS = ("fp32", "tf32", "bf16")
LR = 0.01  # the step's sections train at a constant rate (the recipe's 24 is reached after its warmup)


def _recipe(dataset: Path, dim: int | None) -> tuple:
    """The ``nvidia`` recipe's DLRM config and batch size on ``dataset`` (``dim``: another width)."""
    spec = resolve_run(dataset, "dlrm", recipe="nvidia", model_config={"embedding_dim": dim} if dim else None,
                       progress=False)  # fmt: skip
    return spec.model_config, spec.train.batch_size


def _feed(dataset: Path, batch_size: int, device: torch.device):
    """The training mapping's first epoch on ``device``, read and fed as training reads it."""
    train = SplitBinaryDataset(FeatureSpec.from_yaml(dataset), "train")
    loader = BatchLoader(train, batch_size, shuffle=True, seed=0, narrow=narrow_on(device))
    return DeviceFeed(device)(loader.epoch(0))


def _batches(dataset: Path, batch_size: int, device: torch.device, count: int) -> list:
    """``count`` batches of the training mapping on ``device`` (``_feed``'s first)."""
    feed = _feed(dataset, batch_size, device)
    try:
        return [b for _, b in zip(range(count), feed)]
    finally:
        feed.close()


def _context(precision: str, device: torch.device, autocast: bool = True):
    """What a step runs under for ``precision``: TF32 matmuls, or (``autocast``: the plain model's; ctrkit's step
    takes its own) bf16 autocast, or nothing."""
    if precision == "tf32":
        return tf32_matmuls(True)
    if precision == "bf16" and autocast:
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return nullcontext()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _ctrkit_step(model_config, device: torch.device, storage=None, precisions=("fp32",), split: str = "auto"):
    """The model (tables where ``storage`` says, else made on ``device``) and a ``TrainStep`` of it a precision
    (sharing its optimizers; bf16's with its autocast, as ``train --precision bf16`` runs; ``split``: TrainStep's,
    a CPU step's batch over threads)."""
    torch.manual_seed(0)
    model = create_model("dlrm", model_config, storage if storage is not None else on_device(device)).to(device)
    optimizers = build_optimizers(model, "sgd", LR, "sgd", LR)
    steps = {p: TrainStep(model, optimizers, device, torch.bfloat16 if p == "bf16" else None, split=split)
             for p in precisions}  # fmt: skip
    return model, steps


def _plain_step(model_config, device: torch.device):
    torch.manual_seed(0)
    with torch.device(device):
        model = PlainDLRM(model_config.cardinalities, model_config.embedding_dim, model_config.num_numerical,
                          model_config.bottom_mlp, model_config.top_mlp)  # fmt: skip
    opt = torch.optim.SGD(model.parameters(), lr=LR)

    def step(b):
        loss = F_LOSS(model(b.numerical, b.categorical).float(), b.labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss.detach()

    return step


def step_section(a) -> dict:
    """ctrkit's step against the plain DLRM on the same batches, per precision, interleaved rounds."""
    device = torch.device(a.device)
    model_config, batch_size = _recipe(a.dataset, a.dim)
    batch_size = a.batch_size or batch_size
    batches = _batches(a.dataset, batch_size, device, a.distinct)
    precisions = [p for p in a.precisions.split(",") if p != "tf32" or device.type == "cuda"]
    t0 = time.perf_counter()
    _, ctrkit = _ctrkit_step(model_config, device, precisions=precisions)
    _sync(device)
    built = time.perf_counter() - t0
    plain = _plain_step(model_config, device)
    names = ("ctrkit", "plain_pytorch")

    def run(name: str, p: str, count: int) -> None:
        with _context(p, device, autocast=name != "ctrkit"):
            step = ctrkit[p] if name == "ctrkit" else plain
            for i in range(count):
                step(batches[i % len(batches)])

    times = {p: {n: [] for n in names} for p in precisions}
    for p in precisions:  # warmup (autocast's and TF32's kernels chosen)
        for name in names:
            run(name, p, a.warmup)
        _sync(device)
    for r in range(a.rounds):
        for p in precisions:
            for name in names if r % 2 == 0 else names[::-1]:
                _sync(device)
                t = time.perf_counter()
                run(name, p, a.steps)
                _sync(device)
                times[p][name].append((time.perf_counter() - t) / a.steps)
    rates = {p: {n: batch_size / statistics.median(t) for n, t in by.items()} for p, by in times.items()}
    return {
        "section": "step",
        "batch_size": batch_size,
        "embedding_dim": model_config.embedding_dim,
        "table_values": sum(model_config.cardinalities) * model_config.embedding_dim,
        "ctrkit_build_s": built,
        "samples_per_s": rates,
        "ms_per_step_rounds": {p: {n: [x * 1000 for x in t] for n, t in by.items()} for p, by in times.items()},
        "ctrkit_speedup": {p: r["ctrkit"] / r["plain_pytorch"] for p, r in rates.items()},
    }


def _train(
    a, log: Path, *extra: str, steps: int | None = None
) -> tuple[subprocess.CompletedProcess, list[dict], float]:
    """``ctrkit train --recipe nvidia`` on ``--dataset`` for ``steps`` (default ``--max-steps``) with no validation
    split (no model selection: the run's time is its training), logging to ``log``: the finished process, its log's
    records (none where it failed) and its wall seconds."""
    log.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "ctrkit", "train", "--dataset", str(a.dataset), "--recipe", "nvidia",
           "--model", "dlrm", "--device", a.device, "--max-steps", str(steps or a.max_steps),
           "--print-freq", str(a.print_freq), "--log-path", str(log), "--no-progress", "--validation-fraction", "0",
           *extra]  # fmt: skip
    if a.dim:
        cmd += ["--embedding-dim", str(a.dim)]
    if a.batch_size:
        cmd += ["--batch-size", str(a.batch_size)]
    t = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t
    records = [json.loads(line) for line in log.read_text().splitlines()] if done.returncode == 0 else []
    return done, records, wall


def _error(done: subprocess.CompletedProcess) -> list[str]:
    return done.stderr.strip().splitlines()[-1:] or ["exit status " + str(done.returncode)]


def _first_step(records: list[dict]) -> dict:
    """The log's ``first_step`` record: its step and the seconds since the process started (``since_start``)."""
    return next(r for r in records if r["event"] == "first_step")


def e2e_section(a) -> dict:
    """``ctrkit train --recipe nvidia`` per precision: samples a second after the first window, the start."""
    step = json.loads((a.out / "step.json").read_text()) if (a.out / "step.json").exists() else None
    runs = {}
    for p in a.precisions.split(","):
        if p == "tf32" and a.device == "cpu":
            continue
        done, records, wall = _train(a, a.out / f"e2e_{p}.jsonl", "--precision", p)
        if done.returncode != 0:
            runs[p] = {"error": _error(done)}
            continue
        windows = [r["samples_per_s"] for r in records if r["event"] == "train"]
        rate = statistics.median(windows[1:] or windows)
        execution = [line.strip() for line in done.stderr.splitlines() if "execution" in line]
        run = {"samples_per_s": rate, "windows": windows, "start_to_first_step_s": _first_step(records)["since_start"],
               "wall_s": wall, "plan_execution": execution}  # fmt: skip
        if step is not None and p in step["samples_per_s"]:
            run["of_step_alone"] = rate / step["samples_per_s"][p]["ctrkit"]
        runs[p] = run
    return {"section": "e2e", "max_steps": a.max_steps, "print_freq": a.print_freq, "runs": runs}


def resume_section(a) -> dict:
    """A run in the device's default precision that saves its checkpoint at the end, then the same run resumed
    from it for ``--print-freq`` more steps: the start to the first step of each (the resumed run's tables are
    loaded from the memory-mapped checkpoint where the run trains, never drawn first), the checkpoint's size. The
    checkpoint and the files beside it are deleted afterwards."""
    a.work.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=a.work))
    saved = work / "resume.pt"
    try:
        done, fresh, fresh_wall = _train(a, a.out / "resume_fresh.jsonl", "--save-checkpoint", str(saved))
        if done.returncode != 0:
            return {"section": "resume", "error": _error(done)}
        size = saved.stat().st_size
        done, again, again_wall = _train(a, a.out / "resume_resumed.jsonl", "--load-checkpoint", str(saved),
                                         steps=a.max_steps + a.print_freq)  # fmt: skip
        if done.returncode != 0:
            return {"section": "resume", "error": _error(done)}
    finally:
        shutil.rmtree(work)
    first = _first_step(again)
    return {
        "section": "resume",
        "checkpoint_bytes": size,
        "fresh": {"start_to_first_step_s": _first_step(fresh)["since_start"], "wall_s": fresh_wall},
        "resumed": {"start_to_first_step_s": first["since_start"], "from_step": first["step"], "wall_s": again_wall},
    }


def _train_over(step, batches, device: torch.device, untimed: int) -> float:
    """Samples a second of ``step`` over ``batches``, the first ``untimed`` not timed (a tier's cache filling)."""
    for b in batches[:untimed]:
        step(b)
    _sync(device)
    t = time.perf_counter()
    for b in batches[untimed:]:
        step(b)
    _sync(device)
    return sum(len(b) for b in batches[untimed:]) / (time.perf_counter() - t)


def host_section(a) -> dict:
    """The tables on the GPU, then in host memory with the whole process capped on the GPU at ``--cap`` of the
    tables' bytes (the cache sized to what the step's own work leaves of it), over the same batches."""
    device = torch.device(a.device)
    model_config, batch_size = _recipe(a.dataset, a.dim)
    batch_size = a.batch_size or batch_size
    untimed = max(2, a.steps // 4)  # the cache filled from cold over the first quarter, then timed as it runs on
    batches = _batches(a.dataset, batch_size, device, a.steps + untimed)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    model, steps = _ctrkit_step(model_config, device)
    table_bytes = model.embeddings.onehot.weight.nbytes
    in_gpu = _train_over(steps["fp32"], batches, device, untimed)
    del model, steps
    gc.collect()
    rows, lookups = sum(model_config.cardinalities), batch_size * len(model_config.cardinalities)
    cap = work = None
    if device.type == "cuda":  # the whole process held to ``cap`` of the tables' bytes: the cache gets what is left
        work = torch.cuda.max_memory_allocated(device) - table_bytes  # the batches, the dense model, the step's work
        room = int(a.cap * table_bytes)
        per_row = model_config.embedding_dim * 4 + 4 + 8 + 8 + 8 + 1  # a cached row, its slot map and bookkeeping
        # the tiered step's work is about twice the in-GPU step's (the rows it moves between the tiers, their
        # gradients): with the cache at (room - work) * 0.9 the H200's first run ran out of memory in the step
        cache_rows = int((room - 2 * work - rows * 4) * 0.8 / per_row)
        torch.cuda.empty_cache()
        cap = room / torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(cap, torch.cuda.current_device() if device.index is None else device)
    else:  # no cap on a CPU: the cache is ``cap`` of the rows
        cache_rows = int(rows * a.cap)
    cache_rows = max(cache_rows, lookups)  # at least a step's rows
    model, steps = _ctrkit_step(model_config, device, in_host(cache_rows, device))
    in_host_rate = _train_over(steps["fp32"], batches, device, untimed)
    (tier,) = tiers(model)
    return {
        "section": "host",
        "batch_size": batch_size,
        "table_bytes": table_bytes,
        "cache_rows": cache_rows,
        "steps": a.steps,
        "untimed_steps": untimed,
        "table_rows": rows,
        "cap_of_tables": a.cap,
        "gpu_memory_fraction": cap,
        "step_work_bytes": work,
        "samples_per_s": {"tables_on_gpu": in_gpu, "tables_in_host_memory": in_host_rate},
        "host_of_gpu": in_host_rate / in_gpu,
        "cache": {
            "hits": tier.hits,
            "misses": tier.misses,
            "evicted": tier.evicted,
            "hit_rate": tier.hits / max(tier.hits + tier.misses, 1),
        },  # fmt: skip
    }


def syncs_section(a) -> dict:
    """The host synchronisations of the feed and the step over ``--steps`` batches, with where ctrkit made them."""
    device = torch.device(a.device)
    model_config, batch_size = _recipe(a.dataset, a.dim)
    batch_size = a.batch_size or batch_size
    step = _ctrkit_step(model_config, device)[1]["fp32"]
    feed = _feed(a.dataset, batch_size, device)
    loss = torch.zeros((), device=device)
    for b in [next(feed) for _ in range(2)]:  # warmup: the first steps allocate and choose kernels
        loss += step(b)
    where: dict[str, int] = {}

    def seen(message, category, filename, lineno, file=None, line=None) -> None:  # at the warning: its stack
        if "synchroniz" not in str(message):
            return
        frames = [f for f in traceback.extract_stack() if "/ctrkit/" in f.filename]
        key = f"{Path(frames[-1].filename).name}:{frames[-1].lineno} ({frames[-1].name})" if frames else filename
        where[key] = where.get(key, 0) + 1

    steps = 0
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = seen
        if device.type == "cuda":
            torch.cuda.set_sync_debug_mode("warn")
        try:
            for _, b in zip(range(a.steps), feed):
                loss += step(b)  # as the trainer's window sums it: read at its records only
                steps += 1
        finally:
            if device.type == "cuda":
                torch.cuda.set_sync_debug_mode(0)
            feed.close()
    return {"section": "syncs", "steps": steps, "synchronizations": sum(where.values()), "where": where,
            "per_step": sum(where.values()) / max(steps, 1), "device": str(device)}  # fmt: skip


# the profile's parts: an operator belongs to the first whose words its name holds (lower case)
PROFILE_PARTS = (
    ("table update", ("embedding_bag_backward", "embedding_dense_backward", "embedding_backward", "index_add",
                      "index_put", "scatter", "sort", "unique", "coalesce", "sparse", "segment", "radix")),
    ("table lookup", ("embedding_bag", "embedding", "index_select", "gather", "take")),
    ("interaction", ("bmm", "baddbmm", "tril", "triu", "dot_interaction", "ctrkit_dot")),
    ("dense layers", ("addmm", "mm", "matmul", "gemm", "linear", "cublas", "cutlass", "sm90", "sm80", "relu",
                      "threshold", "dropout")),
    ("optimizer", ("sgd", "adam", "adagrad", "_foreach", "fused", "lerp", "addcdiv", "addcmul")),
    ("copies", ("copy", "memcpy", "memset", "to_copy", "_to", "cat", "contiguous", "clone", "fill")),
)  # fmt: skip


def _part_of(name: str) -> str:
    low = name.lower()
    return next((part for part, words in PROFILE_PARTS if any(w in low for w in words)), "rest")


def _bandwidth(device: torch.device) -> float:
    """Bytes a second a large copy (256 MiB read and written) reaches here: the median of 5."""
    src = torch.empty(64 << 20, dtype=torch.float32, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    times = []
    for _ in range(6):
        _sync(device)
        t = time.perf_counter()
        dst.copy_(src)
        _sync(device)
        times.append(time.perf_counter() - t)
    return 2 * src.numel() * 4 / statistics.median(times[1:])


def _flops(device: torch.device, dtype: torch.dtype) -> float:
    """FLOPs a second a large matrix product (4096 square; 1024 on a CPU) reaches here in ``dtype``: the median of
    5."""
    n = 4096 if device.type == "cuda" else 1024
    a = torch.randn(n, n, device=device).to(dtype)
    times = []
    for _ in range(6):
        _sync(device)
        t = time.perf_counter()
        a @ a
        _sync(device)
        times.append(time.perf_counter() - t)
    return 2 * n**3 / statistics.median(times[1:])


def profile_section(a) -> dict:
    """Where a step's time goes, by part, against each part's bound here (the module's docstring)."""
    from torch.profiler import ProfilerActivity, profile

    device = torch.device(a.device)
    model_config, batch_size = _recipe(a.dataset, a.dim)
    batch_size = a.batch_size or batch_size
    batches = _batches(a.dataset, batch_size, device, a.distinct)
    precision = "bf16" if device.type == "cuda" else "fp32"
    # a CPU step unsplit: the profiler records the calling thread's operators (a GPU step is never split)
    model, steps = _ctrkit_step(model_config, device, precisions=(precision,), split="off")
    step = steps[precision]
    with _context(precision, device, autocast=False):
        for i in range(a.warmup):
            step(batches[i % len(batches)])
    _sync(device)
    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    t = time.perf_counter()
    with profile(activities=activities) as prof, _context(precision, device, autocast=False):
        for i in range(a.steps):
            step(batches[i % len(batches)])
        _sync(device)
    wall = (time.perf_counter() - t) / a.steps
    parts: dict[str, float] = {}
    for e in prof.key_averages():
        own = (e.self_device_time_total if cuda else e.self_cpu_time_total) / 1000 / a.steps  # ms a step
        if own > 0 and not e.key.startswith("ProfilerStep"):
            parts[_part_of(e.key)] = parts.get(_part_of(e.key), 0.0) + own
    tables = len(model_config.cardinalities)
    width, value = model_config.embedding_dim, 2 if precision == "bf16" else 4
    dense = sum(p.numel() for n, p in model.named_parameters() if "embedding" not in n)
    bandwidth, rate = _bandwidth(device), _flops(device, torch.bfloat16 if precision == "bf16" else torch.float32)
    moved = {  # bytes a step must move: rows read; rows read and written by the update (fp32 tables)
        "table lookup": batch_size * tables * width * 4,
        "table update": 2 * batch_size * tables * width * 4,
    }
    work = {"dense layers": 6 * dense * batch_size}  # forward and backward: 2 + 4 FLOPs a weight and sample
    bounds = {**{k: v / bandwidth * 1000 for k, v in moved.items()}, **{k: v / rate * 1000 for k, v in work.items()}}
    return {
        "section": "profile",
        "precision": precision,
        "batch_size": batch_size,
        "steps": a.steps,
        "ms_per_step": wall * 1000,
        "samples_per_s": batch_size / wall,
        "ms_by_part": dict(sorted(parts.items(), key=lambda kv: -kv[1])),
        "bound_ms": bounds,
        "bandwidth_gb_s": bandwidth / 1e9,
        "matmul_tflops": rate / 1e12,
        "value_bytes": value,
    }


SECTIONS = {
    "step": step_section,
    "e2e": e2e_section,
    "host": host_section,
    "syncs": syncs_section,
    "resume": resume_section,
    "profile": profile_section,
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("section", choices=sorted(SECTIONS))
    p.add_argument("--dataset", type=Path, required=True, help="a split-binary dataset (run_gpu.sh makes FL15's)")
    p.add_argument("--out", type=Path, required=True, help="the directory for <section>.json")
    p.add_argument("--device", default="cuda")
    p.add_argument("--precisions", default=",".join(PRECISIONS), help="comma-separated: fp32, tf32, bf16")
    p.add_argument("--dim", type=int, default=None, help="the tables' width (default: the recipe's, 128)")
    p.add_argument("--batch-size", type=int, default=None, help="default: the recipe's, 65,536")
    p.add_argument("--steps", type=int, default=20, help="timed steps a round (step), steps (host, syncs)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (step)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps a precision and implementation (step)")
    p.add_argument("--distinct", type=int, default=8, help="distinct batches cycled through (step)")
    p.add_argument("--max-steps", type=int, default=40, help="the training run's steps (e2e, resume)")
    p.add_argument("--print-freq", type=int, default=10, help="steps a log window (e2e, resume)")
    p.add_argument("--work", type=Path, default=Path("/tmp/ctrkit-gpu/resume"),
                   help="where the resume section's checkpoints are written, then deleted")  # fmt: skip
    p.add_argument("--cap", type=float, default=0.5, help="the GPU's room for the tables, as their share (host)")
    a = p.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    result = {**SECTIONS[a.section](a), "machine": machine(), "torch": torch.__version__}
    if a.device.startswith("cuda"):
        result["gpu"] = torch.cuda.get_device_name(0)
    text = json.dumps(result, indent=2)
    (a.out / f"{a.section}.json").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
