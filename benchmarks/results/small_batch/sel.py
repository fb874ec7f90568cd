import json, sys, statistics
a, b = sys.argv[1:3]
load = lambda f: {(r['dataset'], r['model']): r for r in map(json.loads, open(f))}
A, B = load(a), load(b)
for rule in ('auc', 'logloss', 'both'):
    d = []
    for k in A:
        if k not in B: continue
        va, vb = A[k]['validation'], B[k]['validation']
        pick = {'auc': vb['auc'] > va['auc'], 'logloss': vb['logloss'] < va['logloss'],
                'both': vb['auc'] > va['auc'] and vb['logloss'] < va['logloss']}[rule]
        d.append((B[k] if pick else A[k])['auc'] - A[k]['auc'])
    print(rule, len(d), 'mean %+.4f median %+.4f wins %d losses %d' % (statistics.mean(d), statistics.median(d), sum(x > 0 for x in d), sum(x < 0 for x in d)))
