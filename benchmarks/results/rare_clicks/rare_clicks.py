"""Small data with few clicks: the models against logistic regression, with today's selection and bucket
rules and with the ones before them (the earlier rules patched back in for the comparison): ``previous``
(the log-loss rule only while the regression is selected, 16 buckets whatever the clicks), ``capped`` (the
log-loss rule for every kept model, at most one bucket per 100 rows of the rarer label), ``akaike``
(besides, each feature keeps buckets only where a one-feature regression's Akaike criterion earns them)
and ``current`` (besides, the warm start's C chosen on validation and four training blocks, not on
validation alone).

Data: 40,000 rows (32,000 train, of which the trainer holds out the last 10% for validation; 8,000 test),
three long-tailed categorical ids and two normal numericals; clicks at ~1-1.6% from first-order effects
only (an id's residue, 0.3 x the first numerical), so a well-fitted logistic regression is close to the
best model. Seeds 10-13 of ``data(seed)`` and, as ``seed -1``, the same family without numericals and at
1% clicks.

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/results/rare_clicks/rare_clicks.py \\
        > benchmarks/results/rare_clicks/output.txt
"""

import json
import math
import sys
import tempfile
from pathlib import Path

import numpy as np
import polars as pl
import torch

import ctrkit.models.inputs as inputs
import ctrkit.train.linear_fit as linear_fit
import ctrkit.train.selection as selection
from ctrkit.bench.accuracy import splits
from ctrkit.bench.panel import write_tabular
from ctrkit.eval.baselines import logistic_regression
from ctrkit.train.run import train

CURRENT = (selection.Selection._beats_baseline, inputs.NumericalBuckets.fit)
CV_MAX_ROWS = linear_fit.CV_MAX_ROWS


def _previous_selection(self, metrics):  # the log-loss rule guarded the regression only while it was selected
    if not self._selected_baseline:
        return True
    if self.baseline_logloss and not metrics.get("logloss", -math.inf) < self.best_metrics.get("logloss", math.inf):
        return False
    return True


def _previous_fit(self, numerical, rarer_label_rows=None, labels=None, seen=None):  # 16 buckets whatever the clicks
    return CURRENT[1](self, numerical)


def _capped_fit(self, numerical, rarer_label_rows=None, labels=None, seen=None):  # the cap, every feature keeps them
    return CURRENT[1](self, numerical, rarer_label_rows)


def data(seed: int) -> tuple[pl.DataFrame, list[str], list[str]]:
    rng = np.random.default_rng(seed if seed >= 0 else 3)
    n = 40000
    ids = rng.zipf(1.3, size=(n, 3)) % 5000
    if seed < 0:
        logit = -5 + (ids[:, 0] % 7 == 0) * 1.5 + (ids[:, 1] % 5 == 0) * 1.0
        frame = pl.DataFrame({"a": ids[:, 0], "b": ids[:, 1], "c": ids[:, 2]})
        numerical = []
    else:
        x = rng.normal(size=(n, 2)).astype(np.float32)
        logit = -4.6 + (ids[:, 0] % 7 == 0) * 1.5 + (ids[:, 1] % 5 == 0) * 1.0 + 0.3 * x[:, 0]
        frame = pl.DataFrame({"a": ids[:, 0], "b": ids[:, 1], "c": ids[:, 2], "x0": x[:, 0], "x1": x[:, 1]})
        numerical = ["x0", "x1"]
    labels = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.uint8)
    return frame.with_columns(pl.Series("label", labels)), ["a", "b", "c"], numerical


def main() -> None:
    torch.set_num_threads(2)
    print(json.dumps({"capability": torch.backends.cpu.get_cpu_capability(), "torch": torch.__version__}))
    with tempfile.TemporaryDirectory() as tmp:
        for seed in (-1, 10, 11, 12, 13):
            frame, categorical, numerical = data(seed)
            path = Path(tmp) / f"rare{seed}"
            write_tabular(path, frame[:32000], frame[32000:], "label", categorical, numerical)
            tr, va, te = splits(path, 0.1)
            row = {"seed": seed, "ctr": round(float(frame["label"].mean()), 4),
                   "logistic": round(logistic_regression(tr, va, te)["auc"], 4)}  # fmt: skip
            for rules, (select, fit), cv_rows in (
                ("previous", (_previous_selection, _previous_fit), 0),
                ("capped", (CURRENT[0], _capped_fit), 0),
                ("akaike", CURRENT, 0),
                ("current", CURRENT, CV_MAX_ROWS),
            ):
                selection.Selection._beats_baseline, inputs.NumericalBuckets.fit = select, fit
                linear_fit.CV_MAX_ROWS = cv_rows
                for model in ("dlrm", "dcnv2", "wide_deep"):
                    torch.manual_seed(0)
                    result = train(path, model=model, progress=False)
                    row[f"{model}_{rules}"] = round(result["auc"], 4)
            selection.Selection._beats_baseline, inputs.NumericalBuckets.fit = CURRENT
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    sys.exit(main())
