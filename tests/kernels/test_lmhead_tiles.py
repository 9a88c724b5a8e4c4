"""The LM head's Triton product skips a's slice tiles that are all zero (the slicer's tile
map): the map is exact, skipping changes no bit of any product (dlogits as training makes
them, a single nonzero at a tile's last row and column, several row groups a program, chunk
flushes), and the product does consult the map - a map that hides a nonzero tile is a
different result, which is what a kernel that skipped wrongly would give."""
from __future__ import annotations

import pytest
import torch

from open1b_kernels.core import backend
from open1b_kernels.ops import lmhead
from open1b_kernels.ops.lmhead import ozaki_mm_cpu
from testkit.kernels.tiles import tile_hits
from tests.kernels.support import needs_interpreter

pytest.importorskip("triton")
from open1b_kernels.ops import lmhead_triton as lm  # noqa: E402
from open1b_kernels.ops.lmhead_triton import ozaki_mm_triton, slice_rows_triton  # noqa: E402


def _dlogits(m: int, v: int, seed: int, spread: float) -> torch.Tensor:
    """(softmax(z) - onehot(target)) / m, the cross-entropy's dlogits: its top slices are
    zero wherever a row's probabilities lie far below its largest entry."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(m, v, generator=g) * spread
    p = torch.softmax(z, dim=1)
    p[torch.arange(m), torch.randint(0, v, (m,), generator=g)] -= 1.0
    return p / m


def _map_reference(s: torch.Tensor) -> torch.Tensor:
    """The tile map from the top slice itself: any nonzero per (SLICE_BR, TILE_K) tile."""
    return tile_hits(s[:1], lm.SLICE_BR, lm.TILE_K)[0].to(torch.uint8)


def _equal(x: torch.Tensor, y: torch.Tensor) -> bool:
    return torch.equal(x.view(torch.int32), y.view(torch.int32))


@needs_interpreter
@pytest.mark.parametrize("slices", [2, 3])
def test_tile_map_is_exact(slices):
    dl = _dlogits(45, 2000, 1, 0.9)
    dl[40:, :] = 0.0          # a whole row group's tail of zero rows
    s, _, nz = slice_rows_triton(dl, slices, tile_map=True)
    assert torch.equal(nz, _map_reference(s))
    assert 0 < int(nz.sum()) < nz.numel()   # slice 1 sparse, not empty: the case


@needs_interpreter
@pytest.mark.parametrize("slices", [2, 3])
@pytest.mark.parametrize("spread", [0.9, 4.0])    # near-uniform (an initial model) and peaked
def test_skipping_changes_no_bit(slices, spread):
    m, v, k = 40, 260, 48
    g = torch.Generator().manual_seed(7)
    dl = _dlogits(m, v, 3, spread)
    w = (torch.randn(v, k, generator=g) * 0.02).to(torch.bfloat16)
    h = torch.randn(m, k, generator=g).to(torch.bfloat16)
    for a, b in ((dl, w.t()), (dl.t(), h.t())):       # dh and dW of the backward
        ref = ozaki_mm_cpu(a, b, slices)
        for skip in (True, False):
            assert _equal(ozaki_mm_triton(a, b, slices, sparse_a=skip), ref), (a.shape, skip)


@needs_interpreter
@pytest.mark.parametrize("slices", [2, 3])
def test_a_lone_nonzero_at_a_tiles_far_corner(slices):
    # each slice in turn holds the one nonzero of a tile, at its last row and column;
    # the program's tile spans two row groups (BLOCK_M 64), the map's OR over them is needed
    m, k, n = 64, 128, 8
    g = torch.Generator().manual_seed(2)
    b = torch.randn(n, k, generator=g)
    for level in range(slices):
        a = torch.zeros(m, k)
        a[:, 0] = 1.0                                     # every row's maximum in tile (0, 0)
        a[63, 127] = 2.0 ** (-7 * level) * 1.5            # row group 1, K block 1, slice level
        ref = ozaki_mm_cpu(a, b, slices)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(lm, "INTERPRET_BLOCKS", {**lm.INTERPRET_BLOCKS, "BLOCK_M": 64})
            got = ozaki_mm_triton(a, b, slices, sparse_a=True)
        assert _equal(got, ref), level
        s, _, nz = slice_rows_triton(a, slices, tile_map=True)
        assert int(s[level, 63, 127]) != 0 and int(nz[1, 1]) == (level == 0)


@needs_interpreter
@pytest.mark.parametrize("k_chunk", [None, 1024])
def test_a_sparse_map_runs_the_listed_blocks(monkeypatch, k_chunk):
    # near-uniform probabilities over 4,096 columns leave slice 1 only at the targets, put
    # in two blocks far from the first ones: a list that named other blocks (or the first
    # ones in order) would multiply the wrong tiles; with K_CHUNK 1,024 each chunk's part
    # of the list is used by its own bounds
    m, v = 40, 4096
    g = torch.Generator().manual_seed(11)
    z = torch.randn(m, v, generator=g) * 0.5    # no probability within 2^-7 of a target
    dl = torch.softmax(z, dim=1)
    targets = torch.where(torch.arange(m) % 2 == 0, v - 1 - torch.arange(m) % 64,
                          1600 + torch.arange(m) % 64)
    dl[torch.arange(m), targets] -= 1.0
    dl /= m
    w = torch.randn(v, 32, generator=g) * 0.02
    _, _, nz = slice_rows_triton(dl, 3, tile_map=True)
    assert set(nz.nonzero()[:, 1].tolist()) == {1600 // lm.TILE_K, (v - 1) // lm.TILE_K}
    if k_chunk:
        monkeypatch.setattr(lm, "K_CHUNK", k_chunk)
    assert _equal(ozaki_mm_triton(dl, w.t(), 3, sparse_a=True), ozaki_mm_cpu(dl, w.t()))


@needs_interpreter
def test_skipping_across_chunk_flushes(monkeypatch):
    dl = _dlogits(16, 640, 5, 4.0)
    w = (torch.randn(640, 24, generator=torch.Generator().manual_seed(4)) * 0.02)
    ref = ozaki_mm_cpu(dl, w.t())
    monkeypatch.setattr(lm, "K_CHUNK", 128)   # five flushes of the int32 accumulators
    assert _equal(ozaki_mm_triton(dl, w.t(), 3, sparse_a=True), ref)


@needs_interpreter
def test_the_product_reads_the_map(monkeypatch):
    # a map that hides one nonzero tile of slice 1 changes the result: the kernel skips
    # by the map (a kernel that ignored it would be as exact and no faster)
    dl = _dlogits(32, 256, 9, 4.0)
    w = (torch.randn(256, 16, generator=torch.Generator().manual_seed(6)) * 0.02)
    ref = ozaki_mm_cpu(dl, w.t())
    real = lm.slice_rows_triton

    def hiding(x, slices=lmhead.SLICES, tile_map=False):
        s, e, nz = real(x, slices, tile_map)
        if nz is not None:
            hit = nz.nonzero()[0]
            nz[hit[0], hit[1]] = 0
        return s, e, nz

    monkeypatch.setattr(lm, "slice_rows_triton", hiding)
    with backend.force("triton"):
        assert not _equal(lmhead.ozaki_mm(dl, w.t(), sparse_a=True), ref)
        assert _equal(ozaki_mm_triton(dl, w.t(), 3, sparse_a=False), ref)
