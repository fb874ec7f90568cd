import json
import os
import subprocess

import numpy as np
import pytest
import torch

from ctrkit.bench.scale_bench import table_sizes
from ctrkit.device import MATRIX_FLAGS
from tests.conftest import run_cli


def lscpu_flags() -> set[str] | None:
    """The CPU's flags as util-linux's ``lscpu`` reports them (a reader other than ctrkit's), None without it."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    for line in out.splitlines():
        if line.startswith("Flags:"):
            return set(line.split(":", 1)[1].split())
    return None


def test_bench_train_writes_its_result(tmp_path, capsys):
    out = tmp_path / "r.json"
    code, stdout, _ = run_cli(
        "bench",
        "train",
        "--batch-size",
        "64",
        "--table-rows",
        "1000",
        "--num-tables",
        "4",
        "--warmup",
        "1",
        "--steps",
        "2",
        "--repeats",
        "3",
        "--output",
        out,
        capsys=capsys,
    )
    assert code == 0 and "samples/s" in stdout
    result = json.loads(out.read_text())
    assert result["config"]["batch_size"] == 64 and len(result["ms_per_step_all"]) == 3
    assert result["samples_per_s"] == 64 / (result["ms_per_step"] / 1000)
    assert {"samples_per_s", "ms_per_step", "machine"} <= set(result) and "threads" not in result  # said once
    assert {"torch", "threads", "cores", "cpu"} <= set(result["machine"])
    # where it ran, and what its cores do: the matmul peak measured in the same run
    assert result["machine"]["capability"] == __import__("torch").backends.cpu.get_cpu_capability()
    # the CPU's matrix features as lscpu lists them: AMX, AVX512-BF16 and AVX2 machines told apart
    flags = lscpu_flags()
    if flags is not None:
        assert result["machine"]["cpu_features"] == [f for f in MATRIX_FLAGS if f in flags]
    # and how idle OpenMP threads waited (it moves CPU throughput: docs/decisions/omp-wait-policy.md)
    assert result["machine"]["omp_wait_policy"] == os.environ.get("OMP_WAIT_POLICY")
    assert result["machine"]["gomp_spincount"] == os.environ.get("GOMP_SPINCOUNT")
    assert result["matmul_peak_gflops"]["fp32"] > 0.5
    # and each repeat's achieved rate against the peak read right after it
    peaks, fractions = result["peak_after_each_repeat_gflops"], result["fraction_of_peak_per_repeat"]
    assert len(peaks) == len(fractions) == 3 and min(peaks) > 0.5
    flops = result["flops_per_sample"]["train_step"]
    for ms, peak, fraction in zip(result["ms_per_step_all"], peaks, fractions):
        assert fraction == pytest.approx(flops * 64 / (ms / 1000) / 1e9 / peak)
    assert result["fraction_of_peak_paired"] == pytest.approx(np.median(fractions))
    assert result["breakdown"] is None  # only with --breakdown


def test_bench_train_breakdown_names_each_part(tmp_path, capsys):
    """--breakdown: forward, backward and one entry per optimizer (DLRM's four: the first-order term's
    tables and numerical weights, the embedding tables, the dense layers), and the matrix multiplies'
    time from the profiler, which is part of the forward and backward."""
    out = tmp_path / "r.json"
    flags = ["--batch-size", "256", "--table-rows", "1000", "--num-tables", "4", "--warmup", "1", "--steps", "3",
             "--repeats", "1", "--breakdown", "--split-batch", "off", "--output", out]  # fmt: skip
    code, stdout, _ = run_cli("bench", "train", *flags, capsys=capsys)
    assert code == 0 and "step time by part" in stdout
    assert json.loads(out.read_text())["split_threads"] == 1
    b = json.loads(out.read_text())["breakdown"]
    assert set(b["ms"]) == {
        "forward",
        "backward",
        "SparseRowOptimizer(adagrad) on first-order tables",
        "Adagrad on first-order dense weights",
        "SparseRowOptimizer(adam) on tables",
        "Adam on dense weights",
    }
    assert all(ms > 0 for ms in b["ms"].values()) and b["total_ms"] == pytest.approx(sum(b["ms"].values()))
    # per step, within the profiled pass's own wall time per step (the step's ops run on the calling thread); the
    # timed parts come from other passes, which a busy machine slows by other amounts
    assert 0 < b["matmul_ms"] <= b["profiled_step_ms"]


def test_bench_train_breakdown_of_a_split_step(tmp_path, capsys):
    """A step split over two threads: its meetings (the slices' forward and backward, the optimizers) and the rest,
    which add up to the step, and each optimizer's own time beside; no profiler time (it cannot see the workers)."""
    before = torch.get_num_threads()
    out = tmp_path / "r.json"
    flags = ["--batch-size", "256", "--table-rows", "1000", "--num-tables", "4", "--warmup", "1", "--steps", "3",
             "--repeats", "1", "--breakdown", "--split-batch", "on", "--threads", "2", "--output", out]  # fmt: skip
    try:
        code, stdout, _ = run_cli("bench", "train", *flags, capsys=capsys)
    finally:
        torch.set_num_threads(before)
    assert code == 0 and "(the batch split over 2)" in stdout
    result = json.loads(out.read_text())
    b = result["breakdown"]
    assert result["split_threads"] == 2 and b["matmul_ms"] is None
    assert set(b["ms"]) == {
        "forward and backward, 2 slices on 2 threads",
        "optimizers and the tables' rows, spread over 2 threads",
        "the rest (slicing, gradients' bookkeeping)",
    }
    assert (
        b["ms"]["forward and backward, 2 slices on 2 threads"] > 0
        and b["ms"]["optimizers and the tables' rows, spread over 2 threads"] > 0
    )
    assert b["total_ms"] == pytest.approx(sum(b["ms"].values()))
    assert set(b["optimizer_ms"]) == {
        "SparseRowOptimizer(adagrad) on first-order tables",
        "Adagrad on first-order dense weights",
        "SparseRowOptimizer(adam) on tables",
        "Adam on dense weights",
    }


def test_bench_preprocess_runs_the_real_command(tmp_path, capsys):
    out = tmp_path / "p.json"
    code, stdout, _ = run_cli("bench", "preprocess", "--rows", "3000", "--repeats", "2", "--output", out, capsys=capsys)
    assert code == 0 and "3,000 rows in" in stdout and "median of 2" in stdout
    result = json.loads(out.read_text())
    assert result["rows"] == 3000 and result["engine"] == "polars" and result["peak_rss_mb"] > 10
    assert len(result["seconds_each"]) == 2 and result["seconds"] == pytest.approx(
        np.median(result["seconds_each"]), abs=1e-3
    )
    assert result["rows_per_s"] == result["rows"] / result["seconds"]
    assert result["machine"]["cores"] >= 1 and result["matmul_peak_gflops"]["fp32"] > 0  # where it ran


def test_bench_scale_runs_one_job_per_world_size(tmp_path, capsys):
    out = tmp_path / "s.json"
    flags = ["--models", "tiny", "--scale", "65536", "--world-sizes", "1,2", "--batch-size", "64"]
    code, stdout, _ = run_cli("bench", "scale", *flags, "--warmup", "1", "--steps", "2", "--output", out, capsys=capsys)
    assert code == 0 and "world size 2" in stdout
    results = json.loads(out.read_text())
    assert [r["world_size"] for r in results] == [1, 2]
    for r in results:
        assert r["tables"] == 55 and r["samples_per_s"] == 64 / r["ms_per_step"] * 1000
        assert r["machine"]["capability"] and r["matmul_peak_gflops"]["fp32"] > 0  # where it ran
    assert sum(table_sizes("tiny", 65536, 32)) * 32 * 4 <= 4.2 * 2**30 / 65536  # the size the blog gives, scaled
    code, _, err = run_cli("bench", "scale", "--models", "huge", capsys=capsys)
    assert code == 2 and "unknown model 'huge'" in err


def test_flops_per_sample_follow_the_layer_shapes():
    """Counted over a real forward/backward; here against the shapes: each Linear is 2*in*out FLOPs per
    sample forward and twice that backward (input and weight gradients), and DLRM's dot interaction of
    F+1 vectors of width D is a (F+1) x D x (F+1) product per sample."""
    import torch

    from ctrkit.bench.config import TrainBenchConfig
    from ctrkit.bench.train_bench import dense_flops_per_sample, make_batches
    from ctrkit.models.registry import create_model, make_config

    cfg = TrainBenchConfig(batch_size=32, num_tables=5, table_rows=100, embedding_dim=8, num_numerical=3,
                           distinct_batches=1)  # fmt: skip
    batch = make_batches(cfg, np.random.default_rng(0))[0]
    shape = {"num_numerical": 3, "cardinalities": (100,) * 5, "embedding_dim": 8}
    wd = create_model("wide_deep", make_config("wide_deep", {**shape, "deep_mlp": (64, 32)}))
    linear = sum(2 * m.in_features * m.out_features for m in wd.modules() if isinstance(m, torch.nn.Linear))
    assert linear == 2 * ((5 * 8 + 3) * 64 + 64 * 32 + 32 * 1 + 3 * 1)  # the deep tower, the wide numericals
    flops = dense_flops_per_sample(wd, batch)
    # backward: weight and input gradients, except the input gradient of the wide part's numerical layer
    # (the numerical inputs need none)
    assert flops == {"forward": linear, "train_step": 3 * linear - 2 * 3 * 1}
    dlrm = create_model("dlrm", make_config("dlrm", {**shape, "bottom_mlp": (16, 8), "top_mlp": (16, 1)}))
    linear = sum(2 * m.in_features * m.out_features for m in dlrm.modules() if isinstance(m, torch.nn.Linear))
    interaction = 2 * 6 * 8 * 6
    flops = dense_flops_per_sample(dlrm, batch)
    assert flops["forward"] == linear + interaction
    assert all(p.grad is None for p in dlrm.parameters())  # counting leaves no gradients behind


@pytest.mark.parametrize("native_bf16", ["1", "0"])
def test_bench_train_with_each_precision_flag(tmp_path, capsys, monkeypatch, native_bf16):
    """Every precision flag of `bench train` on tiny data, on a CPU with native bf16 and on one without (where `--amp`
    runs fp32, as `train --amp` does: its result printed, not a TypeError): a result, or a one-line refusal (exit 2)."""
    monkeypatch.setenv("CTRKIT_CPU_BF16", native_bf16)
    tiny = ["--batch-size", "64", "--table-rows", "1000", "--num-tables", "4", "--warmup", "1", "--steps", "2",
            "--repeats", "1", "--split-batch", "off"]  # fmt: skip
    cases = [(("--amp",), "bfloat16"), (("--amp", "--amp-dtype", "fp16"), "refused")]
    if native_bf16 == "1":  # (fp32 and an explicit bf16 once: the same on both kinds)
        cases += [((), None), (("--amp", "--amp-dtype", "bf16"), "bfloat16")]
    for flags, want in cases:
        out = tmp_path / "r.json"
        out.unlink(missing_ok=True)
        code, stdout, stderr = run_cli("bench", "train", *tiny, *flags, "--output", out, capsys=capsys)
        if want == "refused":
            assert code == 2 and "fp16 is not supported on CPU" in stderr and "Traceback" not in stderr
            continue
        assert code == 0, stderr
        amp = json.loads(out.read_text())["amp_dtype"]
        assert amp == (want if native_bf16 == "1" else None), flags
        assert ("amp bfloat16" in stdout) == (amp is not None) and "samples/s" in stdout
