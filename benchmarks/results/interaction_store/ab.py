"""The dot interaction's kernels, old against new, one thread: the library built from the sources of a given commit
(argv[1]: 0b01286, the forward's pairs copied out one by one and its vectors transposed lane by lane; edeea1e, the
pairs stored as whole registers; bcf2144, the backward in groups of 4 rows reading the bfloat16 gradient pair by
pair) against this tree's, both with this tree's flags. First every output and gradient of both, bit for bit, over
shapes (1 to 100 features, widths 8 to 32, with and without a dense vector and self-interaction, padded or not, a NaN
among the inputs; float32, bfloat16 under float32 tables, bfloat16); then the Criteo-Kaggle shape (batch 1,024, 26
tables, width 16, output 368), 60 interleaved calls each of forward and backward, medians in us. argv: COMMIT"""

import json
import statistics
import sys
import time

import torch

from ctrkit import native
from ctrkit.bench.ab import native_library_at
from ctrkit.bench.peak import machine

torch.set_num_threads(1)
libs = {"old": native_library_at(sys.argv[1]), "new": native.build()}


def forward(lib, kind, dense, emb, W, self_):
    out = torch.full((emb.shape[0], W), 7.0, dtype=torch.float32 if kind == "f32" else torch.bfloat16)
    getattr(lib, f"ctrkit_dot_forward_{kind}")(None if dense is None else dense.data_ptr(), emb.data_ptr(),
                                               out.data_ptr(), *emb.shape, W, self_)  # fmt: skip
    return out.view(torch.int32 if kind == "f32" else torch.int16)


def backward(lib, kind, grad, dense, emb, W, self_):
    grad_dense = None if dense is None else torch.full_like(dense, 7.0)
    grad_emb = torch.full(emb.shape, 7.0)
    getattr(lib, f"ctrkit_dot_backward_{kind}")(grad.data_ptr(), None if dense is None else dense.data_ptr(),
                                                emb.data_ptr(), None if dense is None else grad_dense.data_ptr(),
                                                grad_emb.data_ptr(), *emb.shape, W, self_)  # fmt: skip
    return [grad_emb.view(torch.int32)] + (
        [] if dense is None else [grad_dense.view(torch.int32 if kind == "f32" else torch.int16)]
    )


g = torch.Generator().manual_seed(0)
cases = same = same_backward = 0
for F in (1, 3, 15, 26, 40, 100):
    for D in (8, 12, 16, 32):
        for self_ in (0, 1):
            for has_dense in (True, False):
                for kind in ("f32", "bf16_f32", "bf16"):
                    t = torch.float32 if kind == "f32" else torch.bfloat16
                    V = F + has_dense
                    width = (D if has_dense else 0) + V * (V - 1) // 2 + self_ * V
                    for W in (width, width + (-width) % 8, width + 3):
                        dense = torch.randn(37, D, generator=g).to(t) if has_dense else None
                        emb = torch.randn(37, F, D, generator=g).to(torch.bfloat16 if kind == "bf16" else torch.float32)
                        emb[3, 0, 1] = float("nan")
                        cases += 1
                        same += torch.equal(*(forward(lib, kind, dense, emb, W, self_) for lib in libs.values()))
                        grad = torch.randn(37, W, generator=g).to(t)
                        a, b = (backward(lib, kind, grad, dense, emb, W, self_) for lib in libs.values())
                        same_backward += all(torch.equal(x, y) for x, y in zip(a, b))
B, F, D, W = 1024, 26, 16, 368
times = {}
for kind in ("f32", "bf16_f32"):
    t = torch.float32 if kind == "f32" else torch.bfloat16
    dense, emb, grad = torch.randn(B, D).to(t), torch.randn(B, F, D), torch.randn(B, W).to(t)
    calls = {"forward": (forward, (kind, dense, emb, W, 0)), "backward": (backward, (kind, grad, dense, emb, W, 0))}
    for name, (fn, args) in calls.items():
        runs = {k: [] for k in libs}
        for r in range(60):
            for k, lib in libs.items() if r % 2 == 0 else list(libs.items())[::-1]:
                t0 = time.perf_counter()
                fn(lib, *args)
                runs[k].append((time.perf_counter() - t0) * 1e6)
        times[f"{name} {kind}"] = {k: statistics.median(v) for k, v in runs.items()}
print(json.dumps({"old_commit": sys.argv[1], "cases": cases, "bit_equal_cases": same,
                  "bit_equal_backward_cases": same_backward, "us": times, "machine": machine()}, indent=1))  # fmt: skip
