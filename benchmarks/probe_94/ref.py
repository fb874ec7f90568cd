import json
import os
import sys
from pathlib import Path

from ctrkit.bench import reference
from ctrkit.bench.accuracy import splits

reference.PENALTY = os.environ.get("PENALTY", "prior")
reference.LR = float(os.environ.get("LR", reference.LR))
tr, va, te = splits(Path(sys.argv[1]), 0.1)
if len(sys.argv) > 2:
    reference.L2_GRID = tuple(float(x) for x in sys.argv[2].split(","))
print(json.dumps(reference.fitted_reference(tr, va, te)))
