"""Medians over rounds of `bench train --breakdown` parts, code before (old) and after (new) each round."""
import json, pathlib, statistics, sys
d = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).parent / "breakdown")
for model in ("dlrm", "dcnv2", "wide_deep"):
    runs = {c: [json.loads(p.read_text()) for p in sorted(d.glob(f"{model}_fp32_{c}_*.json"))] for c in ("old", "new")}
    if not runs["old"]:
        continue
    m = runs["new"][0]["machine"]
    print(f"{model} fp32, {len(runs['old'])} rounds, {m['cpu']} ({m['capability']}), ms per step (medians; per round):")
    parts = list(runs["new"][0]["breakdown"]["ms"]) + ["total"]
    for part in parts:
        vals = {c: [r["breakdown"]["total_ms"] if part == "total" else r["breakdown"]["ms"][part] for r in rs]
                for c, rs in runs.items()}
        print(f"  {part:52s} old {statistics.median(vals['old']):6.2f} {[round(v, 2) for v in vals['old']]}"
              f"  new {statistics.median(vals['new']):6.2f} {[round(v, 2) for v in vals['new']]}")
    sps = {c: [r["samples_per_s"] for r in rs] for c, rs in runs.items()}
    frac = {c: [r["fraction_of_peak"] for r in rs] for c, rs in runs.items()}
    print(f"  samples/s (timed repeats) old {[round(v) for v in sps['old']]} new {[round(v) for v in sps['new']]}; "
          f"fraction of peak old {[round(v, 3) for v in frac['old']]} new {[round(v, 3) for v in frac['new']]}")
