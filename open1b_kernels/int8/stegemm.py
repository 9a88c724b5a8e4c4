"""The W8A8 linear's input-gradient GEMM with its straight-through epilogue, in one kernel.

For the backward of open1b_kernels/int8/linear.py (Triton path), with the rotated codes qa (M, Np)
and qb (K, Np), their steps sa (M,) and sb (K,), the input x (M, K) bf16 and its step s_x,
each output element is, in the definitions' order (gemm.py's epilogue, then quantize.py's
``ste`` with ``want_term``):

    dX_hat = rn( rn( float(sum_n qa[m, n] qb[k, n]) * sa[m] ) * sb[k] )
    v      = div_rn(x, s_x)            (a zero step divides by 1)
    inside = -127 <= v <= 127
    dx     = bf16_rne( where(inside, dX_hat, 0) )
    term   = dX_hat * where(inside, rne(clamp(v)) - v, clamp(v))

and the LSQ step gradient's sum is the pairwise tree of ``term`` over all M * K elements in
row-major order. Each program holds a (BLOCK_M, BLOCK_N) tile of a row-major (M, K)
output; when K is a multiple of BLOCK_N (a power of two) every row segment of the tile is
an aligned block of the flattened tree, so the program writes that segment's tree
(reduce.py's ``tree_sum_rows``) into ``parts`` (M, K / BLOCK_N), and the tree over
``parts`` flattened finishes the sum (the blockable tree: the same adds). Neither dX_hat
nor term reaches memory: the op-by-op form wrote and read back both (4 M K bytes each,
twice) and launched the STE kernel between (CONTRACT.md, "GPU cost").
"""
from __future__ import annotations

import torch

from open1b_kernels.core.backend import HAVE_TRITON, LAUNCH_OPTIONS, interpreting
from open1b_kernels.core.reduce import tree_sum
from open1b_kernels.int8.gemm import GPU_BLOCKS, INTERPRET_BLOCKS, bf16_operand

if HAVE_TRITON:
    import triton
    import triton.language as tl

    from open1b_kernels.core.reduce import tree_sum_rows
    from open1b_kernels.int8.gemm import bf16_rne_bits, grouped_tile, load_f32
    from open1b_kernels.int8.quantize import RND_K


if HAVE_TRITON:

    @triton.jit
    def _ste_gemm_kernel(a_ptr, b_ptr, sa_ptr, sb_ptr, x_ptr, sx_ptr, dx_ptr, parts_ptr,
                         M, N, NP,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
        # output (M, N) = (tokens, input features); the contraction runs over NP
        pid_m, pid_n = grouped_tile(M, N, BLOCK_M, BLOCK_N, GROUP_M)
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        rk = tl.arange(0, BLOCK_K)
        a_rows = a_ptr + rm[:, None].to(tl.int64) * NP
        b_cols = b_ptr + rn[None, :].to(tl.int64) * NP
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
        for k0 in range(0, NP, BLOCK_K):
            kk = k0 + rk
            a = tl.load(a_rows + kk[None, :], mask=(rm[:, None] < M) & (kk[None, :] < NP),
                        other=0)
            b = tl.load(b_cols + kk[:, None], mask=(rn[None, :] < N) & (kk[:, None] < NP),
                        other=0)
            acc += tl.dot(a, b, out_dtype=tl.int32)  # exact: gemm.py's MAX_K
        mask = (rm[:, None] < M) & (rn[None, :] < N)
        sa = tl.load(sa_ptr + rm, mask=rm < M, other=0.0)
        sb = tl.load(sb_ptr + rn, mask=rn < N, other=0.0)
        y = (acc.to(tl.float32) * sa[:, None]) * sb[None, :]          # dX_hat
        off = rm[:, None].to(tl.int64) * N + rn[None, :]
        x = load_f32(x_ptr + off, mask, 0.0, True)
        s = tl.load(sx_ptr)
        s = tl.where(s == 0.0, 1.0, s)
        v = tl.div_rn(x, s)
        inside = (v >= -127.0) & (v <= 127.0)
        tl.store(dx_ptr + off, bf16_rne_bits(tl.where(inside, y, 0.0)), mask=mask)
        vc = tl.minimum(tl.maximum(v, -127.0), 127.0)
        term = y * tl.where(inside, ((vc + RND_K) - RND_K) - v, vc)
        term = tl.where(mask, term, 0.0)     # (rows past M are outside the stored parts)
        seg = tree_sum_rows(term, BLOCK_M, BLOCK_N)
        tl.store(parts_ptr + rm.to(tl.int64) * (N // BLOCK_N) + pid_n, seg, mask=rm < M)


# The GEMM's tiles with half as many columns: the epilogue holds the int32 products, the
# float32 dX_hat, x, v and the term of a tile; at 128 x 128 over 8 warps Triton 3.6 spilled
# them (a 96-byte stack), at 128 x 64 they fit in 164 registers (compiled for sm_90).
GPU_TILES = {**GPU_BLOCKS, "BLOCK_N": 64}


def _tiles() -> dict:
    return dict(INTERPRET_BLOCKS if interpreting() else GPU_TILES)


def fits(m: int, k: int) -> bool:
    """Whether the fused kernel applies: row segments of a tile are aligned tree blocks."""
    return m > 0 and k > 0 and k % _tiles()["BLOCK_N"] == 0


def ste_gemm(qa: torch.Tensor, qb: torch.Tensor, sa: torch.Tensor, sb: torch.Tensor,
             x: torch.Tensor, s_x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(dx (M, K) bf16, the pairwise tree of term over its M * K elements, 0-d float32) for
    codes qa (M, Np), qb (K, Np) int8, steps sa (M,), sb (K,), x (M, K) bf16 and s_x (1,).
    Needs ``fits(M, K)``."""
    m, np_ = qa.shape
    k = qb.shape[0]
    if not fits(m, k) or x.dtype != torch.bfloat16:
        raise ValueError(f"the fused STE GEMM needs K a multiple of the tile width and a "
                         f"bf16 x, got M {m}, K {k}, x {x.dtype}")
    cfg = _tiles()
    dx = torch.empty((m, k), dtype=torch.bfloat16, device=qa.device)
    parts = torch.empty((m, k // cfg["BLOCK_N"]), dtype=torch.float32, device=qa.device)
    grid = (triton.cdiv(m, cfg["BLOCK_M"]) * triton.cdiv(k, cfg["BLOCK_N"]),)
    xk, _ = bf16_operand(x.contiguous())
    _ste_gemm_kernel[grid](qa.contiguous(), qb.contiguous(), sa.contiguous(),
                           sb.contiguous(), xk, s_x.reshape(1).to(torch.float32),
                           dx.view(torch.int16), parts, m, k, np_, **cfg, **LAUNCH_OPTIONS)
    return dx, tree_sum(parts.reshape(-1), 0)
