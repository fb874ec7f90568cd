import json
import sys
from pathlib import Path

from ctrkit.bench.accuracy import splits
from ctrkit.bench.reference import fitted_reference
from ctrkit.eval.baselines import logistic_regression

tr, va, te = splits(Path(sys.argv[1]), 0.1)
print(json.dumps({"logistic": logistic_regression(tr, va, te)["auc"], "reference": fitted_reference(tr, va, te)}))
