"""One-off probe (#81): trains a fixed set of runs with the ctrkit on PYTHONPATH and prints a digest of each kept
model's weights (dynamic tables by held id, not by their salted hash layout). Run it with PYTHONPATH at two
commits and compare: `PYTHONPATH=<tree> python same_bits.py <out>`."""
import hashlib, json, os, subprocess, sys
from pathlib import Path
import torch

out = Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
data = Path("/tmp/bits/data")
from ctrkit.data.synthetic import generate_dataset
from ctrkit.data.synthetic_stream import write_stream
if not data.exists():
    generate_dataset(data / "tiny", 24_000, (3, 50, 2000, 100, 700), num_numerical=4, test_fraction=0.1, seed=7, progress=False)
    write_stream(data / "s", 2, 6000, (3000, 800, 50, 5, 2000), capacity=0.5, seed=2, progress=False, num_numerical=3)
tiny = data / "tiny"
days = sorted((data / "s").iterdir())
days = [d for d in days if (d / "feature_spec.yaml").exists()]
SMALL = ["--embedding-dim", "8", "--bottom-mlp", "16,8", "--top-mlp", "16,1", "--no-progress", "--threads", "1"]
runs = {}
for model in ("dlrm", "dcnv2", "wide_deep"):
    for recipe in ("tuned", "plain", "nvidia"):
        shape = SMALL if model != "wide_deep" else ["--embedding-dim", "8", *SMALL[6:]]
        runs[f"{model}-{recipe}"] = ["--dataset", tiny, "--model", model, "--recipe", recipe, "--epochs", "2", *shape]
runs["seed-ensemble"] = ["--dataset", tiny, "--model", "dlrm", "--seed-ensemble", "2", "--epochs", "2", *SMALL]
runs["small-batch"] = ["--dataset", tiny, "--model", "dlrm", "--batch-size", "4096", "--epochs", "2", *SMALL]
runs["snapshots"] = ["--dataset", tiny, "--model", "dcnv2", "--snapshot-ensemble", "3", "--epochs", "3", *SMALL]
runs["disk-tables"] = ["--dataset", tiny, "--model", "dlrm", "--embedding-storage", "disk", "--epochs", "2", *SMALL]
runs["amp"] = ["--dataset", tiny, "--model", "dlrm", "--amp", "--epochs", "1", *SMALL]
runs["day1"] = ["--dataset", days[0], "--model", "dlrm", "--epochs", "1", "--batch-size", "600", "--small-batch", "0", "--admit-after", "2", *SMALL]
runs["day2"] = ["--dataset", days[1], "--model", "dlrm", "--epochs", "1", "--batch-size", "600", "--small-batch", "0", "--continue-from", out / "day1.pt", *SMALL]
runs["torchrun"] = ["--dataset", tiny, "--model", "dlrm", "--epochs", "1", *SMALL]
only = set(sys.argv[2:])
for name, args in runs.items():
    if only and name not in only:
        continue
    ckpt = out / f"{name}.pt"
    cmd = [sys.executable, "-m", "ctrkit", "train", *map(str, args), "--save-checkpoint", str(ckpt)]
    if name == "torchrun":
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
               "--master-port", "29612", "-m", "ctrkit", "train", *map(str, args), "--save-checkpoint", str(ckpt)]
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if done.returncode:
        print(name, "FAILED", done.stderr[-500:].replace("\n", " | "), flush=True); continue
    from ctrkit.checkpoint import load_checkpoint
    c = load_checkpoint(ckpt)
    h = hashlib.sha256()
    state = dict(c.model)
    for k in [k for k in state if k.startswith("dynamic_ids.keys")]:  # the hash layout is salted per run: key order
        n = k[len("dynamic_ids.keys"):]
        live = state[f"dynamic_ids.state{n}"] == 1  # held ids (empty and deleted slots hold stale keys)
        order = torch.argsort(state[k][live])
        for part in ("keys", "state", "row", "count", "seen"):
            state[f"dynamic_ids.{part}{n}"] = state[f"dynamic_ids.{part}{n}"][live][order]
    state.pop("dynamic_ids.hash_key", None)
    for k in [k for k in state if k.startswith("dynamic_ids.sizes")]:
        state[k] = state[k][:1]  # ids held (the slots not empty count deleted ones: layout)
    for k, v in sorted(state.items()):
        h.update(k.encode()); h.update(v.detach().cpu().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes() if v.numel() else b"")
    result = json.loads(done.stdout.strip().splitlines()[-1]) if done.stdout.strip().startswith("{") or done.stdout.strip().splitlines()[-1].startswith("{") else {}
    print(name, h.hexdigest()[:16], result.get("auc"), flush=True)
