"""Logistic regression with quantile buckets of the numerical features beside their values, on the accuracy
panel's splits: how many buckets the first-order term should have (NUMERICAL_BUCKETS in models/inputs.py).

Run from the repository root after `bash benchmarks/run_accuracy.sh` built build/accuracy:
    OMP_WAIT_POLICY=PASSIVE .venv/bin/python -W ignore benchmarks/results/numerical_buckets/bucket_lr.py \
        criteo movielens tabular-120k-s0 amounts-120k-s0 planted-120k-s0
Prints per data set: {buckets: (validation AUC, chosen C, test AUC)}; 0 buckets is the plain regression.
Numerical values go through the models' rule (signed log where the 99.9th percentile of |x| exceeds 50,
then standardised); buckets are scikit-learn's KBinsDiscretizer quantile bins, one-hot.
"""

import sys
from pathlib import Path

import numpy as np
from scipy import sparse
from sklearn.linear_model import LogisticRegression
from sklearn.preprocessing import KBinsDiscretizer, OneHotEncoder, StandardScaler

from ctrkit.bench.accuracy import splits
from ctrkit.eval.baselines import read_table
from ctrkit.eval.metrics import roc_auc

for name in sys.argv[1:]:
    tr, va, te = (read_table(t) for t in splits(Path("build/accuracy") / name, 0.1))
    enc = OneHotEncoder(handle_unknown="ignore").fit(tr.categorical)
    k = tr.numerical.shape[1]
    heavy = np.quantile(np.abs(tr.numerical), 0.999, axis=0) > 50 if k else None

    def signed_log(x, heavy=heavy):
        return np.where(heavy, np.sign(x) * np.log1p(np.abs(x)), x)

    out = {}
    for bins in (0, 8, 16, 32):
        sc = StandardScaler().fit(signed_log(tr.numerical)) if k else None
        kb = None
        if k and bins:
            kb = KBinsDiscretizer(n_bins=bins, encode="onehot", strategy="quantile", subsample=None).fit(tr.numerical)

        def design(t, sc=sc, kb=kb, enc=enc, signed_log=signed_log):
            parts = [enc.transform(t.categorical), *t.multi_hot]
            if sc is not None:
                parts.append(sparse.csr_matrix(sc.transform(signed_log(t.numerical))))
            if kb is not None:
                parts.append(kb.transform(t.numerical))
            return sparse.hstack(parts, format="csr")

        xtr, xva, xte = design(tr), design(va), design(te)
        best = None
        for c in (0.01, 0.03, 0.1, 0.3, 1.0):
            m = LogisticRegression(C=c, max_iter=2000).fit(xtr, tr.labels)
            auc = roc_auc(va.labels, m.decision_function(xva))
            if best is None or auc > best[0]:
                best = (auc, c, m)
        auc, c, m = best
        out[bins] = (round(auc, 4), c, round(roc_auc(te.labels, m.decision_function(xte)), 4))
    print(name, k, out, flush=True)
