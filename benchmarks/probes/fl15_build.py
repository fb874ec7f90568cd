"""One-off probe (issue 69 item 2): seconds to build DLRM at width 128 on the FL15 tables (26 tables, 32.7M rows,
16.7 GB), its tables drawn at construction, with the ctrkit on sys.path. Prints one JSON line."""

import json
import sys
import time

import torch

from ctrkit.data.synthetic import CRITEO_1TB_FL15_CARDINALITIES
from ctrkit.models.registry import create_model, make_config

cfg = make_config("dlrm", {"num_numerical": 13, "cardinalities": CRITEO_1TB_FL15_CARDINALITIES, "embedding_dim": 128,
                           "bottom_mlp": [512, 256, 128], "top_mlp": [1024, 1024, 512, 256, 1], "linear": False})  # fmt: skip
torch.manual_seed(0)
start = time.perf_counter()
model = create_model("dlrm", cfg)
seconds = time.perf_counter() - start
w = model.embeddings.onehot.weight
print(json.dumps({"tree": sys.argv[1], "seconds": round(seconds, 2), "threads": torch.get_num_threads(),
                  "values": w.numel(), "checksum": float(w[::997, ::7].double().sum())}))  # fmt: skip
