import json, statistics
new = {r['dataset']: r for r in json.load(open('benchmarks/accuracy-small-batch/results.json'))['rows']}
rows = []
for f in ('benchmarks/results/small_batch/mid-small.jsonl',):
    try: rows += [json.loads(l) for l in open(f)]
    except FileNotFoundError: pass
d = []
for r in rows:
    base = new[r['dataset']]['results'][r['model']]
    lr, gb = new[r['dataset']]['results']['logistic']['auc'], new[r['dataset']]['results']['lightgbm']['auc']
    d.append(r['auc'] - base['auc'])
    print(f"{r['dataset']:18s} {r['model']:10s} {base['auc']:.4f} -> {r['auc']:.4f} ({r['auc']-base['auc']:+.4f}) batch {r['batch']} LR {lr:.4f} GBM {gb:.4f} s {base['seconds']:.0f}->{r['seconds']:.0f}")
print(len(d), 'mean %+.4f median %+.4f up %d down %d' % (statistics.mean(d), statistics.median(d), sum(x > 0.0005 for x in d), sum(x < -0.0005 for x in d)))
