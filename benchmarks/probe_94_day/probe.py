"""#94 item 4 probe: on the shop logs (bench refresh --family shop), a DLRM continued day by day (`preprocess table
--like` + `train --continue-from`) against a logistic regression and a retrained DLRM on all days so far, each scored
on the next whole day; continued-run variants: the rates a continued run takes (default 0.5x dense/table, 4x
first-order), the full rates, a quarter.  Usage: python probe.py OUT SEEDS DAYS ROWS [VARIANTS,baselines]"""

import json
import sys
import time
from pathlib import Path

from ctrkit.bench.refresh_bench import SHOP
from ctrkit.checkpoint import load_checkpoint
from ctrkit.config import TrainConfig
from ctrkit.data.dataset import SplitBinaryDataset
from ctrkit.data.feature_spec import FeatureSpec
from ctrkit.eval.baselines import logistic_regression
from ctrkit.eval.evaluator import Scoring
from ctrkit.preprocess.table import preprocess_table
from ctrkit.preprocess.table_recipe import TableRecipe
from ctrkit.refresh.loop import table_recipe
from ctrkit.train.run import train

out, seeds, days, rows = Path(sys.argv[1]), [int(s) for s in sys.argv[2].split(",")], int(sys.argv[3]), int(sys.argv[4])
base = TrainConfig().resolve("dlrm")
VARIANTS = {
    "continued": {},
    "continued_on_all_days": {},  # days 1..k written --like the last model, continued from it
    "full_rates": {"lr": base.lr, "embedding_lr": base.embedding_lr, "wide_lr": base.wide_lr},
    "quarter_rates": {"lr": base.lr / 4, "embedding_lr": base.embedding_lr / 4, "wide_lr": base.wide_lr},
}
ONLY = sys.argv[5].split(",") if len(sys.argv) > 5 else list(VARIANTS)  # the variants to run, and the baselines
VARIANTS = {k: v for k, v in VARIANTS.items() if k in ONLY}
flags = SHOP.flags
results = []
for seed in seeds:
    work = out / f"s{seed}"
    files = SHOP.write(work / "days", days, rows, seed)
    first, _ = table_recipe(flags, like=False)
    later = TableRecipe(label=flags["label"], order_by=flags.get("order_by"))
    prev = {v: None for v in VARIANTS}
    for k in range(1, days):  # train on day k (continued) / days 1..k (retrain, lr); score day k+1
        row = {"seed": seed, "test_day": k + 1}
        for v, opts in VARIANTS.items():
            data, ckpt = work / f"{v}-{k}", work / f"{v}-{k}.pt"
            t = time.perf_counter()
            if prev[v] is None:
                preprocess_table(
                    [files[0]],
                    data,
                    first,
                    test_files=[files[1]],
                    validation_fraction=0.1,
                    overwrite=True,
                    progress=False,
                )
                train(data, progress=False, save_checkpoint=ckpt)
            else:
                like = load_checkpoint(prev[v], mmap=True, assemble=False).like(str(prev[v]))
                today = files[:k] if v == "continued_on_all_days" else [files[k - 1]]
                preprocess_table(
                    today,
                    data,
                    later,
                    like=like,
                    test_files=[files[k]],
                    validation_fraction=0.1,
                    overwrite=True,
                    progress=False,
                )
                train(data, progress=False, save_checkpoint=ckpt, continue_from=prev[v], **opts)
            row[v] = round(float(Scoring.load(ckpt, data, mapping="test").evaluate()["auc"]), 5)
            row[v + "_s"] = round(time.perf_counter() - t, 1)
            prev[v] = ckpt
        if "baselines" not in ONLY:
            results.append(row)
            print(json.dumps(row), flush=True)
            continue
        data = work / f"all-{k}"
        preprocess_table(
            files[:k], data, first, test_files=[files[k]], validation_fraction=0.1, overwrite=True, progress=False
        )
        train(data, progress=False, save_checkpoint=work / f"retrain-{k}.pt")
        row["retrain"] = round(float(Scoring.load(work / f"retrain-{k}.pt", data, mapping="test").evaluate()["auc"]), 5)
        spec = FeatureSpec.from_yaml(data)
        row["regression"] = round(
            float(logistic_regression(*(SplitBinaryDataset(spec, m) for m in ("train", "validation", "test")))["auc"]),
            5,
        )
        results.append(row)
        print(json.dumps(row), flush=True)
(out / "results.json").write_text(json.dumps(results, indent=1))
