"""The AMX tile GEMM (open1b_kernels/int8/_amxmm.c) and the "amx" route: the exact int32
product on every shape, layout and extreme, and the route's guard - the same probe and
checksums as the library's route, each forgery caught and recomputed (the same bits as the
float route through the linear: tests/kernels/test_int_gemm_guard.py, every route)."""
from __future__ import annotations

import warnings

import pytest
import torch

from open1b_kernels.core.backend import force
from open1b_kernels.int8 import amxmm, gemm
from open1b_kernels.int8 import route as gemm_route
from open1b_kernels.int8.linear import linear_int8_backward, linear_int8_forward
from tests.kernels.test_int_gemm_guard import saturating_int_mm

needs_amx = pytest.mark.skipif(not amxmm.available(),
                               reason="the tile GEMM needs AMX-INT8 granted by the OS (and the build)")


def _exact(a, b):
    return torch.mm(a.to(torch.int64), b.to(torch.int64).t())


def _layouts(x):
    """x row-major and as a transposed view of a row-major copy (same values)."""
    return x, x.t().contiguous().t()


@needs_amx
@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (7, 3, 17), (16, 64, 16), (33, 128, 17),
                                   (13, 1001, 33), (100, 2049, 70), (64, 2048, 96),
                                   (70, 4096, 90), (12, 4097, 48)])
def test_exact_on_awkward_shapes_and_both_layouts(m, k, n):
    # rows and columns not a multiple of 16 or 32 (the tile blocks' edges), K not one of 64
    # (padded chunks), K a multiple of 64 (row-major A read in place, its last rows packed)
    g = torch.Generator().manual_seed(m * 7 + k + n)
    a = torch.randint(-128, 128, (m, k), generator=g, dtype=torch.int8)
    b = torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int8)
    want = _exact(a, b)
    for aa in _layouts(a):
        for bb in _layouts(b):
            got = amxmm.amx_mm(aa, bb)
            assert got.dtype == torch.int32 and torch.equal(got.to(torch.int64), want)


@needs_amx
@pytest.mark.parametrize("va,vb", [(-128, -128), (127, -128), (-128, 127), (127, 127)])
def test_extremes_at_the_longest_contraction(va, vb):
    # -128 * -128 = 2^14 summed MAX_K times: 2^31 - 2^14, the largest int32 sum it must hold
    k = amxmm.MAX_K
    a = torch.full((33, k), va, dtype=torch.int8)
    b = torch.full((17, k), vb, dtype=torch.int8)
    assert torch.equal(amxmm.amx_mm(a, b).to(torch.int64), _exact(a, b))


@needs_amx
@pytest.mark.parametrize("m,k,n", [(64, 8192, 64), (70, 9000, 90), (40, 4160, 300)])
def test_a_long_contraction_in_passes_is_exact(m, k, n):
    # many passes of PASS (16) chunks, the last one short (K = 9,000: 141 chunks), the int32
    # partial sums stored and loaded back between them; A read in place (K a multiple of
    # 64) and packed (a transposed view); units of rows and of columns
    g = torch.Generator().manual_seed(m + k + n)
    a = torch.randint(-128, 128, (m, k), generator=g, dtype=torch.int8)
    b = torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int8)
    want = _exact(a, b)
    for aa in _layouts(a):
        assert torch.equal(amxmm.amx_mm(aa, b).to(torch.int64), want)


@needs_amx
def test_a_long_contraction_into_a_large_result_in_one_pass_is_exact():
    # several cache blocks of C (CROWS x CCOLS: 256 x 512) each way, the last ones cut (1,100
    # rows, 2,000 columns), in passes (K = 4,160: 65 chunks)
    g = torch.Generator().manual_seed(8)
    a = torch.randint(-128, 128, (1100, 4160), generator=g, dtype=torch.int8)
    b = torch.randint(-128, 128, (2000, 4160), generator=g, dtype=torch.int8)
    want = torch.mm(a.double(), b.double().t())       # exact: every sum below 2^53
    for aa in _layouts(a):
        assert torch.equal(amxmm.amx_mm(aa, b).double(), want)


@needs_amx
def test_the_extremes_in_passes_of_whole_blocks():
    # 2^31 - 2^14 reached by partial sums carried between the passes of 32 x 32 blocks
    k = amxmm.MAX_K
    a = torch.full((64, k), -128, dtype=torch.int8)
    b = torch.full((32, k), -128, dtype=torch.int8)
    got = amxmm.amx_mm(a, b)
    assert torch.equal(got.to(torch.int64), _exact(a, b)) and int(got[0, 0]) == 2**31 - 2**14


@needs_amx
@pytest.mark.parametrize("m,k,n", [(257, 1088, 513), (300, 1024 + 64, 530), (31, 2112, 1100),
                                   (512, 960, 1024), (40, 1025, 33)])
def test_passes_and_cache_blocks_at_their_edges(m, k, n):
    # a pass of exactly PASS chunks and one more (1,088 = 17 chunks), fewer than one pass
    # (960), a pass's last chunk padded (1,025); C's cache blocks (256 x 512) ending one row
    # or column past a block (257, 513), inside a 32-line block (530, 1,100), on a block's
    # end (512 x 1,024); one block of C's columns cut by units of columns (31 rows). A row-major
    # A is copied into the pass's buffer by its first block: both layouts give the product
    g = torch.Generator().manual_seed(m + 3 * k + n)
    a = torch.randint(-128, 128, (m, k), generator=g, dtype=torch.int8)
    b = torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int8)
    want = _exact(a, b)
    for aa in _layouts(a):
        for bb in _layouts(b):
            out = torch.full((m, n), 7, dtype=torch.int32)
            assert torch.equal(amxmm.amx_mm(aa, bb, out).to(torch.int64), want)


@needs_amx
def test_a_refused_scratch_is_a_memory_error_with_nothing_written():
    # every piece's scratch (544 KiB) is taken before any piece runs: 4,096 pieces under an
    # address-space limit of 1 GiB more than the process has get MemoryError, C untouched
    code = """
import resource, torch
from open1b_kernels.int8 import amxmm
a = amxmm.pack(torch.ones((64, 128), dtype=torch.int8), False, "t.a")
b = amxmm.pack(torch.ones((64, 128), dtype=torch.int8), True, "t.b")
c = torch.full((64, 64), 7, dtype=torch.int32)
m, n, by_cols, units, sides, win = amxmm._cut(a, b, "product")
size = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize()
resource.setrlimit(resource.RLIMIT_AS, (size + (1 << 30), resource.RLIM_INFINITY))
try:
    amxmm.LOOPS.amx_product(*sides, c.numpy().reshape(-1), m, n, 128, *win, by_cols, 0, 2, 4096)
except MemoryError:
    print("refused", bool((c == 7).all()))
amxmm.LOOPS.amx_product(*sides, c.numpy().reshape(-1), m, n, 128, *win, by_cols, 0, 2, 2)
print("ran", bool((c == 128).all()))
"""
    import pathlib
    import subprocess
    import sys
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, cwd=pathlib.Path(__file__).resolve().parents[2])
    assert got.returncode == 0, got.stderr
    assert got.stdout.split() == ["refused", "True", "ran", "True"]


@needs_amx
def test_panels_packed_in_groups_across_many_lines():
    # lines adjacent in memory (a transposed A, a B side read across its lines) are packed
    # 64 panels at a time per chunk: 1,100 lines cross a group's end and end inside a panel
    g = torch.Generator().manual_seed(5)
    a = torch.randint(-128, 128, (1100, 200), generator=g, dtype=torch.int8)
    b = torch.randint(-128, 128, (1050, 200), generator=g, dtype=torch.int8)
    want = _exact(a, b)
    for aa in _layouts(a):
        for bb in _layouts(b):
            assert torch.equal(amxmm.amx_mm(aa, bb).to(torch.int64), want)


@needs_amx
def test_windows_of_one_packing_give_each_ranges_product():
    # the LM head's level runs: [a1], [a1|a2], [a1|a2|a3] and [a2|a3] as windows of one
    # packing of the three side by side, on either side of the product
    g = torch.Generator().manual_seed(6)
    k = 192
    a = torch.randint(-128, 128, (70, 3 * k), generator=g, dtype=torch.int8)
    b = torch.randint(-128, 128, (90, 3 * k), generator=g, dtype=torch.int8)
    pa = amxmm.pack(a.t().contiguous().t(), False, "t.win_a")
    pb = amxmm.pack(b, True, "t.win_b")
    assert pa.direct is None
    for k0, k1 in [(0, k), (0, 2 * k), (0, 3 * k), (k, 3 * k), (64, 3 * k - 64)]:
        wa, wb = amxmm.window(pa, k0, k1 - k0), amxmm.window(pb, k0, k1 - k0)
        want = _exact(a[:, k0:k1], b[:, k0:k1])
        assert torch.equal(amxmm.amx_mm(wa, b[:, k0:k1]).to(torch.int64), want)
        assert torch.equal(amxmm.amx_mm(a[:, k0:k1], wb).to(torch.int64), want)
        assert torch.equal(amxmm.amx_mm(wa, wb).to(torch.int64), want)
        # a window of a window
        inner = amxmm.window(wa, 64, k1 - k0 - 64)
        assert torch.equal(amxmm.amx_mm(inner, b[:, k0 + 64:k1]).to(torch.int64),
                           _exact(a[:, k0 + 64:k1], b[:, k0 + 64:k1]))
    # a window's last chunk must be its own (or the packing's last): the product reads the
    # padding past K, which would be the next values
    assert amxmm.window(pa, 0, 100) is None and amxmm.window(pa, 32, 64) is None
    assert amxmm.window(pa, 0, 3 * k + 1) is None
    tail = amxmm.pack(a[:, :3 * k - 5].t().contiguous().t(), False, "t.win_tail")
    last = amxmm.window(tail, 2 * k, k - 5)                        # ends at the packing's end
    assert torch.equal(amxmm.amx_mm(last, b[:, 2 * k:3 * k - 5]).to(torch.int64),
                       _exact(a[:, 2 * k:3 * k - 5], b[:, 2 * k:3 * k - 5]))
    assert amxmm.window(amxmm.pack(a, False, "t.win_direct"), 0, k) is None     # read in place
    with pytest.raises(ValueError, match="one K"):
        amxmm.amx_mm(amxmm.window(pa, 0, k), pb)


@needs_amx
def test_the_product_refuses_a_window_past_its_packing_or_inside_a_chunk():
    # the C side checks the windows itself: never reads past a packing or into the next
    # values as padding
    g = torch.Generator().manual_seed(7)
    a = amxmm.pack(torch.randint(-128, 128, (40, 256), generator=g, dtype=torch.int8).t()
                   .contiguous().t(), False, "t.bad_a")
    b = amxmm.pack(torch.randint(-128, 128, (40, 256), generator=g, dtype=torch.int8), True,
                   "t.bad_b")
    c = torch.empty(40 * 40, dtype=torch.int32).numpy()
    e = torch.empty(0, dtype=torch.int8).numpy()
    args = (e, 0, a.data.numpy(), b.data.numpy(), c, 40, 40)
    amxmm.LOOPS.amx_product(*args, 128, 256, 2, 256, 2, False, 0, 2)        # a fair window
    for k, ka, a0 in [(128, 256, 3), (100, 256, 0), (128, 64, 0), (128, 256, -1)]:
        with pytest.raises(ValueError, match="consistent shapes"):
            amxmm.LOOPS.amx_product(*args, k, ka, a0, 256, 0, False, 0, 2)


@needs_amx
def test_blocks_of_larger_matrices_and_a_strided_copy():
    g = torch.Generator().manual_seed(9)
    big = torch.randint(-128, 128, (300, 640), generator=g, dtype=torch.int8)
    b = torch.randint(-128, 128, (21, 128), generator=g, dtype=torch.int8)
    # a row-major block with a longer row (read in place: stride 640), a transposed block,
    # and a view with no unit stride (copied)
    for a in (big[5:88, 100:228], big.t()[40:168, 7:100].t(), big[::2, ::3][:50, :128]):
        assert torch.equal(amxmm.amx_mm(a, b).to(torch.int64), _exact(a, b))
        assert torch.equal(amxmm.amx_mm(b, a).to(torch.int64), _exact(b, a))


@needs_amx
@pytest.mark.parametrize("m,n", [(250, 70), (40, 300)])
def test_the_thread_cut_does_not_change_the_bits(monkeypatch, m, n):
    # many rows: units of rows; few rows and many columns: units of columns
    g = torch.Generator().manual_seed(1)
    a = torch.randint(-128, 128, (m, 3000), generator=g, dtype=torch.int8)
    b = torch.randint(-128, 128, (n, 3000), generator=g, dtype=torch.int8)
    one = amxmm.amx_mm(a, b).clone()
    monkeypatch.setattr(amxmm, "parallel", lambda fn, n, grain=1: [fn(i, i + 1, 1)
                                                                 for i in range(n)])
    assert torch.equal(amxmm.amx_mm(a, b), one)
    assert torch.equal(one.to(torch.int64), _exact(a, b))


@needs_amx
def test_out_and_bad_arguments():
    a = torch.randint(-128, 128, (9, 5), dtype=torch.int8)
    b = torch.randint(-128, 128, (4, 5), dtype=torch.int8)
    out = torch.full((9, 4), 7, dtype=torch.int32)
    assert amxmm.amx_mm(a, b, out) is out and torch.equal(out.to(torch.int64), _exact(a, b))
    with pytest.raises(ValueError, match="contiguous int32"):
        amxmm.amx_mm(a, b, torch.empty((4, 9), dtype=torch.int32))
    with pytest.raises(ValueError, match="int8"):
        amxmm.amx_mm(a.to(torch.int16), b)
    with pytest.raises(ValueError, match="K = 0"):
        amxmm.amx_mm(a[:, :0], b[:, :0])
    e = torch.empty(0, dtype=torch.int8).numpy()
    with pytest.raises(ValueError, match="buffer"):       # the C side checks sizes too
        amxmm.LOOPS.amx_product(e, 0, torch.zeros(4, dtype=torch.int8).numpy(),
                                torch.zeros(4, dtype=torch.int8).numpy(),
                                torch.zeros(36, dtype=torch.int32).numpy(), 9, 4, 5, 5, 0, 5, 0,
                                False, 0, 1)


def _dequant_ref(a, b, rs, cs, dtype):
    acc = _exact(a, b)
    return gemm.dequantize_cpu(acc.to(torch.int32), rs, cs, dtype), acc


def _bits(t):
    return t.view(torch.int16 if t.dtype == torch.bfloat16 else torch.int32)


@needs_amx
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m,k,n,per_row", [(1, 5, 1, True), (33, 128, 17, True),
                                           (70, 320, 90, False), (100, 2049, 70, True),
                                           (40, 300, 3000, True), (2048, 64, 1056, True),
                                           (300, 8200, 70, True)])
def test_the_product_dequantized_in_its_tiles_gives_the_second_pass_bits(m, k, n, per_row,
                                                                       dtype):
    # edges (rows and columns not a multiple of 32), per-tensor and per-row steps, units
    # of columns (few rows), and outputs past STREAM_MIN_BYTES (2,048 x 1,056: 8.3 MB of
    # float32 stored by streaming stores; in bf16 under it), a long contraction in passes
    # (300 x 8,200) and cache blocks cut at C's edges (2,048 x 1,056), with extremes: the largest
    # product, a zero step, a subnormal one, a NaN one, one that overflows to inf
    g = torch.Generator().manual_seed(m + k + n)
    a = torch.randint(-128, 128, (m, k), generator=g, dtype=torch.int8)
    b = torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int8)
    a[0], b[0] = -128, -128
    rs = torch.rand(m if per_row else 1, generator=g) * 1e-3
    cs = torch.rand(n, generator=g) * 1e-2
    cs[0] = 3e38
    if n > 3:
        cs[1], cs[2], cs[3] = 0.0, 1e-40, float("nan")
    want, acc = _dequant_ref(a, b, rs, cs, dtype)
    for aa in _layouts(a):
        out = torch.full((m, n), 7, dtype=dtype)
        rows, cols = amxmm.product_dequant(amxmm.pack(aa, False, "t.a"),
                                           amxmm.pack(b, True, "t.b"), rs, cs, out)
        assert torch.equal(_bits(out), _bits(want))
        assert torch.equal(rows, acc.sum(1)) and torch.equal(cols, acc.sum(0))


@needs_amx
def test_the_dequantized_products_thread_cut_does_not_change_the_bits(monkeypatch):
    # each piece adds its own row and column sums: one piece per unit gives the same
    import open1b_kernels.core.pieces as pieces
    g = torch.Generator().manual_seed(2)
    a = torch.randint(-128, 128, (250, 700), generator=g, dtype=torch.int8)
    b = torch.randint(-128, 128, (90, 700), generator=g, dtype=torch.int8)
    rs, cs = torch.rand(250, generator=g), torch.rand(90, generator=g)
    want, acc = _dequant_ref(a, b, rs, cs, torch.float32)
    for split in (False, True):
        if split:
            monkeypatch.setattr(pieces, "team", lambda: False)
            monkeypatch.setattr(torch, "get_num_threads", lambda: 3)
        out = torch.empty((250, 90))
        rows, cols = amxmm.product_dequant(amxmm.pack(a, False, "t.a"),
                                           amxmm.pack(b, True, "t.b"), rs, cs, out)
        assert torch.equal(_bits(out), _bits(want))
        assert torch.equal(rows, acc.sum(1)) and torch.equal(cols, acc.sum(0))


@needs_amx
def test_a_product_past_the_caches_streamed_to_memory_is_exact():
    # 1,024 x 2,048 int32 = 8 MB: C's whole blocks by streaming stores, its edge rows not
    g = torch.Generator().manual_seed(4)
    a = torch.randint(-128, 128, (1030, 64), generator=g, dtype=torch.int8)
    b = torch.randint(-128, 128, (2048, 64), generator=g, dtype=torch.int8)
    assert torch.equal(amxmm.amx_mm(a, b).to(torch.int64), _exact(a, b))
    was = amxmm.stream_min_bytes(1 << 62)            # the switch the benchmarks compare with
    try:
        assert amxmm.stream_min_bytes() == 1 << 62
        assert torch.equal(amxmm.amx_mm(a, b).to(torch.int64), _exact(a, b))
    finally:
        amxmm.stream_min_bytes(was)
    assert amxmm.stream_min_bytes() == was == 8 << 20


@needs_amx
def test_the_dequantized_product_refuses_bad_arguments():
    a = amxmm.pack(torch.ones((9, 5), dtype=torch.int8), False, "t.a")
    b = amxmm.pack(torch.ones((4, 5), dtype=torch.int8), True, "t.b")
    rs, cs = torch.ones(9), torch.ones(4)
    with pytest.raises(ValueError, match="contiguous float32 or bfloat16"):
        amxmm.product_dequant(a, b, rs, cs, torch.empty((9, 4), dtype=torch.int32))
    with pytest.raises(ValueError, match="scales of 9 rows"):
        amxmm.product_dequant(a, b, rs[:3], cs, torch.empty((9, 4)))
    with pytest.raises(ValueError, match="an A side and a B side"):
        amxmm.product_dequant(b, a, cs, rs, torch.empty((4, 9)))
    e, f = torch.empty(0, dtype=torch.int8).numpy(), torch.ones(4).numpy()
    with pytest.raises(ValueError, match="buffer"):       # the C side checks sizes too
        amxmm.LOOPS.amx_product_dq(e, 0, a.data.numpy(), b.data.numpy(), torch.ones(9).numpy(),
                                   f, torch.empty(36).numpy(), False,
                                   torch.zeros(9, dtype=torch.int64).numpy(),
                                   torch.zeros(3, dtype=torch.int64).numpy(), 9, 4, 5, 5, 0,
                                   5, 0, False, 0, 1)


@needs_amx
def test_auto_picks_amx_where_it_runs_and_says_why(route, monkeypatch):
    route("auto")
    assert gemm_route.int_gemm_route() == "amx"
    assert "AMX tiles, probe passed" in gemm_route.int_gemm_status()["reason"]
    a = torch.randint(-128, 128, (30, 70), dtype=torch.int8)
    b = torch.randint(-128, 128, (20, 70), dtype=torch.int8)
    calls = []
    real = amxmm.amx_mm
    monkeypatch.setattr(amxmm, "amx_mm", lambda *x, **k: calls.append(1) or real(*x, **k))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = gemm_route.exact_int_mm_cpu(a, b)
    assert calls and torch.equal(got.to(torch.int64), _exact(a, b))


def test_amx_forced_without_amx_takes_the_float_route_and_says_why(route, monkeypatch):
    monkeypatch.setattr(gemm_route, "cpu_flags", lambda: {"avx2", "fma", "avx512_vnni"})
    route("amx")
    assert gemm_route.int_gemm_route() == "float"
    assert "no AMX-INT8 tiles" in gemm_route.int_gemm_status()["reason"]
    route("auto")                     # auto goes on to the other routes: int (VNNI here)
    assert gemm_route.int_gemm_route() in ("int", "float")


@needs_amx
def test_a_failed_amx_probe_is_reported_and_another_route_taken(route, monkeypatch):
    # forged tile GEMM saturating like vpmaddubsw: the probe refuses it; auto goes on to the
    # library's route (probed on its own), forced amx leaves the float route
    monkeypatch.setattr(gemm_route, "_amx_int_mm",
                        lambda a, b_t, out=None: saturating_int_mm(a, b_t))
    route("auto")
    with pytest.warns(RuntimeWarning, match="AMX tile GEMM is not exact.*all 127 x all 127"):
        assert gemm_route.int_gemm_route() in ("int", "pairs", "float")
    route("amx")
    with pytest.warns(RuntimeWarning, match="AMX tile GEMM's probe failed"):
        assert gemm_route.int_gemm_route() == "float"
    a, b = torch.full((5, 300), 127, dtype=torch.int8), torch.full((3, 300), 127, dtype=torch.int8)
    assert torch.equal(gemm_route.exact_int_mm_cpu(a, b).to(torch.int64), _exact(a, b))


@needs_amx
@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("fault", ["one element", "cancelling in a row"])
def test_an_amx_fault_the_probe_misses_is_caught_and_recomputed(route, monkeypatch, fault,
                                                                 fused):
    # tile state lost on a context switch would look like this: exact on the probe's shapes,
    # wrong on a larger product - caught by the sums in the dequantization's pass (a pair
    # of errors cancelling in a row by the column sums), counted, recomputed on float. Fused:
    # the tiles' epilogue reports the sums of the wrong product it dequantized
    a = torch.randint(-128, 128, (48, 2100), dtype=torch.int8)
    b = torch.randint(-128, 128, (29, 2100), dtype=torch.int8)
    rs, cs = torch.rand(48) * 1e-3, torch.rand(29) * 1e-2
    monkeypatch.setattr(gemm, "FUSED_DEQUANT", fused)
    route("float")
    want = gemm.int8_mm_cpu(a, b, rs, cs, torch.bfloat16)
    real, real_dq = amxmm.amx_mm, gemm_route._amx_dequant_mm
    wrong = {(3, 5): 1} if fault == "one element" else {(3, 5): 1, (3, 6): -1}

    def faulty_on_large(a, b_t, out=None):
        got = real(a, b_t.t(), out)
        if a.shape[0] >= 40:
            for (r, c), d in wrong.items():
                got[r, c] += d
        return got

    def faulty_dequant_on_large(a, b, rs, cs, out):
        rows, cols = real_dq(a, b, rs, cs, out)
        if a.shape[0] >= 40:
            for (r, c), d in wrong.items():
                rows[r] += d
                cols[c] += d
        return rows, cols

    monkeypatch.setattr(gemm_route, "_amx_int_mm", faulty_on_large)
    monkeypatch.setattr(gemm_route, "_amx_dequant_mm", faulty_dequant_on_large)
    route("amx")
    assert gemm_route.int_gemm_route() == "amx"
    with pytest.warns(RuntimeWarning, match="checksum failed on a 48x2100x29 GEMM"):
        got = gemm.int8_mm_cpu(a, b, rs, cs, torch.bfloat16)
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    assert gemm_route.int_gemm_status()["route"] == "float"
    assert gemm_route.int_gemm_status()["failures"] == 1


@needs_amx
def test_amx_gives_the_float_routes_bits_through_the_linear(route):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(70, 320, generator=g).to(torch.bfloat16)
    w = (torch.randn(90, 320, generator=g) * 0.02).to(torch.bfloat16)
    dy = (torch.randn(70, 90, generator=g) * 1e-3).to(torch.bfloat16)
    s = torch.tensor([4.0 / 127])
    outs = {}
    for which in ("float", "amx"):
        route(which)
        with force("cpu"), warnings.catch_warnings():
            warnings.simplefilter("error")
            outs[which] = (linear_int8_forward(x, w, s), *linear_int8_backward(dy, x, w, s))
        assert gemm_route.int_gemm_route() == which
    for f, i in zip(outs["float"], outs["amx"]):
        assert torch.equal(f.view(-1).view(torch.int16 if f.dtype == torch.bfloat16 else
                                           torch.int32),
                           i.view(-1).view(torch.int16 if i.dtype == torch.bfloat16 else
                                           torch.int32))


@needs_amx
@pytest.mark.parametrize("slices", [2, 3])
def test_amx_gives_the_float_routes_bits_through_the_lm_head(route, monkeypatch, slices):
    # the head's level products on the tile GEMM (several output blocks, a non-finite row
    # and column), checked by the head's own sums: the float route's bits
    from open1b_kernels.ops import lmhead_int as li
    from tests.kernels.test_lmhead_int import _case, _run, _same
    monkeypatch.setattr(li, "SHORT_BLOCKS", (16, 32))
    h, w, dl = _case(k=320)
    dl[5, 7] = float("nan")
    route("float")
    want = _run(h, w, dl, slices)
    route("amx")
    calls = []
    real = amxmm.amx_mm
    monkeypatch.setattr(amxmm, "amx_mm", lambda *x, **k: calls.append(1) or real(*x, **k))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = _run(h, w, dl, slices)
    assert calls and gemm_route.int_gemm_status()["failures"] == 0
    assert _same(want, got)


@needs_amx
@pytest.mark.parametrize("tokens", [128, 100])
def test_the_heads_level_runs_as_windows_of_one_packing(route, monkeypatch, tokens):
    # the weight gradient's A operands (dlogits' slices, transposed) packed once per row
    # block, each level's run a window of it - where the tokens fill whole chunks (128);
    # packed per product otherwise (100): the float route's bits either way
    from open1b_kernels.ops import lmhead_int as li
    from tests.kernels.test_lmhead_int import _case, _run, _same
    monkeypatch.setattr(li, "SHORT_BLOCKS", (32, 64))
    h, w, dl = _case(m=tokens, k=320, v=150)
    route("float")
    want = _run(h, w, dl, 3)
    route("amx")
    windows = []
    real = li.a_windows
    monkeypatch.setattr(li, "a_windows", lambda *x: windows.append(real(*x)) or windows[-1])
    got = _run(h, w, dl, 3)
    assert gemm_route.int_gemm_status()["failures"] == 0 and _same(want, got)
    used = [len(got) for got in windows if got]
    assert (max(used) >= 2) if tokens % 64 == 0 else (max(used, default=0) <= 1)

