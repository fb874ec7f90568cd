# python benchmarks/results/omp_wait_fraction/diff_profiles.py profile_dlrm_fp32_passive.json profile_dlrm_fp32_spin.json
import json, sys
a, b = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
keys = sorted(set(a) | set(b), key=lambda k: -(a.get(k, (0, 0))[0] - b.get(k, (0, 0))[0]))
ta = sum(v[0] for v in a.values()); tb_ = sum(v[0] for v in b.values())
print(f"total self ms/step {ta:.1f} vs {tb_:.1f}")
for k in keys[:40]:
    x, y = a.get(k, (0, 0)), b.get(k, (0, 0))
    print(f"{k[:55]:55s} {x[0]:7.2f} {y[0]:7.2f} diff {x[0]-y[0]:6.2f} calls/step {x[1]:.0f}")
