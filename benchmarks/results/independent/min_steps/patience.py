import json, sys, torch
from ctrkit.train.run import train
torch.set_num_threads(2)
out = {}
for ds in sys.argv[2:]:
    for m in ("dlrm", "dcnv2", "wide_deep"):
        torch.manual_seed(0)
        r = train(ds, model=m, progress=False, early_stopping_patience=int(sys.argv[1]), plateau_patience=int(sys.argv[1]) // 2)
        out[f"{ds}:{m}"] = (r["auc"], r.get("best_step"), r.get("step"))
        print(ds, m, round(r["auc"], 4), r.get("best_step"), r.get("step"), flush=True)
json.dump(out, open(f"patience{sys.argv[1]}.json", "w"))  # in the working directory
