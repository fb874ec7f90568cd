#!/bin/bash
# The warm start's first-order fit, one commit against the working tree, in interleaved rounds: make demo's
# `ctrkit train` command on make demo's data (synth, 300,000 rows, seed 0). Each round writes each side's
# train log with the command's wall time added; the summary at the end gives medians of the per-round ratios.
#   bash benchmarks/results/warm_start/run.sh OLD_COMMIT [ROUNDS] [OUT]
set -euo pipefail
here=$(cd "$(dirname "$0")/../../.." && pwd)
old=${1:?old commit}; rounds=${2:-3}; out=${3:-$here/benchmarks/results/warm_start/ab}
export OMP_WAIT_POLICY=PASSIVE
py=$here/.venv/bin/python
work=$(mktemp -d); trap 'git -C "$here" worktree remove --force "$work/old" >/dev/null 2>&1; rm -rf "$work"' EXIT
git -C "$here" worktree add --detach "$work/old" "$old" >/dev/null 2>&1
mkdir -p "$out"
$py -m ctrkit synth --out "$work/data" --rows 300000 --seed 0 --overwrite >/dev/null 2>&1
$py -c "import json; from ctrkit.bench.peak import machine; print(json.dumps(machine(), default=str))" > "$out/machine.json"
for r in $(seq 1 "$rounds"); do
  for side in old new; do
    root=$here; [ "$side" = old ] && root=$work/old
    log=$out/round${r}_$side.jsonl; rm -f "$log"
    start=$(date +%s.%N)
    (cd "$root" && PYTHONPATH=$root $py -m ctrkit train --model dlrm --dataset "$work/data" --epochs 1 \
      --save-checkpoint "$work/$side.pt" --log-path "$log" --no-progress >/dev/null 2>&1)
    end=$(date +%s.%N)
    echo "{\"event\": \"wall\", \"seconds\": $(echo "$end - $start" | bc)}" >> "$log"
    echo "round $r $side: $(grep -o '"seconds": [0-9.]*' "$log" | head -1) (warm start), $(tail -1 "$log")"
  done
done
echo "old: $old ($(git -C "$here" rev-parse "$old")), new: $(git -C "$here" rev-parse HEAD) + working tree" > "$out/README"
$py - "$out" "$rounds" <<'PY' | tee "$out/summary.txt"
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def read(r, side):
    recs = [json.loads(line) for line in open(f"{out}/round{r}_{side}.jsonl")]
    get = lambda e: next(x for x in recs if x["event"] == e)
    return get("warm_start")["seconds"], get("wall")["seconds"], get("test")["auc"]
rows = [(read(r, "old"), read(r, "new")) for r in range(1, rounds + 1)]
for name, i in (("warm start", 0), ("whole train command", 1)):
    old, new = [o[i] for o, _ in rows], [n[i] for _, n in rows]
    ratio = statistics.median(o / n for o, n in zip(old, new))
    print(f"{name}: old {statistics.median(old):.1f} s, new {statistics.median(new):.1f} s (median of per-round old/new {ratio:.2f})")
print("test AUC old", sorted({round(o[2], 6) for o, _ in rows}), "new", sorted({round(n[2], 6) for _, n in rows}))
PY
