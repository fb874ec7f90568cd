#!/usr/bin/env bash
# Raw Outbrain files -> dataset -> Wide & Deep -> MAP@12, against ranking each display's ads by the ad's
# training CTR. ROWS clicks rows of `ctrkit synth outbrain-raw` (the issue's target: 2,000,000).
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_WAIT_POLICY=PASSIVE
ROWS="${ROWS:-2000000}"
WORK="${WORK:-build/outbrain-$ROWS}"
BIN=.venv/bin
$BIN/ctrkit synth outbrain-raw --out "$WORK/raw" --rows "$ROWS" --overwrite
/usr/bin/time -f "preprocess: %e s wall, peak RSS %M KB" \
    $BIN/ctrkit preprocess outbrain "$WORK/raw" --out "$WORK/data" --overwrite --no-progress
$BIN/ctrkit train --model wide_deep --dataset "$WORK/data" --save-checkpoint "$WORK/wd.pt" --no-progress \
    --log-path "$WORK/train.jsonl" \
    --threads "${THREADS:-2}"
$BIN/ctrkit evaluate --checkpoint "$WORK/wd.pt" --dataset "$WORK/data"
$BIN/python - "$WORK" <<'PY'
import json, sys
import numpy as np
from ctrkit.data.dataset import SplitBinaryDataset
from ctrkit.data.feature_spec import FeatureSpec
from ctrkit.metrics import mean_average_precision

work = sys.argv[1]
spec = FeatureSpec.from_yaml(f"{work}/data")
test = SplitBinaryDataset(spec, "test")
ctr = np.asarray(test.slice(0, len(test)).numerical, dtype=np.float32)[:, spec.numerical_features.index("ad_id_ctr")]
baseline, groups = mean_average_precision(test.groups(), test.labels(), ctr)
truth = json.load(open(f"{work}/raw/truth.json"))
print(f"ranking by the ad's training CTR: MAP@12 {baseline:.4f} over {groups:,} displays; "
      f"true scores (all displays): {truth['true_score_map12']:.4f}")
PY
