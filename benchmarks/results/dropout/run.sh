#!/usr/bin/env bash
# Wide & Deep training with the CPU dropout applying its mask by a product (this checkout) against `where`
# (BEFORE, default 5b72dd5, in a git worktree): ROUNDS interleaved rounds of `ctrkit bench train --model
# wide_deep --steps 10 --repeats 3 --warmup 5`, fp32 and bf16 autocast; JSON here as wd_{fp32,bf16}_{old,new}_ROUND.json.
set -euo pipefail
cd "$(dirname "$0")/../../.."
export OMP_WAIT_POLICY=PASSIVE
ROUNDS=${ROUNDS:-3}
BEFORE=${BEFORE:-5b72dd5}
out=$PWD/benchmarks/results/dropout
work=build/dropout_before
[ -d "$work" ] || git worktree add --detach "$work" "$BEFORE" >/dev/null
for round in $(seq "$ROUNDS"); do
  for prec in fp32 bf16; do
    for code in old new; do
      dir=$PWD; [ "$code" = old ] && dir=$PWD/$work
      amp=(); [ "$prec" = bf16 ] && amp=(--amp)
      (cd "$dir" && "$OLDPWD/.venv/bin/python" -m ctrkit bench train --model wide_deep --steps 10 --repeats 3 \
        --warmup 5 "${amp[@]}" --output "$out/wd_${prec}_${code}_$round.json" >/dev/null)
    done
  done
done
.venv/bin/python - "$out" <<'PY'
import json, pathlib, statistics, sys
d = pathlib.Path(sys.argv[1])
for prec in ("fp32", "bf16"):
    runs = {c: sorted(d.glob(f"wd_{prec}_{c}_*.json"), key=lambda p: int(p.stem.rsplit("_", 1)[1])) for c in ("old", "new")}
    sps = {c: [json.loads(p.read_text())["samples_per_s"] for p in ps] for c, ps in runs.items()}
    ratios = [round(n / o, 3) for o, n in zip(sps["old"], sps["new"])]
    print(f"{prec}: old {statistics.median(sps['old']):,.0f}, new {statistics.median(sps['new']):,.0f} samples/s "
          f"(medians of {len(ratios)} rounds); new / old per round {ratios}")
PY
