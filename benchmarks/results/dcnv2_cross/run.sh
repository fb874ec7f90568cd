#!/usr/bin/env bash
# DCNv2 fp32 training, the cross network through autograd (BEFORE, default 5b72dd5, in a git worktree) and
# through the fused function, ROUNDS interleaved rounds of `ctrkit bench train --model dcnv2 --steps 10
# --repeats 3 --warmup 5`; JSON here as dcn2_{old,new}_ROUND.json, then the medians.
set -euo pipefail
cd "$(dirname "$0")/../../.."
export OMP_WAIT_POLICY=PASSIVE
ROUNDS=${ROUNDS:-4}
BEFORE=${BEFORE:-5b72dd5}
out=$PWD/benchmarks/results/dcnv2_cross
work=build/dcnv2_cross_before
[ -d "$work" ] || git worktree add --detach "$work" "$BEFORE" >/dev/null
for round in $(seq "$ROUNDS"); do
  for code in old new; do
    dir=$PWD; [ "$code" = old ] && dir=$PWD/$work
    (cd "$dir" && "$OLDPWD/.venv/bin/python" -m ctrkit bench train --model dcnv2 --steps 10 --repeats 3 --warmup 5 \
      --output "$out/dcn2_${code}_$round.json" >/dev/null)
  done
done
.venv/bin/python - "$out" <<'PY'
import json, pathlib, statistics, sys
runs = {c: [json.loads(p.read_text()) for p in sorted(pathlib.Path(sys.argv[1]).glob(f"dcn2_{c}_*.json"))] for c in ("old", "new")}
m = runs["new"][0]["machine"]
print(f"machine: {m['cpu']}, capability {m['capability']}, {m['threads']} threads, torch {m['torch']}")
for c, rs in runs.items():
    print(f"{c}: samples/s {[round(r['samples_per_s']) for r in rs]}, median {statistics.median(r['samples_per_s'] for r in rs):,.0f}")
print("new / old per round:", [round(n["samples_per_s"] / o["samples_per_s"], 3) for o, n in zip(runs["old"], runs["new"])])
PY
