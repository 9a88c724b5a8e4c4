"""Many float32 segments in one launch: the segment table and the segmented pairwise tree.

Why: a Triton launch costs the host ~10-20 us, so an op over a list of K tensors that
launches per tensor is bound by launches long before memory: grad-norm + clip over 30
gradients made ~125 launches and ran at 0.13x torch on the H200 (benchmarks/HISTORY.md). Here a
list of tensors (or of spans of one buffer) becomes one table, and each pass over all of
them is one launch.

The table (int64, one tensor so one host-to-device copy): for K segments, ``base[k]``
(the data address of segment k's first element, or its element offset in one buffer),
``n[k]`` (its length, >= 1) and ``first[k]`` (the index of its first block among all
segments' blocks of ``block`` elements: the prefix sums of ceil(n / block); ``first[K]``
is the number of blocks). Program ``pid`` of a launch over all blocks finds its segment by
a binary search over ``first`` (integer comparisons: exact) and takes block
``pid - first[k]`` of it; blocks never straddle two segments.

The segmented tree: each segment's pairwise tree (open1b_kernels/core/reduce.py: zero-padded to
its next power of two P) by aligned blocks of B (a power of two) per pass - pass p turns a
segment's m values into ceil(m / B) block trees, the last block zero-padded within B -
until one value per segment is left. That is reduce.py's blockable tree, with one care: a
block padded beyond P adds +0.0 above the segment's own root, which turns a root of -0.0
into +0.0; the root is -0.0 exactly when P == m and all m values are -0.0 (an add gives
-0.0 only from two -0.0), so such a block is answered -0.0 by an integer test. The result
is then the bits of ``tree_sum_cpu`` of every segment, whatever B and the pass count.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from open1b_kernels.core.backend import HAVE_TRITON, LAUNCH_OPTIONS

if HAVE_TRITON:
    import triton
    import triton.language as tl

    from open1b_kernels.core.reduce import tree_levels_1d

BLOCK = 4096         # values per block of a tree pass (power of two: the blockable tree)


def blocks_of(n: int, block: int) -> int:
    return -(-n // block)


_TABLES: dict[tuple, tuple[torch.Tensor, int]] = {}
_TABLES_MAX = 64   # a trainer calls with the same few lists every step


def table(bases: Sequence[int], lengths: Sequence[int], block: int,
          device: torch.device | str) -> tuple[torch.Tensor, int]:
    """(the int64 table [base(K), n(K), first(K + 1)] on ``device``, number of blocks).

    Kept per (device, bases, lengths, block): the same list of tensors again costs no
    copy. A new table reaches a GPU by an asynchronous copy from pinned memory: a plain
    ``.to("cuda")`` of a CPU tensor synchronizes the stream, which would stall the
    launches queued ahead of it."""
    if not bases or len(bases) != len(lengths) or min(lengths) < 1:
        raise ValueError("segments need one base and one length >= 1 per segment")
    key = (str(device), tuple(bases), tuple(lengths), block)
    hit = _TABLES.get(key)
    if hit is not None:
        return hit
    first = [0]
    for n in lengths:
        first.append(first[-1] + blocks_of(n, block))
    on_gpu = torch.device(device).type == "cuda"
    tab = torch.tensor([*bases, *lengths, *first], dtype=torch.int64, pin_memory=on_gpu)
    hit = (tab.to(device, non_blocking=True) if on_gpu else tab, first[-1])
    if len(_TABLES) >= _TABLES_MAX:
        _TABLES.pop(next(iter(_TABLES)))
    _TABLES[key] = hit
    return hit


def log_k(k: int) -> int:
    """Binary-search steps that find one of k segments (constexpr of the kernels)."""
    return max(1, k.bit_length())


if HAVE_TRITON:

    @triton.jit
    def find_segment(tab_ptr, pid, K, LOG_K: tl.constexpr):
        """(k, block index within segment k) of block ``pid``: the largest k with
        first[k] <= pid (the table's first[] follows base[K] and n[K])."""
        first_ptr = tab_ptr + 2 * K
        lo = pid * 0
        hi = lo + K
        for _ in tl.static_range(LOG_K):
            mid = (lo + hi) // 2
            go = tl.load(first_ptr + mid) <= pid
            lo = tl.where(go, mid, lo)
            hi = tl.where(go, hi, mid)
        return lo, pid - tl.load(first_ptr + lo)

    @triton.jit
    def segment_block(tab_ptr, src_ptr, pid, K, LOG_K: tl.constexpr, INDIRECT: tl.constexpr,
                      B: tl.constexpr):
        """Block ``pid``'s B values (zero past the segment's end), their mask, the segment's
        length and the block's index in it. INDIRECT: base[k] is a float32 address; else an offset into
        ``src_ptr``."""
        k, j = find_segment(tab_ptr, pid, K, LOG_K)
        base = tl.load(tab_ptr + k)
        n = tl.load(tab_ptr + K + k)
        offs = j * B + tl.arange(0, B)
        mask = offs < n
        if INDIRECT:
            ptr = base.to(tl.pointer_type(tl.float32))
        else:
            ptr = src_ptr + base
        return tl.load(ptr + offs, mask=mask, other=0.0), mask, n, j

    @triton.jit
    def _block_tree_kernel(tab_ptr, src_ptr, dst_ptr, K, LOG_K: tl.constexpr,
                           INDIRECT: tl.constexpr, SQUARE: tl.constexpr, B: tl.constexpr):
        # One block's tree (of its squares with SQUARE), -0.0 kept (module docstring).
        pid = tl.program_id(0)
        x, mask, n, j = segment_block(tab_ptr, src_ptr, pid, K, LOG_K, INDIRECT, B)
        if SQUARE:   # squares are never -0.0: no root to restore
            tl.store(dst_ptr + pid, tree_levels_1d(x * x, B))
        else:
            s = tree_levels_1d(x, B)
            # the root is -0.0 when every value is -0.0 and nothing padded: a full block,
            # or a whole segment of a power-of-two length (one integer max: -0.0 is the
            # smallest int32 pattern; this also restores what the interpreter's pair sums
            # turn into +0.0, reduce.py)
            every = tl.max(tl.where(mask, x.to(tl.int32, bitcast=True), -2147483648),
                           axis=0) == -2147483648
            whole = ((j + 1) * B <= n) | ((n & (n - 1)) == 0)
            tl.store(dst_ptr + pid, tl.where(every & whole, -0.0, s))


def segment_trees(tensors: Sequence[torch.Tensor], square: bool = False,
                  block: int = BLOCK) -> torch.Tensor:
    """(K,) float32: the pairwise tree of each flattened contiguous float32 tensor (of its
    squares with ``square``), in a few launches whatever K is (Triton path)."""
    device = tensors[0].device
    lengths = [t.numel() for t in tensors]
    tab, n_blocks = table([t.data_ptr() for t in tensors], lengths, block, device)
    parts = torch.empty(n_blocks, dtype=torch.float32, device=device)
    k = len(tensors)
    _block_tree_kernel[(n_blocks,)](tab, parts, parts, k, LOG_K=log_k(k), INDIRECT=True,
                                    SQUARE=square, B=block, **LAUNCH_OPTIONS)
    lengths = [blocks_of(n, block) for n in lengths]
    while max(lengths) > 1:   # the tree over each segment's block partials, pass by pass
        starts = [0]
        for n in lengths[:-1]:
            starts.append(starts[-1] + n)
        tab, n_blocks = table(starts, lengths, block, device)
        nxt = torch.empty(n_blocks, dtype=torch.float32, device=device)
        _block_tree_kernel[(n_blocks,)](tab, parts, nxt, k, LOG_K=log_k(k), INDIRECT=False,
                                        SQUARE=False, B=block, **LAUNCH_OPTIONS)
        parts, lengths = nxt, [blocks_of(n, block) for n in lengths]
    return parts
