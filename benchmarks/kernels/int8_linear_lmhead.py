"""CPU reference vs torch CPU float32: int8 GEMM, Hadamard, W8A8 linear, LM head, xent.

    .venv/bin/python -m benchmarks.kernels.int8_linear_lmhead

Median of 3 after one warm-up, ours and the anchor side by side in one run; prints a
markdown table (ours / anchor: > 1 means slower) with the 1-minute load average after
each row, and whether the run was under load (benchmarks/machine.py). Results:
benchmarks/results/results-kernels-int8-linear-lmhead.md.

The int8 GEMM rows time this project's ``open1b_kernels.int8.gemm.int8_mm`` on its CPU path, as
the W8A8 linear calls it: int8 codes in, the exactly specified dequantization epilogue,
bf16 out. The anchor is what a user would otherwise run for a linear of that shape on a
CPU: a torch float32 matmul. (The int32-only row shows how much of it is the GEMM
itself, which is ``torch._int_mm``, i.e. oneDNN.)
"""
import torch
import torch.nn.functional as F

from benchmarks.machine import LoadLog, describe, median_s
from open1b_kernels.core import backend
from open1b_kernels.int8.hadamard import hadamard
from open1b_kernels.int8.gemm import int8_mm
from open1b_kernels.int8.linear import linear_int8_backward, linear_int8_forward
from open1b_kernels.ops.lmhead import lmhead_backward, lmhead_forward
from open1b_kernels.ops.xent import xent_backward, xent_forward


def med(fn, n=3):  # median of n after one warm-up
    return median_s(fn, n)


def main() -> None:
    g = torch.Generator().manual_seed(0)
    load = LoadLog()
    print(describe())
    print("| op (ours, CPU path) | anchor | ours ms | anchor ms | ratio | load (1 min) |")
    print("|---|---|---|---|---|---|")

    def row(name, anchor, ours, base):
        print(f"| {name} | {anchor} | {ours*1e3:.1f} | {base*1e3:.1f} | {ours/base:.2f}x | "
              f"{load.sample(name):.2f} |", flush=True)

    with backend.force("cpu"):
        for m, k, n in [(1024, 2048, 2048), (4096, 2048, 5632)]:
            a8 = torch.randint(-127, 128, (m, k), dtype=torch.int8, generator=g)
            b8 = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=g)
            sa, sb = torch.rand(m, generator=g) * 1e-2, torch.rand(n, generator=g) * 1e-2
            af, bf = a8.float(), b8.float()
            fp32 = med(lambda: af @ bf.t())
            row(f"int8_mm {m}x{k}x{n}, dequantized to bf16", "torch fp32 matmul, same shape",
                med(lambda: int8_mm(a8, b8, sa, sb, torch.bfloat16)), fp32)
            row(f"int8_mm {m}x{k}x{n} -> int32, no epilogue", "torch fp32 matmul, same shape",
                med(lambda: int8_mm(a8, b8)), fp32)
        m, k = 1024, 2048
        x = torch.randn(m, k, generator=g)
        row(f"hadamard ({m}, {k}), B=256", "fp32 matmul by a 256x256 block",
            med(lambda: hadamard(x)),
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
            row(f"linear_int8 fwd+bwd {m}x{k}->{n}", "F.linear fp32 fwd+bwd",
                med(lambda: (linear_int8_forward(x, w, s), linear_int8_backward(dy, x, w, s))),
                med(base))
        m, k, v = 256, 2048, 32768
        h = torch.randn(m, k, generator=g).bfloat16()
        w = (torch.randn(v, k, generator=g) * 0.02).bfloat16()
        dl = torch.randn(m, v, generator=g) * 1e-4
        hf, wf = h.float(), w.float()
        row(f"lmhead fwd {m}x{k}x{v}", "torch fp32 matmul", med(lambda: lmhead_forward(h, w)),
            med(lambda: hf @ wf.t()))
        row("lmhead bwd (dh, dw)", "2 torch fp32 matmuls", med(lambda: lmhead_backward(dl, h, w)),
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
        row(f"xent + z-loss fwd+bwd ({m}, {v})", "F.cross_entropy fp32 (+ z) fwd+bwd",
            med(xo), med(xb))
    print(load.summary())


if __name__ == "__main__":
    main()
