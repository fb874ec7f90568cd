"""Summarises benchmarks/results/raw/<variant>_<round>.json into one JSON per variant and a table."""

import json
import pathlib
import statistics

RESULTS = pathlib.Path(__file__).parent / "results"
VARIANTS = ("fp32", "bf16", "fp32_dense_grad", "bf16_dense_grad")

rows = []
for v in VARIANTS:
    runs = [json.loads(p.read_text()) for p in sorted((RESULTS / "raw").glob(f"{v}_[0-9]*.json"))]
    if not runs:
        continue
    summary = {k: val for k, val in runs[0].items() if k != "ms_per_step_all"}
    summary.update(
        samples_per_s=statistics.median(r["samples_per_s"] for r in runs),
        ms_per_step=statistics.median(r["ms_per_step"] for r in runs),
        samples_per_s_per_round=[round(r["samples_per_s"]) for r in runs],
        rounds=len(runs),
        command="bash benchmarks/run_train.sh",
    )
    (RESULTS / f"train_dlrm_{v}.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    rows.append((v, summary))

base = dict(rows)["fp32_dense_grad"]["samples_per_s"]
print("| variant | precision | embedding gradients | samples/s (median) | ms/step | per round | vs dense fp32 |")
print("| --- | --- | --- | ---: | ---: | --- | ---: |")
for v, s in rows:
    grads = "dense" if s["config"]["dense_gradients"] else "sparse"
    per = ", ".join(f"{x:,}" for x in s["samples_per_s_per_round"])
    print(
        f"| {v} | {s['amp_dtype'] or 'fp32'} | {grads} | {s['samples_per_s']:,.0f} | {s['ms_per_step']:.1f} | "
        f"{per} | {s['samples_per_s'] / base:.2f}x |"
    )
