"""One training run through the Python API, printed as one JSON line: the test AUC of a model on a dataset
with its defaults and the training options given as JSON. Used for the batch-size check in the README
("Accuracy on independent data"):

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/results/independent/one_run.py DATASET MODEL '{"batch_size": 256}'
"""

import json
import sys
import time

import torch

from ctrkit.train.run import train

torch.set_num_threads(2)
dataset, model = sys.argv[1], sys.argv[2]
options = json.loads(sys.argv[3]) if len(sys.argv) > 3 else {}
start = time.time()
result = train(dataset, model, progress=False, **options)
print(json.dumps({"dataset": dataset, "model": model, **options, "test_auc": round(result["auc"], 4),
                  "best_step": result["best_step"], "seconds": round(time.time() - start, 1)}))  # fmt: skip
