/* The exact int8 GEMM on AMX tiles: C (int32, M x N) = A (int8, M x K) . B (int8, N x K)^T.
 *
 * Why: on an Intel Xeon with AMX-INT8 (Sapphire Rapids and later) the library's integer
 * GEMM (torch._int_mm) runs oneDNN's `gemm_api`, an AVX-512 VNNI kernel (ONEDNN_VERBOSE
 * names it; measured 0.7-1.5 TOPS on 2 cores), while one TDPBSSD multiplies a 16 x 64 by a
 * 64 x 16 int8 tile: 16,384 multiply-adds, several times VNNI's rate per core.
 *
 * Exact by construction, in any order: TDPBSSD multiplies signed int8 pairs (products at
 * most 2^14 in magnitude), adds each group of four into a 32-bit sum and that into the
 * int32 accumulator with plain two's complement addition (no saturation: Intel SDM,
 * TDPBSSD), so the accumulator holds the integer sum while it stays below 2^31 - which K
 * products of at most 2^14 do for K <= 131,071 (the caller's MAX_K). Integer additions are
 * associative: the blocking, the cut between threads and the order of the tiles give the
 * integer product itself, the same bits as every other route.
 *
 * Layout: both operands packed once into tile panels (_amxlayout.h; the packing:
 * _amxpack.c). C is summed in 32 x 32 blocks (four accumulator tiles, two A and two B
 * tiles: the 8 tile registers), in cache blocks of rows and columns and passes over the
 * contraction (CROWS, CCOLS, PASS).
 *
 * Where it runs: open1b_kernels/core/_amx.h (amx_ready: CPUID, XCR0 and the OS's permission
 * for the tile data, probed once). Elsewhere, or in a build without the AMX intrinsics,
 * amx_cpu() is False and the caller takes another route. */
#include "../core/_ext.h"

#include <math.h>
#include <string.h>

#include "../core/_amx.h"
#include "../core/_mathfn.h"
#include "_amxlayout.h"
#include "_amxlevels.h"
#include "_amxpass.h"

/* The product runs C in cache blocks of CROWS x CCOLS (its int32 sums, 512 KiB, in L2 beside
 * B's pass of the block, 512 KiB) and the contraction in passes of PASS chunks: per pass, a
 * pair of A's 16-row panels (32 rows x 1,024 bytes: 32 KiB) is copied once into an L1
 * buffer by the tiles themselves (loaded, then stored, as the first 32 x 32 block of the pass
 * computes with them) and every block of B's columns in the cache block then runs against
 * it, B's tiles loaded with TILELOADDT1 (no reuse soon: the hint keeps them from evicting A),
 * the 32 x 32 sums loaded from and stored to the carried blocks at each pass's start and end
 * (the pass's loops: _amxpass.h).
 * Why: with the whole contraction per block, A and B both came from L2 or beyond, and a
 * row-major A read in place puts its rows (K apart, K a multiple of 1,024) in the same few
 * L1 sets. Measured on the 2-core AMX Xeon VM (2 threads, T multiply-adds/s, the step's
 * shapes at 4,096 tokens, dequantized to bf16, A's packing in the time): 2.4-2.6 -> 2.8-3.1
 * at the linears' forwards and weight gradients, 2.0-2.2 -> 2.8-3.0 at gate|up's dX; the
 * earlier form of this blocking (C reloaded every 8-16 chunks, A read where it lay, B with
 * plain loads) ran 1.4-1.9 against 2.0-2.1 whole. Passes of 12 or 20 chunks, 128-row or
 * 256-column blocks ran no faster. Integer sums: the same bits in any blocking. */
#define CROWS 256
#define CCOLS 512
#define SUMS_BYTES (CROWS * CCOLS * 4)
#define KEEP_BYTES (2 * PASS * BLOCK_BYTES)

/* A piece's scratch for `nl` levels (one product: 1): a sums plane a level, then A's copy. */
static inline Py_ssize_t scratch_bytes(int nl) { return nl * SUMS_BYTES + KEEP_BYTES; }

/* The smallest result stored by streaming stores (`streams`); amx_stream() reads and sets
 * it, in every build (a build without the tile loops has the setting and no product). */
static Py_ssize_t stream_min_bytes = 8 << 20;

/* ---------------------------------------------------------------- the tile product */

#if AMX_BUILD
/* Where the tiles are. A: packed (a == NULL: the panels `ap`, every row) or read in place
 * from row-major A (`a`, row stride lda, K a multiple of 64) for the rows below
 * `direct_rows` (a multiple of 32), the packed panels `ap` holding only the rows from there
 * on. In place saves the copy of A: a tile loads 16 rows of 64 bytes at any stride. B: the
 * panels `bp`. A packed panel holds akp (bkp) bytes a line: the product's KP, or more where
 * the product reads a window of the contraction (`ap`, `bp` then point at the window's first
 * chunk): one packing serves the products of its prefixes and suffixes. */
typedef struct {
    const int8_t *a, *ap, *bp;
    Py_ssize_t lda, direct_rows, akp, bkp;
} sides;

/* The A tiles of rows [i, i + 32) and their step and stride per 64-wide chunk. */
static inline const int8_t *a_tiles(const sides *A, Py_ssize_t i, Py_ssize_t *step,
                                    Py_ssize_t *stride, Py_ssize_t *half) {
    if (A->a && i < A->direct_rows) {
        *step = KCHUNK;
        *stride = A->lda;
        *half = LINES * A->lda;
        return A->a + i * A->lda;
    }
    *step = BLOCK_BYTES;
    *stride = KCHUNK;
    *half = LINES * A->akp;
    return A->ap + (i - (A->a ? A->direct_rows : 0)) * A->akp;
}

/* The dequantization epilogue (open1b_kernels.int8.gemm's, as _gemm.c's dequant_loop runs it)
 * applied to each 32 x 32 block of C while it is in cache, instead of C written as int32 and
 * read back: y = (float)acc (int32 -> float32, round to nearest even), y = y * rs[row] (rs[0]
 * when per_row is 0), y = y * cs[col] - two float32 multiplies in that order, never fused
 * (-ffp-contract=off) - stored as float32 or as bf16 bits (bf16_rne1); and the exactness
 * guard's exact int64 row and column sums of acc, added into this piece's own `rows` (M)
 * and `cols` (N). The sums are of the very int32 values dequantized, so the guard checks
 * what was written. */
typedef struct {
    const float *rs, *cs;
    int per_row;
    float *o32;
    uint16_t *o16;
    int64_t *rows, *cols;
    int stream;
    int v4;     /* the CPU runs x86-64-v4 (every AMX CPU so far; checked, not assumed) */
} dq_epi;

#if HAVE_V4
#define DQ_TARGET V4    /* AMX CPUs all run x86-64-v4: the epilogue's 32 columns in 2 vectors */
#else
#define DQ_TARGET
#endif

#if HAVE_V4
/* dq_block of a whole 32 x 32 block in AVX-512 registers: the same operations - the int32 ->
 * float32 conversion (vcvtdq2ps rounds to nearest even, as the scalar conversion), the two
 * multiplies, bf16_rne1's integer rounding and NaN test - lane by lane; the sums in int64
 * lanes (a compiler left the scalar form's sums unvectorized). */
V4 static void dq_block32(const dq_epi *E, const int32_t *blk, Py_ssize_t i, Py_ssize_t j,
                          Py_ssize_t N) {
    const __m512 cs0 = _mm512_loadu_ps(E->cs + j), cs1 = _mm512_loadu_ps(E->cs + j + 16);
    __m512i c0 = _mm512_setzero_si512(), c1 = c0, c2 = c0, c3 = c0;
    for (int r = 0; r < 32; r++) {
        __m512i x0 = _mm512_load_si512((const void *)(blk + r * 32));
        __m512i x1 = _mm512_load_si512((const void *)(blk + r * 32 + 16));
        __m512 s = _mm512_set1_ps(E->rs[E->per_row ? i + r : 0]);
        __m512 y0 = _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(x0), s), cs0);
        __m512 y1 = _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(x1), s), cs1);
        if (E->o16) {
            const __m512i bias = _mm512_set1_epi32(0x7FFF), one = _mm512_set1_epi32(1);
            const __m512i nan = _mm512_set1_epi32(0x7FC0);
            __m512i b0 = _mm512_castps_si512(y0), b1 = _mm512_castps_si512(y1);
            b0 = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(b0, bias), _mm512_and_si512(
                     _mm512_srli_epi32(b0, 16), one)), 16);
            b1 = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(b1, bias), _mm512_and_si512(
                     _mm512_srli_epi32(b1, 16), one)), 16);
            b0 = _mm512_mask_mov_epi32(b0, _mm512_cmp_ps_mask(y0, y0, _CMP_UNORD_Q), nan);
            b1 = _mm512_mask_mov_epi32(b1, _mm512_cmp_ps_mask(y1, y1, _CMP_UNORD_Q), nan);
            uint16_t *o = E->o16 + (i + r) * N + j;
            __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi32_epi16(b0)),
                                              _mm512_cvtepi32_epi16(b1), 1);
            if (E->stream) _mm512_stream_si512((void *)o, both);
            else _mm512_storeu_si512((void *)o, both);
        } else {
            float *o = E->o32 + (i + r) * N + j;
            if (E->stream) {
                _mm512_stream_ps(o, y0);
                _mm512_stream_ps(o + 16, y1);
            } else {
                _mm512_storeu_ps(o, y0);
                _mm512_storeu_ps(o + 16, y1);
            }
        }
        __m512i w0 = _mm512_cvtepi32_epi64(_mm512_castsi512_si256(x0));
        __m512i w1 = _mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(x0, 1));
        __m512i w2 = _mm512_cvtepi32_epi64(_mm512_castsi512_si256(x1));
        __m512i w3 = _mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(x1, 1));
        c0 = _mm512_add_epi64(c0, w0);
        c1 = _mm512_add_epi64(c1, w1);
        c2 = _mm512_add_epi64(c2, w2);
        c3 = _mm512_add_epi64(c3, w3);
        E->rows[i + r] += _mm512_reduce_add_epi64(
            _mm512_add_epi64(_mm512_add_epi64(w0, w1), _mm512_add_epi64(w2, w3)));
    }
    int64_t *cols = E->cols + j;
    _mm512_storeu_si512((void *)cols, _mm512_add_epi64(_mm512_loadu_si512((void *)cols), c0));
    _mm512_storeu_si512((void *)(cols + 8),
                        _mm512_add_epi64(_mm512_loadu_si512((void *)(cols + 8)), c1));
    _mm512_storeu_si512((void *)(cols + 16),
                        _mm512_add_epi64(_mm512_loadu_si512((void *)(cols + 16)), c2));
    _mm512_storeu_si512((void *)(cols + 24),
                        _mm512_add_epi64(_mm512_loadu_si512((void *)(cols + 24)), c3));
}
#endif

/* A 32 x 32 int32 block from L1 to C (row stride N) by streaming stores: C's lines are
 * written whole, so the cache need not read them first. */
#if HAVE_V4
V4 static void stream_block(const int32_t *blk, int32_t *c, Py_ssize_t N) {
    for (int r = 0; r < 32; r++)
        for (int q = 0; q < 32; q += 16)
            _mm512_stream_si512((void *)(c + r * N + q),
                                _mm512_load_si512((const void *)(blk + r * 32 + q)));
}
#else
static void stream_block(const int32_t *blk, int32_t *c, Py_ssize_t N) {
    for (int r = 0; r < 32; r++) memcpy(c + r * N, blk + r * 32, 32 * 4);
}
#endif

/* Whether a result of `bytes` (row stride `row_bytes`, at `base`) is stored by streaming
 * stores: only one larger than the caches, which its reader meets in memory anyway (a small
 * one stays in cache for it), with whole 64-byte lines. Measured on the 2-core AMX Xeon VM
 * at 4,096 x 2,048 x 11,264: the int32 product 49 -> 44 ms, the product dequantized to bf16
 * 61 -> 45 ms (the cache no longer reads each line of C before writing it). */
static int streams(const void *base, Py_ssize_t bytes, Py_ssize_t row_bytes) {
    return HAVE_V4 && bytes >= stream_min_bytes && ((uintptr_t)base & 63) == 0 &&
           row_bytes % 64 == 0 && cpu_level() >= 2;
}

/* A block at C's edge (fewer than 32 rows or columns), or any block in a build without
 * the x86-64-v4 copy. */
DQ_TARGET static void dq_block(const dq_epi *E, const int32_t *blk, Py_ssize_t i, Py_ssize_t j,
                               Py_ssize_t rows, Py_ssize_t cols, Py_ssize_t N) {
#if HAVE_V4
    if (rows == 32 && cols == 32 && E->v4) {
        dq_block32(E, blk, i, j, N);
        return;
    }
#endif
    int64_t csum[32] = {0};
    for (Py_ssize_t r = 0; r < rows; r++) {
        const int32_t *x = blk + r * 32;
        float s = E->rs[E->per_row ? i + r : 0];
        if (E->o16) {
            uint16_t *o = E->o16 + (i + r) * N + j;
            for (Py_ssize_t c = 0; c < cols; c++) {
                float y = (float)x[c];
                y = y * s;
                y = y * E->cs[j + c];
                o[c] = bf16_rne1(y);
            }
        } else {
            float *o = E->o32 + (i + r) * N + j;
            for (Py_ssize_t c = 0; c < cols; c++) {
                float y = (float)x[c];
                y = y * s;
                o[c] = y * E->cs[j + c];
            }
        }
        int64_t sum = 0;
        for (Py_ssize_t c = 0; c < cols; c++) {
            sum += x[c];
            csum[c] += x[c];
        }
        E->rows[i + r] += sum;
    }
    for (Py_ssize_t c = 0; c < cols; c++) E->cols[j + c] += csum[c];
}

/* One summed 32 x 32 block of C (rows i.., columns j..; `rows` x `cols` of it inside C) to
 * its place: through the epilogue E, by streaming stores, or copied. */
static void block_out(const int32_t *blk, int32_t *c, Py_ssize_t i, Py_ssize_t j,
                      Py_ssize_t rows, Py_ssize_t cols, Py_ssize_t N, int stream,
                      const dq_epi *E) {
    if (E)
        dq_block(E, blk, i, j, rows, cols, N);
    else if (stream && rows == 32 && cols == 32)
        stream_block(blk, c + i * N + j, N);
    else
        for (Py_ssize_t r = 0; r < rows; r++) memcpy(c + (i + r) * N + j, blk + r * 32, cols * 4);
}

/* One cache block of C - rows [ib, ie) x columns [jb, je), multiples of 32 but for the ends
 * at M and N - summed in passes of PASS chunks (see PASS) into `sums` (32 x 32 blocks, a
 * row of blocks after another). Every 32-line block is whole in the operands (packed lines
 * are zero-padded to 32, A's rows in place are whole blocks), so the blocks at C's edges run
 * as the others and only their writing is cut. `keep`: the pass's copy of A's rows. */
AMX_TARGET static void cache_block(const sides *A, Py_ssize_t chunks, Py_ssize_t ib,
                                   Py_ssize_t ie, Py_ssize_t jb, Py_ssize_t je, int32_t *sums,
                                   int8_t *keep) {
    Py_ssize_t blocks_j = (je - jb + 31) / 32;
    for (Py_ssize_t ch = 0; ch < chunks; ch += PASS) {
        Py_ssize_t n = chunks - ch < PASS ? chunks - ch : PASS;
        for (Py_ssize_t i = ib; i < ie; i += 32) {
            Py_ssize_t step, stride, half;
            const int8_t *a0 = a_tiles(A, i, &step, &stride, &half) + ch * step;
            int32_t *row = sums + (i - ib) / 32 * blocks_j * 1024;
            for (Py_ssize_t j = jb; j < je; j += 32) {
                const int8_t *b0 = A->bp + j * A->bkp + ch * BLOCK_BYTES;
                const int8_t *b1 = b0 + LINES * A->bkp;
                int32_t *blk = row + (j - jb) / 32 * 1024;
                if (j == jb)
                    pass_first(a0, a0 + half, step, stride, b0, b1, n, ch > 0, blk, keep);
                else
                    pass_next(keep, b0, b1, n, ch > 0, blk);
            }
        }
    }
}

/* C's rows [r0, r1) x columns [c0, c1) (multiples of 32 but for the ends at M and N), in
 * cache blocks of CROWS x CCOLS, each summed by cache_block, then written by block_out.
 * With `nl` levels (V: amx_levels) each cache block is summed once per level - level l's
 * operands A[l], its chunks KP[l] / KCHUNK - into a sums plane of its own, and its blocks go
 * through the level epilogue (_amxlevels.h). The planes keep the whole cache block: at the
 * head's forward blocks (1,024 x 4,096, three levels) narrower blocks whose planes fit in
 * SUMS_BYTES ran slower (256 x 160: 0.95-0.99x the levels' products written and summed
 * apart, 256 x 256: 1.05-1.08x, 256 x 512: 1.06-1.12x; the 2-core AMX Xeon VM). `scratch`:
 * scratch_bytes(nl), 64-byte aligned, this call's own. */
AMX_TARGET static void product(const sides *A, const Py_ssize_t *KP, int nl, int32_t *c,
                               Py_ssize_t M, Py_ssize_t N, Py_ssize_t r0, Py_ssize_t r1,
                               Py_ssize_t c0, Py_ssize_t c1, const dq_epi *E, const lv_epi *V,
                               int8_t *scratch) {
    int32_t *sums = (int32_t *)scratch;
    int8_t *keep = scratch + nl * SUMS_BYTES;
    int stream = !E && !V && streams(c, M * N * 4, N * 4);
    const Py_ssize_t plane = CROWS * CCOLS;
    amx_tiles_on();
    for (Py_ssize_t jb = c0; jb < c1; jb += CCOLS)
        for (Py_ssize_t ib = r0; ib < r1; ib += CROWS) {
            Py_ssize_t ie = ib + CROWS < r1 ? ib + CROWS : r1;
            Py_ssize_t je = jb + CCOLS < c1 ? jb + CCOLS : c1;
            Py_ssize_t blocks_j = (je - jb + 31) / 32;
            for (int l = 0; l < nl; l++)
                cache_block(A + l, KP[l] / KCHUNK, ib, ie, jb, je, sums + l * plane, keep);
            for (Py_ssize_t i = ib; i < ie; i += 32)
                for (Py_ssize_t j = jb; j < je; j += 32) {
                    const int32_t *blk = sums + ((i - ib) / 32 * blocks_j + (j - jb) / 32) * 1024;
                    Py_ssize_t rows = M - i < 32 ? M - i : 32, cols = N - j < 32 ? N - j : 32;
                    if (V)
                        levels_block(V, blk, plane, i, j, rows, cols);
                    else
                        block_out(blk, c, i, j, rows, cols, N, stream, E);
                }
        }
    if (stream || (E && E->stream) || (V && V->stream)) _mm_sfence();  /* seen by the caller */
    _tile_release();
}
#endif

/* ---------------------------------------------------------------- Python wrappers */

/* The checks both products' wrappers make: A in place (a: row-major, stride lda >= K, K a
 * multiple of 64, every row; ap the rows from M rounded down to 32 packed) or packed (a
 * empty, ap every row), B packed, the unit range and the pieces. A packed side may be a
 * window of a longer packing: its panels of ka (kb) contraction values, the product's K of
 * them from chunk a0 (b0) on - ending on a chunk's end or at the panels' own end, so that
 * the padding the product reads past K is the packing's zeros, never the next values. */
static int window_ok(Py_ssize_t K, Py_ssize_t k, Py_ssize_t off) {
    return off >= 0 && k >= K && off * KCHUNK + K <= k &&
           (K % KCHUNK == 0 || off * KCHUNK + K == k);
}

static int operands_ok(const Py_buffer *a, Py_ssize_t lda, const Py_buffer *ap,
                       const Py_buffer *bp, Py_ssize_t M, Py_ssize_t N, Py_ssize_t K,
                       Py_ssize_t ka, Py_ssize_t a0, Py_ssize_t kb, Py_ssize_t b0, int by_cols,
                       Py_ssize_t u0, Py_ssize_t u1, int pieces) {
    Py_ssize_t direct_rows = a->len > 0 ? M / 32 * 32 : 0;
    return amx_ready() && M >= 1 && N >= 1 && K >= 1 && window_ok(K, ka, a0) &&
           window_ok(K, kb, b0) &&
           (a->len == 0 || (K % KCHUNK == 0 && lda >= K && ka == K && a0 == 0 &&
                            holds(a, (M - 1) * lda + K, "a"))) &&
           sized(ap, packed_bytes(M - direct_rows, ka), 1, "ap") &&
           sized(bp, packed_bytes(N, kb), 1, "bp") &&
           units_ok(u0, u1, round_up(by_cols ? N : M, 32) / 32) && PIECES_OK(pieces);
}

#if AMX_BUILD
/* The tiles' view of one product's checked operands (operands_ok's arguments). */
static sides side_of(const Py_buffer *a, Py_ssize_t lda, const Py_buffer *ap,
                     const Py_buffer *bp, Py_ssize_t M, Py_ssize_t ka, Py_ssize_t a0,
                     Py_ssize_t kb, Py_ssize_t b0) {
    return (sides){a->len > 0 ? a->buf : NULL, (const int8_t *)ap->buf + a0 * BLOCK_BYTES,
                   (const int8_t *)bp->buf + b0 * BLOCK_BYTES, lda,
                   a->len > 0 ? M / 32 * 32 : 0, round_up(ka, KCHUNK), round_up(kb, KCHUNK)};
}

/* C's 32-line units [lo, hi) - of columns with by_cols, else of rows - by `product`, with
 * `nl` levels' operands A and padded contractions KP (one product: nl 1). */
static void product_units(const sides *A, const Py_ssize_t *KP, int nl, int32_t *c,
                          Py_ssize_t M, Py_ssize_t N, int by_cols, Py_ssize_t lo, Py_ssize_t hi,
                          const dq_epi *E, const lv_epi *V, int8_t *scratch) {
    lo *= 32;
    hi *= 32;
    if (by_cols)
        product(A, KP, nl, c, M, N, 0, M, lo, hi < N ? hi : N, E, V, scratch);
    else
        product(A, KP, nl, c, M, N, lo, hi < M ? hi : M, 0, N, E, V, scratch);
}

/* Every piece's scratch (`bytes` each), taken before any is written: NULL (with MemoryError
 * set) if refused. */
static int8_t *pieces_scratch(int pieces, Py_ssize_t bytes) {
    int8_t *s = aligned_alloc(64, (size_t)pieces * (size_t)bytes);
    if (s == NULL) PyErr_NoMemory();
    return s;
}
#endif

static PyObject *py_amx_product(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer a, ap, bp, c;
    Py_ssize_t M, N, K, ka, a0, kb, b0, lda, u0, u1;
    int by_cols, pieces = 1;
    if (!PyArg_ParseTuple(args, "y*ny*y*w*nnnnnnnpnn|i", &a, &lda, &ap, &bp, &c, &M, &N, &K,
                          &ka, &a0, &kb, &b0, &by_cols, &u0, &u1, &pieces))
        return NULL;
    int ok = operands_ok(&a, lda, &ap, &bp, M, N, K, ka, a0, kb, b0, by_cols, u0, u1, pieces) &&
             sized(&c, M * N, 4, "c");
#if AMX_BUILD
    int8_t *scratch = ok ? pieces_scratch(pieces, scratch_bytes(1)) : NULL;
    int ran = scratch != NULL;
    if (ran) {
        sides A = side_of(&a, lda, &ap, &bp, M, ka, a0, kb, b0);
        Py_ssize_t KP = round_up(K, KCHUNK);
        Py_BEGIN_ALLOW_THREADS
        FOR_PIECES(u0, u1, pieces, product_units(&A, &KP, 1, c.buf, M, N, by_cols, p_lo, p_hi,
                                                 NULL, NULL, scratch + piece * scratch_bytes(1)));
        Py_END_ALLOW_THREADS
        free(scratch);
    }
    ok = ok && ran;
#endif
    return FINISH(ok, "amx_product: needs AMX-INT8 (amx_cpu()) and consistent shapes", &a, &ap,
                  &bp, &c);
}

static PyObject *py_amx_product_dq(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer a, ap, bp, rs, cs, out, rows, cols;
    Py_ssize_t M, N, K, ka, a0, kb, b0, lda, u0, u1;
    int by_cols, out_bf16, pieces = 1;
    if (!PyArg_ParseTuple(args, "y*ny*y*y*y*w*pw*w*nnnnnnnpnn|i", &a, &lda, &ap, &bp, &rs, &cs,
                          &out, &out_bf16, &rows, &cols, &M, &N, &K, &ka, &a0, &kb, &b0,
                          &by_cols, &u0, &u1, &pieces))
        return NULL;
    int per_row = rs.len == M * 4;
    int ok = operands_ok(&a, lda, &ap, &bp, M, N, K, ka, a0, kb, b0, by_cols, u0, u1, pieces) &&
             (per_row || rs.len == 4) && sized(&cs, N, 4, "cs") &&
             sized(&out, M * N, out_bf16 ? 2 : 4, "out") &&
             sized(&rows, pieces * M, 8, "rows") && sized(&cols, pieces * N, 8, "cols");
#if AMX_BUILD
    int8_t *scratch = ok ? pieces_scratch(pieces, scratch_bytes(1)) : NULL;
    int ran = scratch != NULL;
    if (ran) {
        int stream = streams(out.buf, out.len, N * (out_bf16 ? 2 : 4)), v4 = cpu_level() >= 2;
        sides A = side_of(&a, lda, &ap, &bp, M, ka, a0, kb, b0);
        Py_ssize_t KP = round_up(K, KCHUNK);
        Py_BEGIN_ALLOW_THREADS
        FOR_PIECES(u0, u1, pieces, {
            dq_epi E = {rs.buf, cs.buf, per_row, out_bf16 ? NULL : out.buf,
                        out_bf16 ? out.buf : NULL, (int64_t *)rows.buf + piece * M,
                        (int64_t *)cols.buf + piece * N, stream, v4};
            product_units(&A, &KP, 1, NULL, M, N, by_cols, p_lo, p_hi, &E, NULL,
                          scratch + piece * scratch_bytes(1));
        });
        Py_END_ALLOW_THREADS
        free(scratch);
    }
    ok = ok && ran;
#endif
    return FINISH(ok, "amx_product_dq: needs AMX-INT8 (amx_cpu()) and consistent shapes", &a,
                  &ap, &bp, &rs, &cs, &out, &rows, &cols);
}

/* amx_levels: the levels' operands, each (a, lda, ap, bp, K, ka, a0, kb, b0, shift) as
 * amx_product takes them, with the level's weight 2^shift. */
static int level_parse(PyObject *item, Py_buffer *buf, Py_ssize_t *lda, Py_ssize_t *geo,
                       int *shift) {
    return PyArg_ParseTuple(item, "y*ny*y*nnnnni", &buf[0], lda, &buf[1], &buf[2], &geo[0],
                            &geo[1], &geo[2], &geo[3], &geo[4], shift);
}

static PyObject *py_amx_levels(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *seq;
    Py_buffer bufs[5 + 3 * MAX_LEVELS];     /* rowf, colf, out, rows, cols, then a level's 3 */
    Py_ssize_t M, N, ldo, u0, u1, lda[MAX_LEVELS], geo[MAX_LEVELS][5];
    int by_cols, pieces = 1, shift[MAX_LEVELS], nb = 5;
    if (!PyArg_ParseTuple(args, "Oy*y*w*nw*w*nnpnn|i", &seq, &bufs[0], &bufs[1], &bufs[2], &ldo,
                          &bufs[3], &bufs[4], &M, &N, &by_cols, &u0, &u1, &pieces))
        return NULL;
    PyObject *fast = PySequence_Fast(seq, "amx_levels: the levels must be a sequence");
    Py_ssize_t nl = fast ? PySequence_Fast_GET_SIZE(fast) : 0;
    int ok = fast != NULL;
    if (ok && (nl < 1 || nl > MAX_LEVELS)) {
        PyErr_Format(PyExc_ValueError, "amx_levels: %zd levels, needs 1 to %d", nl, MAX_LEVELS);
        ok = 0;
    }
    for (Py_ssize_t l = 0; ok && l < nl; l++) {
        ok = level_parse(PySequence_Fast_GET_ITEM(fast, l), bufs + nb, &lda[l], geo[l], &shift[l]);
        if (!ok) break;
        nb += 3;
        ok = operands_ok(&bufs[nb - 3], lda[l], &bufs[nb - 2], &bufs[nb - 1], M, N, geo[l][0],
                         geo[l][1], geo[l][2], geo[l][3], geo[l][4], by_cols, u0, u1, pieces);
        if (ok && (shift[l] < 0 || shift[l] > 52)) {
            PyErr_Format(PyExc_ValueError, "amx_levels: shift %d outside [0, 52]", shift[l]);
            ok = 0;
        }
    }
    Py_XDECREF(fast);
    ok = ok && sized(&bufs[0], M, 8, "rowf") && sized(&bufs[1], N, 8, "colf") &&
         ldo >= N && holds(&bufs[2], ((M - 1) * ldo + N) * 4, "out") &&
         sized(&bufs[3], pieces * M, 8, "rows") && sized(&bufs[4], pieces * N, 8, "cols");
#if AMX_BUILD
    Py_ssize_t each = scratch_bytes((int)nl);
    int8_t *scratch = ok ? pieces_scratch(pieces, each) : NULL;
    int ran = scratch != NULL;
    if (ran) {
        sides A[MAX_LEVELS];
        Py_ssize_t KP[MAX_LEVELS];
        lv_epi V = {bufs[0].buf, bufs[1].buf, {0}, {0}, (int)nl, bufs[2].buf, ldo, NULL, NULL,
                    streams(bufs[2].buf, M * ldo * 4, ldo * 4), cpu_level() >= 2};
        for (Py_ssize_t l = 0; l < nl; l++) {
            A[l] = side_of(&bufs[5 + 3 * l], lda[l], &bufs[6 + 3 * l], &bufs[7 + 3 * l], M,
                           geo[l][1], geo[l][2], geo[l][3], geo[l][4]);
            KP[l] = round_up(geo[l][0], KCHUNK);
            V.w[l] = ldexp(1.0, shift[l]);
            V.sh[l] = shift[l];
        }
        Py_BEGIN_ALLOW_THREADS
        FOR_PIECES(u0, u1, pieces, {
            lv_epi P = V;
            P.rows = (uint64_t *)bufs[3].buf + piece * M;
            P.cols = (uint64_t *)bufs[4].buf + piece * N;
            product_units(A, KP, (int)nl, NULL, M, N, by_cols, p_lo, p_hi, NULL, &P,
                          scratch + piece * each);
        });
        Py_END_ALLOW_THREADS
        free(scratch);
    }
    ok = ok && ran;
#endif
    return finish(bufs, nb, ok, "amx_levels: needs AMX-INT8 (amx_cpu()) and consistent shapes");
}

static PyObject *py_amx_stream(PyObject *self, PyObject *args) {
    (void)self;
    Py_ssize_t bytes = -1;
    if (!PyArg_ParseTuple(args, "|n", &bytes)) return NULL;
    Py_ssize_t was = stream_min_bytes;
    if (bytes >= 0) stream_min_bytes = bytes;
    return PyLong_FromSsize_t(was);
}

static PyObject *py_amx_cpu(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    return PyBool_FromLong(amx_ready());
}

EXT_METHODS(amxmm) = {
    {"amx_cpu", py_amx_cpu, METH_NOARGS,
     "amx_cpu(): whether this process runs AMX-INT8 tiles (CPUID, XCR0 and the OS's "
     "permission for the tile data; probed once)."},
    {"amx_product", py_amx_product, METH_VARARGS,
     "amx_product(a, lda, ap, bp, c, M, N, K, ka, a0, kb, b0, by_cols, u0, u1[, pieces]): C's "
     "32-line units [u0, u1) (of columns with by_cols, else of rows) of the exact int32 "
     "product of A and packed B; A packed in ap, or (a not empty) row-major in a with its "
     "last M % 32 rows packed in ap; a packed side of ka (kb) values a line, read from its "
     "chunk a0 (b0) on (ka = K, a0 = 0: the whole packing)."},
    {"amx_levels", py_amx_levels, METH_VARARGS,
     "amx_levels(levels, rowf, colf, out, ldo, rows, cols, M, N, by_cols, u0, u1[, pieces]): "
     "the units' LM-head block from its levels, each (a, lda, ap, bp, K, ka, a0, kb, b0, "
     "shift) as amx_product's operands: T = sum of each level's exact product times "
     "2^shift, out[r, c] (float32, row stride ldo) = (float)((T * rowf[r]) * colf[c]), and "
     "T's sums modulo 2^64 added into each piece's rows (pieces, M) and cols (pieces, N)."},
    {"amx_stream", py_amx_stream, METH_VARARGS,
     "amx_stream([min_bytes]): the smallest result the tile products store by streaming "
     "stores (before this call); min_bytes sets it."},
    {"amx_product_dq", py_amx_product_dq, METH_VARARGS,
     "amx_product_dq(a, lda, ap, bp, rs, cs, out, out_bf16, rows, cols, M, N, K, ka, a0, kb, "
     "b0, by_cols, u0, u1[, pieces]): amx_product's units with open1b_kernels.int8.gemm's "
     "dequantization applied per block in cache (out float32 or bf16 bits) and the guard's "
     "int64 row and column sums added into each piece's rows (pieces, M) and cols (pieces, "
     "N)."},
    {NULL, NULL, 0, NULL},
};
