"""CPU reference vs torch CPU float32: int8 GEMM, Hadamard, W8A8 linear, LM head, xent.

    .venv/bin/python benchmarks/kernels_cpu_k2.py

Median of 3 after one warm-up, ours and torch side by side in one run
prints a markdown
table (ours / torch: > 1 means slower). Results: benchmarks/results-kernels-k2.md.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch
import torch.nn.functional as F
from kernels import backend
from kernels.hadamard import hadamard
from kernels.int8_gemm import int8_mm
from kernels.linear_int8 import linear_int8_backward, linear_int8_forward
from kernels.lmhead import lmhead_backward, lmhead_forward
from kernels.xent import xent_backward, xent_forward
from benchmarks.kernels_cpu_ops import median_s  # one timing rule for both scripts


def med(fn, n=3):  # median of n after one warm-up
    return median_s(fn, n)


g = torch.Generator().manual_seed(0)
def row(name, ours, base):
    print(f"| {name} | {ours*1e3:.1f} | {base*1e3:.1f} | {ours/base:.2f}x |", flush=True)

with backend.force("cpu"):
    m, k, n = 1024, 2048, 2048
    a8 = torch.randint(-127, 128, (m, k), dtype=torch.int8, generator=g)
    b8 = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=g)
    af, bf = a8.float(), b8.float()
    row(f"int8_mm {m}x{k}x{n}", med(lambda: int8_mm(a8, b8)), med(lambda: af @ bf.t()))
    x = torch.randn(m, k, generator=g)
    row(f"hadamard ({m}, {k})", med(lambda: hadamard(x)),
        med(lambda: (x.reshape(m, -1, 256) @ torch.ones(256, 256)).reshape(m, k)))
    for (m, k, n) in [(1024, 2048, 2048), (1024, 2048, 5632)]:
        x = torch.randn(m, k, generator=g).bfloat16()
        w = (torch.randn(n, k, generator=g) * 0.02).bfloat16()
        dy = torch.randn(m, n, generator=g).bfloat16()
        s = torch.tensor([3 / 127])
        xf, wf, dyf = x.float(), w.float(), dy.float()
        def base():
            xx = xf.clone().requires_grad_(True)
            ww = wf.clone().requires_grad_(True)
            F.linear(xx, ww).backward(dyf)
        row(f"linear_int8 fwd+bwd {m}x{k}->{n}",
            med(lambda: (linear_int8_forward(x, w, s), linear_int8_backward(dy, x, w, s))),
            med(base))
    m, k, v = 256, 2048, 32768
    h = torch.randn(m, k, generator=g).bfloat16()
    w = (torch.randn(v, k, generator=g) * 0.02).bfloat16()
    dl = torch.randn(m, v, generator=g) * 1e-4
    hf, wf = h.float(), w.float()
    row("lmhead fwd", med(lambda: lmhead_forward(h, w)), med(lambda: hf @ wf.t()))
    row("lmhead bwd", med(lambda: lmhead_backward(dl, h, w)),
        med(lambda: (dl @ wf, dl.t() @ hf)))
    m, v = 256, 128256
    xl = torch.randn(m, v, generator=g) * 3
    t = torch.randint(0, v, (m,), generator=g)
    def xb():
        xx = xl.clone().requires_grad_(True)
        lse = torch.logsumexp(xx, 1)
        (F.cross_entropy(xx, t) + 1e-4 * (lse * lse).mean()).backward()
    def xo():
        loss, lse = xent_forward(xl, t)
        xent_backward(torch.tensor(1.0), xl, t, lse)
    row("xent+z fwd+bwd", med(xo), med(xb))
