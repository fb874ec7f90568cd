"""Cost of one OpenMP parallel region: an in-place multiply of n floats, 2,000 times, at the thread count
given (argv[1]); prints microseconds per call. Run under different OMP_WAIT_POLICY / GOMP_SPINCOUNT."""

import sys
import time

import torch

torch.set_num_threads(int(sys.argv[1]))
for n in (40_000, 200_000, 1_000_000):
    x = torch.randn(n)
    for _ in range(50):
        x.mul_(1.0)
    start = time.perf_counter()
    for _ in range(2000):
        x.mul_(1.0)
    print(f"threads {sys.argv[1]} n {n}: {(time.perf_counter() - start) / 2000 * 1e6:.1f} us per call")
