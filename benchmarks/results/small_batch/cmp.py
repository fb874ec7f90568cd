import json, sys, collections
a, b = sys.argv[1:3]
load = lambda f: {(r['dataset'], r['model']): r for r in map(json.loads, open(f))}
A, B = load(a), load(b)
diffs = []; dl = []
for k in A:
    if k in B:
        d = B[k]['auc'] - A[k]['auc']; diffs.append(d); dl.append(B[k]['logloss'] - A[k]['logloss'])
        print(f"{k[0]:14s} {k[1]:10s} {A[k]['auc']:.4f} -> {B[k]['auc']:.4f} ({d:+.4f})  ll {A[k]['logloss']:.4f} -> {B[k]['logloss']:.4f}  steps {A[k]['steps']}->{B[k]['steps']} batch {B[k]['batch']} s {A[k]['seconds']}->{B[k]['seconds']}")
import statistics
print(len(diffs), 'cells; mean auc diff %+.4f median %+.4f; wins %d losses %d; mean ll diff %+.4f' % (statistics.mean(diffs), statistics.median(diffs), sum(d > 0 for d in diffs), sum(d < 0 for d in diffs), statistics.mean(dl)))
