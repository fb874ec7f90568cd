"""The calibration rules applied to run.py's cells: for a scale alone and for a scale and a shift, at
likelihood-ratio thresholds (twice the validation rows times the validation log-loss gain), the mean change of
test log loss and the cells it made better / worse by more than 0.0005; then each cell of the shipped rule
(a scale alone, threshold 6.63: chi-square with one degree of freedom at 99%).

    python benchmarks/results/calibration/summarize.py CELLS.jsonl... [--datasets DIR]

Rows without ``validation_rows`` (run before run.py wrote it) take it from the datasets under --datasets
(default build/accuracy), split as the trainer splits them.
"""

import argparse
import json

p = argparse.ArgumentParser()
p.add_argument("cells", nargs="+")
p.add_argument("--datasets", default="build/accuracy")
args = p.parse_args()
rows = [json.loads(line) for f in args.cells for line in open(f)]
if any("validation_rows" not in r for r in rows):
    from pathlib import Path

    from ctrkit.bench.accuracy import splits

    n = {name: len(splits(Path(args.datasets) / name, 0.1)[1]) for name in {r["dataset"] for r in rows}}
    for r in rows:
        r.setdefault("validation_rows", n[r["dataset"]])


def statistic(r, arm):
    return 2 * r["validation_rows"] * (r["val_logloss"] - r[arm]["val_logloss"])


def change(r, arm, threshold):
    return (r[arm]["logloss"] if statistic(r, arm) > threshold else r["logloss"]) - r["logloss"]


print(f"{len(rows)} cells; test log-loss change (negative: better)")
print("| arm | threshold | applied | mean | better / worse by > 0.0005 | worst | best |")
print("| --- | ---: | ---: | ---: | --- | ---: | ---: |")
for arm in ("scale", "platt"):
    for threshold in (0.0, 3.84, 6.63, 9.21, 13.8):
        d = [change(r, arm, threshold) for r in rows]
        applied = sum(statistic(r, arm) > threshold for r in rows)
        print(f"| {arm} | {threshold:g} | {applied} | {sum(d) / len(d):+.5f} | {sum(x < -5e-4 for x in d)} / "
              f"{sum(x > 5e-4 for x in d)} | {max(d):+.4f} | {min(d):+.4f} |")
print("\nthe shipped rule (scale, > 6.63), the cells it applies to:")
print("| data set | model | statistic | scale | test log loss before -> after |")
print("| --- | --- | ---: | ---: | --- |")
for r in sorted(rows, key=lambda r: -statistic(r, "scale")):
    if statistic(r, "scale") > 6.63:
        print(f"| {r['dataset']} | {r['model']} | {statistic(r, 'scale'):.1f} | {r['scale']['a']:.3f} | "
              f"{r['logloss']:.4f} -> {r['scale']['logloss']:.4f} |")
