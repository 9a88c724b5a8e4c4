"""Block-diagonal fast Walsh-Hadamard transform along the last (contraction) dimension.

    y[r, j*B:(j+1)*B] = x[r, j*B:(j+1)*B] @ H_B / sqrt(B)

H_B is the Sylvester Hadamard matrix of order B (natural order, symmetric, H_B H_B = B I),
so H_B / sqrt(B) is orthonormal and its own inverse, and rotating *both* operands of a
GEMM along its contraction dimension leaves the product unchanged in exact arithmetic:
``(A Q)(B Q)^T = A B^T``. The int8 backward of ``open1b_kernels.int8.linear`` relies on this: the
rotation spreads outliers over a block before per-row int8 quantization.

Block size B (default ``BLOCK = 256``) must be a power of four, so that ``1 / sqrt(B)`` is
a power of two and the normalization is an exact multiply. K not divisible by B is
zero-padded up to the next multiple (padded columns are zero in both operands, so the
product is unchanged); the output has the padded width.

Arithmetic (identical on both paths): the input is widened to float32 (exact for bf16 and
integers below 2^24), then log2(B) butterfly stages h = 1, 2, 4, ..., B/2, each mapping
the pair (x[i], x[i+h]) of every aligned 2h-group to (x[i] + x[i+h], x[i] - x[i+h]) with one
IEEE binary32 add/sub, round-to-nearest-even; finally one multiply by 2^(-log2(B)/2), exact
unless the result is subnormal (then IEEE rounding; subnormals are kept, never flushed).
The transform is exact whenever every butterfly sum is representable, e.g. for integer
inputs with |x| * B < 2^24 (int8 values: always), which the dW GEMM of the linear uses.
NaN/inf propagate as IEEE adds do (NaN payload bits are not part of the contract);
overflow to inf only if |x| * B exceeds float32's range.
"""
from __future__ import annotations

import torch

from open1b_kernels.core.mathc import Loops
from open1b_kernels.core.pieces import parallel
from open1b_kernels.core.backend import HAVE_TRITON, LAUNCH_OPTIONS, interpreting, use_triton
from open1b_kernels.int8.gemm import bf16_operand
from open1b_kernels.core.registry import Cost, GpuCheck, scaled, seeded_generator
from open1b_kernels.core.workspace import scratch

if HAVE_TRITON:
    import triton
    import triton.language as tl

    from open1b_kernels.int8.gemm import load_f32

BLOCK = 256  # default rotation block: a power of four (exact 1/16 normalization)
ROWS_GPU = 16  # rows per program on the GPU
ROWS_INTERPRET = 64  # fewer, larger programs under the interpreter
DIM0_TILE = 1 << 19  # float32 elements per CPU tile of hadamard_dim0_cpu_ (2 MB: one L2)
LOOPS = Loops("open1b_kernels.int8._int8c")    # the butterflies compiled: _hadamard.c


def _log2_pow4(block: int) -> int:
    log = block.bit_length() - 1
    if block < 4 or block != 1 << log or log % 2:
        raise ValueError(f"Hadamard block must be a power of four >= 4 (e.g. 64, 256, 1024), "
                         f"got {block}")
    return log


def inv_sqrt(block: int) -> float:
    """1 / sqrt(block), exact: a power of two, since block is a power of four (checked) -
    the rotation's normalization on every path."""
    return 2.0 ** -(_log2_pow4(block) // 2)


def padded_width(k: int, block: int = BLOCK) -> int:
    """Width of the rotated output: k rounded up to a multiple of ``block``."""
    return -(-k // block) * block


def hadamard_cpu(x: torch.Tensor, block: int = BLOCK) -> torch.Tensor:
    """CPU reference: (R, K) float tensor -> (R, padded_width(K)) float32, see module doc."""
    scale = inv_sqrt(block)     # checks block first
    if x.dim() != 2:
        raise ValueError(f"hadamard works on 2-D (rows, K) tensors, got shape {tuple(x.shape)}")
    r, k = x.shape
    kp = padded_width(k, block)
    y = torch.zeros((r, kp), dtype=torch.float32)
    y[:, :k] = x.to(torch.float32)
    out = torch.empty_like(y)
    h = 1
    while h < block:
        # aligned 2h-groups never straddle rows (kp is a multiple of block): flatten them
        v, o = y.view(-1, 2, h), out.view(-1, 2, h)  # (groups, pair half, h)
        torch.add(v[:, 0], v[:, 1], out=o[:, 0])
        torch.sub(v[:, 0], v[:, 1], out=o[:, 1])
        y, out = out, y
        h *= 2
    return y.mul_(scale)


def hadamard_dim0_cpu_(y: torch.Tensor, block: int = BLOCK, fill=None, on_tile=None
                       ) -> torch.Tensor:
    """Rotate the *columns* of a contiguous float32 (R, C) tensor in place (R a multiple of
    ``block``); returns ``y``.

    Bit for bit ``hadamard_cpu(y.t()).t()``: every output element is the same sequence of
    IEEE adds/subs of the same operands, then the same exact scale. Why a second layout:
    the linear's backward rotates along a GEMM's contraction dimension, which for w_hat,
    G^T and q_x is dim 0; rotating there needs no transposed copy, the pair (row i,
    row i + h) of every aligned 2h-row group is two whole rows (so each op runs over
    contiguous h*C runs, where the last-dim layout at h = 1 is a stride-2 gather), and the
    int8 codes come out in the (K, N) layout ``torch._int_mm`` reads without a copy.

    Rotation groups never straddle an aligned block of rows, so the work runs in
    cache-sized tiles (whole row blocks, column slices): all log2(block) stages of a tile
    happen while it sits in L2 (1.8x faster than stage-by-stage sweeps of a 92 MB weight
    gradient on the 2-core VM). Callers may hook into that: ``fill(tile, rows, cols)``
    writes the input of ``y[rows, cols]`` into ``tile`` first (else y holds it), and
    ``on_tile(tile, rows, cols)`` sees each finished tile while it is still in cache.
    """
    scale = inv_sqrt(block)     # checks block first
    r, c = y.shape
    if r % block or not y.is_contiguous() or y.dtype != torch.float32:
        raise ValueError(f"need a contiguous float32 (R, C) tensor with R a multiple of "
                         f"{block}, got {tuple(y.shape)} {y.dtype}")
    if not y.numel():
        return y
    rows = block * max(1, DIM0_TILE // (block * c))
    cols = min(c, max(1, DIM0_TILE // block))
    tmp = scratch("hadamard.dim0", (min(rows, r) * cols,), torch.float32)
    for r0 in range(0, r, rows):
        for c0 in range(0, c, cols):
            rs, cs = slice(r0, min(r, r0 + rows)), slice(c0, min(c, c0 + cols))
            src = tile = y[rs, cs]
            if fill is not None:
                fill(tile, rs, cs)
            if _stages_compiled(y, block, rs, cs):  # the compiled stages: the same bits
                tile.mul_(scale)
                if on_tile is not None:
                    on_tile(tile, rs, cs)
                continue
            tr, tc = src.shape
            dst = tmp[:tr * tc].view(tr, tc)
            h = 1
            while h < block:
                v, o = src.view(-1, 2, h, tc), dst.view(-1, 2, h, tc)  # (groups, pair, h, cols)
                torch.add(v[:, 0], v[:, 1], out=o[:, 0])
                torch.sub(v[:, 0], v[:, 1], out=o[:, 1])
                src, dst = dst, src
                h *= 2
            # log2(block) is even (block is a power of four): the last stage wrote the tile
            tile.mul_(scale)
            if on_tile is not None:
                on_tile(tile, rs, cs)
    return y


def _stages_compiled(y: torch.Tensor, block: int, rows: slice, cols: slice) -> bool:
    """The butterfly stages of ``hadamard_dim0_cpu_`` on the tile ``y[rows, cols]`` of a
    contiguous float32 (R, C) tensor, in place, by the compiled loop (the same IEEE adds and
    subtracts: the same bits); False when the loop is unavailable. Columns are independent,
    so the tile is split by columns among the torch threads."""
    if not LOOPS.available():
        return False
    r, c = y.shape
    buf = y.reshape(-1).numpy()
    c0, c1 = cols.start, cols.stop
    parallel(lambda lo, hi, p: LOOPS.fwht_dim0(buf, r, c, rows.start, rows.stop, block,
                                               c0 + lo, c0 + hi, p), c1 - c0)
    return True


if HAVE_TRITON:

    @triton.jit
    def fwht_tile(x, ROWS: tl.constexpr, B: tl.constexpr, LOG_B: tl.constexpr):
        """Unnormalized FWHT of every row of a (ROWS, B) float32 tile, stages h = 1..B/2."""
        for s in tl.static_range(LOG_B):
            # Written out rather than bound to a name: a constexpr cannot be rebound inside
            # a static_range loop when compiled (the interpreter does not notice).
            g = tl.reshape(x, (ROWS, B // (2 * (1 << s)), 2, 1 << s))
            g = tl.permute(g, (0, 1, 3, 2))  # (ROWS, groups, h, 2): the pair on the last axis
            a, b = tl.split(g)
            g = tl.join(a + b, a - b)  # (ROWS, groups, h, 2)
            x = tl.reshape(tl.permute(g, (0, 1, 3, 2)), (ROWS, B))
        return x

    @triton.jit
    def rotated_block(x_ptr, rows, j, R, K, stride_r, stride_k, scale,
                      IS_BF16: tl.constexpr, ROWS: tl.constexpr, B: tl.constexpr,
                      LOG_B: tl.constexpr):
        """Block j (columns j*B ..) of ``rows``, loaded (zero past K) and rotated: the one
        load-and-rotate used by this kernel and by the fused rotate+quantize kernels."""
        cols = j * B + tl.arange(0, B)
        mask = (rows[:, None] < R) & (cols[None, :] < K)
        ptrs = x_ptr + rows[:, None].to(tl.int64) * stride_r + cols[None, :] * stride_k
        return fwht_tile(load_f32(ptrs, mask, 0.0, IS_BF16), ROWS, B, LOG_B) * scale

    @triton.jit
    def _hadamard_kernel(x_ptr, y_ptr, R, K, KP, stride_r, stride_k, scale,
                         IS_BF16: tl.constexpr, ROWS: tl.constexpr, B: tl.constexpr,
                         LOG_B: tl.constexpr):
        # Program (pid_r, pid_b) rotates block pid_b of ROWS rows.
        pid_b = tl.program_id(1)
        rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
        cols = pid_b * B + tl.arange(0, B)
        y = rotated_block(x_ptr, rows, pid_b, R, K, stride_r, stride_k, scale,
                          IS_BF16, ROWS, B, LOG_B)
        tl.store(y_ptr + rows[:, None].to(tl.int64) * KP + cols[None, :], y,
                 mask=(rows[:, None] < R) & (cols[None, :] < KP))


def hadamard_triton(x: torch.Tensor, block: int = BLOCK) -> torch.Tensor:
    """Triton path of ``hadamard`` (any input strides; contiguous float32 output)."""
    log = _log2_pow4(block)
    if x.dim() != 2:
        raise ValueError(f"hadamard works on 2-D (rows, K) tensors, got shape {tuple(x.shape)}")
    r, k = x.shape
    kp = padded_width(k, block)
    y = torch.empty((r, kp), dtype=torch.float32, device=x.device)
    if r == 0 or kp == 0:
        return y
    rows = ROWS_INTERPRET if interpreting() else ROWS_GPU
    grid = (triton.cdiv(r, rows), kp // block)
    xk, is_bf16 = bf16_operand(x)
    _hadamard_kernel[grid](xk, y, r, k, kp, x.stride(0), x.stride(1), inv_sqrt(block),
                           IS_BF16=is_bf16, ROWS=rows, B=block, LOG_B=log, **LAUNCH_OPTIONS)
    return y


def hadamard(x: torch.Tensor, block: int = BLOCK) -> torch.Tensor:
    """Rotate the rows of a 2-D tensor (any float dtype, any strides) blockwise; float32 out.

    To rotate along another dimension pass a transposed view, e.g. ``hadamard(w.t())``.
    """
    if use_triton(x):
        return hadamard_triton(x, block)
    return hadamard_cpu(x, block)


# ---------------------------------------------------------------- GPU check registry
def _make(shape: tuple[int, int]):
    def make(scale: float, device):
        g = seeded_generator(303)
        rows = scaled(shape[0], scale, 16)
        return (torch.randn(rows, shape[1], generator=g).to(torch.bfloat16).to(device),)
    return make


def _baseline(args):
    # Stock PyTorch's way: a dense matmul by the (block-diagonal) normalized Hadamard matrix.
    x = args[0]
    h = torch.ones(1, 1, device=x.device)
    while h.shape[0] < BLOCK:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    h = (h / BLOCK ** 0.5).to(x.dtype)
    return ((x.reshape(x.shape[0], -1, BLOCK) @ h).reshape(x.shape),)


GPU_CHECKS = [
    GpuCheck(
        name=f"hadamard.{label}",
        make_inputs=_make(shape),
        run=lambda a: (hadamard(a[0]),),
        torch_baseline=_baseline,
        cost=lambda a: Cost(flops=a[0].numel() * 8.0, bytes=a[0].numel() * 6.0),
        describe=lambda s, sh=shape: f"bf16 ({scaled(sh[0], s, 16)}, {sh[1]}) -> fp32, B={BLOCK}",
        parity_scale=0.25,
    )
    for label, shape in (("tokens_x_11264", (16_384, 11_264)), ("tokens_x_2048", (16_384, 2_048)))
]
