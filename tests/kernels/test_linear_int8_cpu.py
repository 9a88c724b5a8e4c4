"""The fast CPU path of the W8A8 linear gives the bits of the spec, step for step.

The spec is written out here from first principles (``(v + 1.5*2^23) - 1.5*2^23`` rounding,
``where`` masks, the last-dim Hadamard reference, whole-tensor passes, fresh tensors), and
the CPU path (codes kept from the forward, dim-0 rotations in tiles, row slabs, scratch
buffers, ``torch.round``, skipped no-op clamps, transposed ``_int_mm`` operands) must
match it bit for bit on normal, clipped, subnormal and zero inputs. Also the helpers it
relies on: ``hadamard_dim0_cpu_``, ``exact_int_mm_cpu`` on transposed views, the dim-0 tree
sum and ``open1b_kernels.core.workspace``.
"""
from __future__ import annotations

import math

import pytest
import torch

from open1b_kernels.core import workspace
from open1b_kernels.core.backend import force
from open1b_kernels.int8.hadamard import hadamard_cpu, hadamard_dim0_cpu_
from open1b_kernels.int8.gemm import bf16_rne
from open1b_kernels.int8.route import exact_int_mm_cpu
from open1b_kernels.int8.linear import (INV_127, Q_MAX, RND, TWO_OVER_SQRT127, linear_int8_backward,
                                 linear_int8_forward)
from open1b_kernels.core.reduce import tree_sum_cpu
from testkit.kernels.autograd import linear_int8
from tests.kernels.support import bits

F32 = torch.float32


# ---------------------------------------------------------------- the spec, spelled out
def _rne(v):
    return (v + RND) - RND


def _safe(s):
    return torch.where(s == 0, torch.ones_like(s), s)


def _quantize(x, step):
    v = x.to(F32) / _safe(step.reshape(-1, 1))
    return _rne(v.clamp(-Q_MAX, Q_MAX)).to(torch.int8)


def _weight_step(w):
    inv_k = float(torch.tensor(1.0, dtype=F32) / torch.tensor(float(w.shape[1]), dtype=F32))
    return tree_sum_cpu(w.to(F32).abs(), -1) * inv_k * TWO_OVER_SQRT127


def _rot_quant(t):
    r = hadamard_cpu(t.to(F32))
    s = r.abs().amax(dim=1) * INV_127
    return _quantize(r, s), s


def _mm(a, b, rs, cs):
    acc = (a.to(torch.float64) @ b.to(torch.float64).t()).to(torch.int32)  # exact
    return acc.to(F32) * rs.reshape(-1, 1) * cs.reshape(1, -1)


def _spec(x, w, s_x, dy):
    m, k = x.shape
    sw = _weight_step(w)
    q_w, q_x = _quantize(w, sw), _quantize(x, s_x)
    y = bf16_rne(_mm(q_x, q_w, s_x, sw))
    w_hat = q_w.to(F32) * sw.reshape(-1, 1)
    (qa, sa), (qb, sb) = _rot_quant(dy), _rot_quant(w_hat.t())
    dx_hat = _mm(qa, qb, sa, sb)
    (qa2, sa2), (qb2, sb2) = _rot_quant(dy.t()), _rot_quant(q_x.t())
    dw_raw = _mm(qa2, qb2, sa2, sb2 * s_x)
    v = x.to(F32) / _safe(s_x)
    inside = (v >= -Q_MAX) & (v <= Q_MAX)
    dx = bf16_rne(torch.where(inside, dx_hat, torch.zeros_like(dx_hat)))
    vw = w.to(F32) / _safe(sw.reshape(-1, 1))
    inside_w = (vw >= -Q_MAX) & (vw <= Q_MAX)
    dw = torch.where(inside_w, dw_raw, torch.zeros_like(dw_raw))
    vc = v.clamp(-Q_MAX, Q_MAX)
    term = dx_hat * torch.where(inside, _rne(vc) - v, vc)
    g = float(torch.tensor(1.0 / math.sqrt(m * k * Q_MAX), dtype=F32))
    ds = tree_sum_cpu(term.reshape(-1), 0) * g
    return y, dx, dw, ds


def _case(m, k, n, seed, kind):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * 2
    w = torch.randn(n, k, generator=g) * 0.05
    dy = torch.randn(m, n, generator=g) * 1e-2
    s = torch.tensor([4.0 / 127])
    if kind == "clipped":  # outlier weights and activations, a zero weight row, zero dy row
        w[0] = 0.0
        w[1, :3] = 1e3
        w.view(-1)[::97] *= 300
        x[:, 1] = 1e4
        x.view(-1)[::13] = -1e5
        dy[0] = 0.0
    elif kind == "edges":  # subnormals, ties at .5, signed zeros
        w.view(-1)[::3] = 1e-40
        x.view(-1)[::5] = 1e-39
        dy.view(-1)[::7] = 3e-39
        x.view(-1)[::11] = 0.5 * 4 / 127
        x.view(-1)[1::11] = -1.5 * 4 / 127
        x.view(-1)[2::11] = -0.0
    elif kind == "tiny":  # subnormal row-absmax steps in the rotated gradients
        w, dy, s = w * 1e-36, dy * 1e-30, torch.tensor([1e-38])
    elif kind == "lone_subnormals":  # dy of isolated 2^-133 (the least bf16): the rotated
        # row max m = 2^-137 gives the subnormal step rn(m / 127) = 2^-144, so m / s = 128
        # and only the clamp keeps the code at 127
        dy = torch.zeros(m, n)
        dy.view(-1)[::37] = 2.0 ** -133
        dy.view(-1)[5::41] = -(2.0 ** -133)
    elif kind == "zeros":
        dy[:, ::2] = 0.0
        w.view(-1)[::2] = 0.0
        x.view(-1)[::2] = 0.0
    return x.to(torch.bfloat16), w.to(torch.bfloat16), s, dy.to(torch.bfloat16)


CASES = [(m, k, n, kind) for (m, k, n) in [(40, 300, 17), (16, 256, 256), (3, 5, 7),
                                             (130, 520, 270), (64, 2048, 600)]
         for kind in ("normal", "clipped", "edges", "tiny", "lone_subnormals", "zeros")]


@pytest.mark.parametrize("m,k,n,kind", CASES)
def test_cpu_path_matches_spec(m, k, n, kind):
    x, w, s, dy = _case(m, k, n, m + k + n, kind)
    y_ref, dx_ref, dw_ref, ds_ref = _spec(x, w, s, dy)
    with force("cpu"):
        y = linear_int8_forward(x, w, s)
        dx, dw, ds = linear_int8_backward(dy, x, w, s)
        xa, wa, sa = (t.clone().requires_grad_(True) for t in (x, w, s))
        ya = linear_int8(xa.reshape(1, m, k), wa, sa)
        ya.backward(dy.reshape(1, m, n))
    for got, ref in ((y, y_ref), (dx, dx_ref), (dw, dw_ref), (ds, ds_ref), (ya, y_ref),
                     (xa.grad, dx_ref), (sa.grad, ds_ref)):
        # The autograd outputs keep the (1, m, n) batch shape: compare the values, flat.
        assert got.dtype == ref.dtype and torch.equal(bits(got).reshape(-1), bits(ref).reshape(-1))
    # the wrapper's bf16 dw is the float32 dw rounded by .to, as autograd would round it
    assert torch.equal(bits(wa.grad), bits(dw_ref.to(torch.bfloat16)))


def test_round_is_the_rne_of_the_spec():
    # codes and the LSQ term t = rne(vc) - v from torch.round equal (v + RND) - RND's
    g = torch.Generator().manual_seed(0)
    v = torch.cat([torch.randn(200_000, generator=g) * 60,
                   torch.arange(-255, 256, dtype=F32) / 2,  # every tie in range
                   torch.tensor([0.0, -0.0, 1e-45, -1e-45, 1e-39, -0.49999997, 0.49999997,
                                 126.5, -126.5, 127.49999, -127.49999])])
    vc = v.clamp(-Q_MAX, Q_MAX)
    assert torch.equal(vc.round().to(torch.int8), _rne(vc).to(torch.int8))
    assert torch.equal(bits(vc.round() - v), bits(_rne(vc) - v))


@pytest.mark.parametrize("r,c,block", [(256, 3, 256), (512, 5000, 256), (768, 2100, 256),
                                       (4096, 3, 4), (64, 4097, 16), (1024, 17, 64)])
def test_hadamard_dim0_is_the_transposed_reference(r, c, block):
    g = torch.Generator().manual_seed(r + c)
    x = torch.randn(r, c, generator=g) * torch.exp(torch.randn(r, c, generator=g) * 8)
    x.view(-1)[::7] = 1e-41
    x.view(-1)[::11] = -0.0
    ref = hadamard_cpu(x.t().contiguous(), block).t()
    y = hadamard_dim0_cpu_(x.clone(), block)
    assert torch.equal(bits(ref.contiguous()), bits(y))


def test_int_mm_on_transposed_views():
    g = torch.Generator().manual_seed(3)
    for m, k, n in [(256, 300, 520), (17, 33, 19), (16, 16, 16), (5, 40, 30)]:
        a = torch.randint(-127, 128, (m, k), generator=g, dtype=torch.int8)
        b = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
        ref = a.long() @ b.long().t()
        for aa in (a, a.t().contiguous().t()):
            for bb in (b, b.t().contiguous().t()):
                assert torch.equal(exact_int_mm_cpu(aa, bb).long(), ref)
                out = torch.empty((m, n), dtype=torch.int32)
                exact_int_mm_cpu(aa, bb, out=out)
                assert torch.equal(out.long(), ref)


def test_dim0_tree_is_the_last_dim_tree():
    g = torch.Generator().manual_seed(5)
    for shape in [(33, 17), (64, 5), (3, 4, 5), (1000, 2), (1, 9)]:
        x = torch.randn(*shape, generator=g) * torch.exp(torch.randn(*shape, generator=g) * 20)
        x.view(-1)[::5] = -0.0
        ref = tree_sum_cpu(x.movedim(0, -1).contiguous(), -1)  # last-dim path
        assert torch.equal(bits(tree_sum_cpu(x, 0)), bits(ref))
    assert torch.equal(bits(tree_sum_cpu(torch.full((6, 3), -0.0), 0)),
                       bits(torch.zeros(3)))  # padding adds +0.0


def test_scratch_reuses_and_releases():
    workspace.release()
    a = workspace.scratch("test.buf", (4, 8), F32)
    b = workspace.scratch("test.buf", (2, 3), torch.int8)
    assert a.data_ptr() == b.data_ptr() and b.shape == (2, 3) and b.dtype == torch.int8
    c = workspace.scratch("test.buf", (100, 100), F32)  # grows
    assert c.shape == (100, 100) and workspace.total_bytes() >= 40_000
    workspace.release()
    assert workspace.total_bytes() == 0
