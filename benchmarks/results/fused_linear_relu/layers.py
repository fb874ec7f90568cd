# the layers alone: OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/results/fused_linear_relu/layers.py [bf16]
import torch, time, statistics, sys
torch.set_num_threads(2)
dt = torch.bfloat16 if len(sys.argv) > 1 and sys.argv[1] == "bf16" else torch.float32
def t(f, n=30):
    for _ in range(5): f()
    ts = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n): f()
        ts.append((time.perf_counter() - t0) / n * 1e3)
    return statistics.median(ts)
tot_a = tot_b = 0
for i, o in ((13, 512), (512, 256), (256, 16), (368, 1024), (1024, 1024), (1024, 512), (512, 256)):
    x = torch.randn(2048, i, dtype=dt); w = torch.randn(o, i, dtype=dt); b = torch.randn(o, dtype=dt)
    a = t(lambda: torch.nn.functional.linear(x, w, b).relu_())
    try:
        c = t(lambda: torch.ops.mkldnn._linear_pointwise(x, w, b, "relu", [], ""))
        same = torch.allclose(torch.nn.functional.linear(x, w, b).relu_(), torch.ops.mkldnn._linear_pointwise(x, w, b, "relu", [], ""), rtol=1e-3, atol=1e-3)
    except Exception as e:
        c, same = float("nan"), str(e)[:80]
    m = t(lambda: torch.mm(x, w.t()))
    tot_a += a; tot_b += c
    print(f"{i}->{o}: linear+relu_ {a:.3f} ms, fused {c:.3f} ms, mm alone {m:.3f} ms, same {same}")
print(f"total {tot_a:.3f} vs {tot_b:.3f}")
