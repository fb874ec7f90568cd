"""Summarises ab.py's JSON lines: per (dataset, model), the defaults ("base") against one other arm.

python summarize.py FILE.jsonl [MORE.jsonl ...] [--arm ARM]   (ARM: the arm to compare; default: the one other)
"""

import collections
import json
import statistics as st
import sys

args = sys.argv[1:]
want = None
if "--arm" in args:
    i = args.index("--arm")
    want = args[i + 1]
    del args[i : i + 2]
rows = [json.loads(line) for path in args for line in open(path)]
cells = collections.defaultdict(dict)
for r in rows:
    cells[(r["dataset"], r["model"])][r["arm"]] = r
deltas, vdeltas = collections.defaultdict(list), collections.defaultdict(list)
for (ds, m), arms in cells.items():
    others = [v for k, v in arms.items() if k != "base" and (want is None or k == want)]
    if "base" not in arms or not others:
        continue
    base, other = arms["base"], others[0]
    if base["auc"] == other["auc"]:
        continue
    d, vd = other["auc"] - base["auc"], other["validation_auc"] - base["validation_auc"]
    deltas[m].append(d)
    vdeltas[m].append(vd)
    print(
        f"{ds:16s} {m:10s} {base['auc']:.4f} -> {other['auc']:.4f} ({d:+.4f}) val {vd:+.4f} "
        f"ll {base['logloss']:.4f}->{other['logloss']:.4f}"
    )
for m in deltas:
    print(
        m,
        len(deltas[m]),
        "mean %+.4f median %+.4f pos %d  val mean %+.4f  mean |d| %.4f"
        % (
            st.mean(deltas[m]),
            st.median(deltas[m]),
            sum(x > 0 for x in deltas[m]),
            st.mean(vdeltas[m]),
            st.mean(abs(x) for x in deltas[m]),
        ),
    )
every = [x for v in deltas.values() for x in v]
if every:
    print(
        "all",
        len(every),
        "%+.4f" % st.mean(every),
        sum(x > 0 for x in every),
        "mean |d| %.4f" % st.mean(abs(x) for x in every),
    )
