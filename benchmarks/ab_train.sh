#!/usr/bin/env bash
# A/B of `ctrkit bench train`: the code at BEFORE (default 5b72dd5, checked out in a git worktree under build/)
# against this checkout, ROUNDS interleaved rounds (default 3) of `--model MODEL --steps 10 --repeats 3
# --warmup 5` for each of PRECISIONS (default "fp32 bf16"; bf16 is --amp). JSON in OUT as
# MODEL_PRECISION_{old,new}_ROUND.json, then the medians and the per-round ratios.
# Usage: MODEL=wide_deep OUT=benchmarks/results/dropout bash benchmarks/ab_train.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_WAIT_POLICY=PASSIVE
: "${MODEL:?set MODEL}" "${OUT:?set OUT}"
ROUNDS=${ROUNDS:-3}
PRECISIONS=${PRECISIONS:-fp32 bf16}
BEFORE=${BEFORE:-5b72dd5}
out=$PWD/$OUT
work=build/ab_train_$BEFORE
mkdir -p "$out"
[ -d "$work" ] || git worktree add --detach "$work" "$BEFORE" >/dev/null
for round in $(seq "$ROUNDS"); do
  for prec in $PRECISIONS; do
    for code in old new; do
      dir=$PWD; [ "$code" = old ] && dir=$PWD/$work
      amp=(); [ "$prec" = bf16 ] && amp=(--amp)
      (cd "$dir" && "$OLDPWD/.venv/bin/python" -m ctrkit bench train --model "$MODEL" --steps 10 --repeats 3 \
        --warmup 5 "${amp[@]}" --output "$out/${MODEL}_${prec}_${code}_$round.json" >/dev/null)
    done
  done
done
.venv/bin/python - "$out" "$MODEL" <<'PY'
import json, pathlib, statistics, sys
out, model = pathlib.Path(sys.argv[1]), sys.argv[2]
for prec in ("fp32", "bf16"):
    runs = {c: sorted(out.glob(f"{model}_{prec}_{c}_*.json"), key=lambda p: int(p.stem.rsplit("_", 1)[1]))
            for c in ("old", "new")}
    if not runs["old"]:
        continue
    m = json.loads(runs["new"][0].read_text())["machine"]
    sps = {c: [json.loads(p.read_text())["samples_per_s"] for p in ps] for c, ps in runs.items()}
    ratios = [round(n / o, 3) for o, n in zip(sps["old"], sps["new"])]
    print(f"{model} {prec} on {m['cpu']} ({m['capability']}, {m['threads']} threads): old "
          f"{statistics.median(sps['old']):,.0f}, new {statistics.median(sps['new']):,.0f} samples/s "
          f"(medians of {len(ratios)} rounds); new / old per round {ratios}")
PY
