"""One-off probe (issue 68): a fixed set of training runs whose checkpoints must be bit-equal before and after a
restructuring of train/. ``python same_runs.py run OUT`` trains the set with the ctrkit on sys.path and writes
OUT/digests.json (a digest of every tensor and value of each checkpoint but the plan's printed lines, which
measure memory); ``python same_runs.py compare A B`` compares two such files. Dynamic tables hash under a fixed key
(the probe patches ``new_key``), so their maps are comparable slot by slot."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

PY = sys.executable
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE", "PYTHONHASHSEED": "0"}
PATCHED = (
    "import sys, torch, ctrkit.models.dynamic as d; "
    "d.new_key = lambda: torch.tensor([0x1234567 | 1, 0x7654321 | 1], dtype=torch.int64); "
    "from ctrkit.cli import main; sys.exit(main(sys.argv[1:]))"
)
SMALL = ["--embedding-dim", "8", "--no-progress"]


def ctrkit(*args: object) -> None:
    done = subprocess.run([PY, "-c", PATCHED, *map(str, args)], env=ENV, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"ctrkit {' '.join(map(str, args))}: {done.stderr[-3000:]}")


def torchrun(*args: object) -> None:
    launch = [
        PY,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        "29617",
        "-m",
        "ctrkit",
    ]
    done = subprocess.run([*launch, *map(str, args)], env=ENV, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"torchrun {' '.join(map(str, args))}: {done.stderr[-3000:]}")


def digest(value, h) -> None:
    if isinstance(value, torch.Tensor):
        v = value.detach().cpu().contiguous()
        h.update(f"T{v.dtype}{tuple(v.shape)}".encode())
        h.update(v.reshape(-1).view(torch.uint8).numpy().tobytes() if v.numel() else b"")
    elif isinstance(value, dict):
        for k in sorted(value, key=str):
            h.update(f"K{k}".encode())
            digest(value[k], h)
    elif isinstance(value, (list, tuple)):
        h.update(f"L{len(value)}".encode())
        for v in value:
            digest(v, h)
    else:
        h.update(f"V{value!r}".encode())


def checkpoint_digest(path: Path) -> dict[str, str]:
    from ctrkit.checkpoint import load_checkpoint

    ckpt = load_checkpoint(path)
    out = {}
    for name, value in vars(ckpt).items():
        if name in ("plan", "shard_files", "shard_records", "digest"):
            continue
        h = hashlib.sha256()
        digest(value, h)
        out[name] = h.hexdigest()[:16]
    plan = dict(ckpt.plan or {})  # but what it measured: the process's memory and the room beside it
    plan["lines"] = [line for line in plan.get("lines", []) if line["topic"] != "memory"]
    plan["memory_bytes"] = {
        k: v for k, v in plan.get("memory_bytes", {}).items() if k not in ("process", "peak", "room")
    }
    h = hashlib.sha256()
    digest(json.loads(json.dumps(plan).replace(str(path.parent), "OUT")), h)  # the run's folder named alike
    out["plan_but_measured"] = h.hexdigest()[:16]
    return out


def run(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    where = subprocess.run([PY, "-c", "import ctrkit; print(ctrkit.__file__)"], env=ENV, capture_output=True, text=True)
    print("ctrkit from", where.stdout.strip(), flush=True)
    data, stream = out / "data", out / "stream"
    ctrkit("synth", "--out", data, "--rows", "30000", "--seed", "3")
    ctrkit("synth", "stream", "--out", stream, "--rows", "6000", "--days", "2")
    runs: dict[str, list] = {}
    for model in ("dlrm", "dcnv2", "wide_deep"):
        for recipe in ("tuned", "plain", "nvidia"):
            runs[f"{model}-{recipe}"] = ["--model", model, "--recipe", recipe, "--epochs", "2", "--batch-size", "512"]
    runs["dlrm-ensembles"] = [
        "--epochs",
        "3",
        "--batch-size",
        "1024",
        "--snapshot-ensemble",
        "3",
        "--seed-ensemble",
        "2",
        "--evals-per-epoch",
        "2",
    ]
    runs["dlrm-disk"] = ["--embedding-storage", "disk", "--epochs", "1", "--batch-size", "512"]
    results = {}
    for name, flags in runs.items():
        path = out / f"{name}.pt"
        ctrkit("train", "--dataset", data, *flags, *SMALL, "--save-checkpoint", path)
        results[name] = checkpoint_digest(path)
        print(name, flush=True)
    days = sorted(p for p in stream.iterdir() if p.is_dir())
    first, second = out / "day0.pt", out / "day1.pt"
    ctrkit("train", "--dataset", days[0], *SMALL, "--save-checkpoint", first)
    ctrkit("train", "--dataset", days[1], *SMALL, "--continue-from", first, "--save-checkpoint", second)
    results["dynamic-day0"], results["dynamic-day1"] = checkpoint_digest(first), checkpoint_digest(second)
    print("dynamic", flush=True)
    ranks = out / "ranks.pt"
    torchrun(
        "train",
        "--dataset",
        data,
        "--epochs",
        "1",
        "--batch-size",
        "1000",
        "--calibrate",
        "on",
        *SMALL,
        "--save-checkpoint",
        ranks,
    )
    results["two-ranks"] = checkpoint_digest(ranks)
    print("two-ranks", flush=True)
    (out / "digests.json").write_text(json.dumps(results, indent=1, sort_keys=True))


def compare(a: Path, b: Path) -> int:
    da, db = json.loads(a.read_text()), json.loads(b.read_text())
    bad = 0
    for name in sorted(set(da) | set(db)):
        diff = sorted(
            k
            for k in set(da.get(name, {})) | set(db.get(name, {}))
            if da.get(name, {}).get(k) != db.get(name, {}).get(k)
        )
        print(f"{name}: {'same' if not diff else 'DIFFERENT ' + ', '.join(diff)}")
        bad += bool(diff)
    return bad


def redigest(out: Path) -> None:
    """Digests again the checkpoints a ``run`` left in ``out``."""
    results = {p.stem: checkpoint_digest(p) for p in sorted(out.glob("*.pt"))}
    results["dynamic-day0"], results["dynamic-day1"] = results.pop("day0"), results.pop("day1")
    results["two-ranks"] = results.pop("ranks")
    (out / "digests.json").write_text(json.dumps(results, indent=1, sort_keys=True))


if __name__ == "__main__":
    if sys.argv[1] == "run":
        run(Path(sys.argv[2]))
    elif sys.argv[1] == "redigest":
        redigest(Path(sys.argv[2]))
    else:
        sys.exit(compare(Path(sys.argv[2]), Path(sys.argv[3])))
