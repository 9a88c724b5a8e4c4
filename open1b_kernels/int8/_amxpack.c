/* The AMX tile GEMM's packing (open1b_kernels.int8.amxmm.pack): an int8 operand, row-major or
 * a transposed view, copied into the tile panels of _amxlayout.h - A's rows or B's columns,
 * the 64-wide chunks of the contraction in blocks a tile loads whole. */
#include "../core/_ext.h"

#include <string.h>

#include "../core/_amx.h"
#include "../core/_mathfn.h"
#include "_amxlayout.h"

/* Panels packed side by side per 64-wide chunk where the lines are adjacent in memory (a
 * transposed A, or a B side read across its lines): one cache line of a source row serves
 * up to 4 panels, one page many - measured at 1,024 lines x K = 12,288 of a 128,256-wide
 * store (the head's dlogits slices): 1.2-1.3 GB/s one panel at a time, 6.8-7.6 GB/s with 32-128. */
#ifndef PACK_GROUP
#define PACK_GROUP 64
#endif

#if AMX_BUILD
/* 16 x 16 int32: dst row q = column q of src (src rows of 16 words at stride ss words). */
static inline void transpose16x32(const int32_t *src, Py_ssize_t ss, int32_t *dst) {
    for (int c0 = 0; c0 < 16; c0 += 4)
        for (int q0 = 0; q0 < 16; q0 += 4) {
            __m128i a = _mm_loadu_si128((const __m128i *)(src + (c0 + 0) * ss + q0));
            __m128i b = _mm_loadu_si128((const __m128i *)(src + (c0 + 1) * ss + q0));
            __m128i c = _mm_loadu_si128((const __m128i *)(src + (c0 + 2) * ss + q0));
            __m128i d = _mm_loadu_si128((const __m128i *)(src + (c0 + 3) * ss + q0));
            __m128i ab0 = _mm_unpacklo_epi32(a, b), ab1 = _mm_unpackhi_epi32(a, b);
            __m128i cd0 = _mm_unpacklo_epi32(c, d), cd1 = _mm_unpackhi_epi32(c, d);
            _mm_storeu_si128((__m128i *)(dst + (q0 + 0) * 16 + c0), _mm_unpacklo_epi64(ab0, cd0));
            _mm_storeu_si128((__m128i *)(dst + (q0 + 1) * 16 + c0), _mm_unpackhi_epi64(ab0, cd0));
            _mm_storeu_si128((__m128i *)(dst + (q0 + 2) * 16 + c0), _mm_unpacklo_epi64(ab1, cd1));
            _mm_storeu_si128((__m128i *)(dst + (q0 + 3) * 16 + c0), _mm_unpackhi_epi64(ab1, cd1));
        }
}

/* One 1 KiB block of panel lines [l0, l0 + 16) and contraction [k0, k0 + 64): the fast
 * paths for whole blocks, element by element at the edges. */
static void pack_block(const int8_t *x, Py_ssize_t sl, Py_ssize_t sk, int have, int kn,
                       int b_side, Py_ssize_t l0, Py_ssize_t k0, int8_t *blk) {
    const int8_t *base = x + l0 * sl + k0 * sk;
    if (have == LINES && kn == KCHUNK) {
        if (sk == 1 && !b_side) {
            for (int r = 0; r < LINES; r++) memcpy(blk + r * KCHUNK, base + r * sl, KCHUNK);
            return;
        }
        if (sl == 1 && !b_side) {          /* 64 k rows of 16 lines: four 16 x 16 transposes */
            for (int q = 0; q < 4; q++)
                amx_transpose16(base + 16 * q * sk, sk, blk + 16 * q, KCHUNK);
            return;
        }
        if (sk == 1 && (sl & 3) == 0 && ((uintptr_t)base & 3) == 0) {   /* 16 lines of 16 words */
            transpose16x32((const int32_t *)base, sl / 4, (int32_t *)blk);
            return;
        }
        if (sl == 1) {
            for (int q = 0; q < 16; q++) amx_interleave4(base + 4 * q * sk, sk, blk + 64 * q);
            return;
        }
    }
    memset(blk, 0, BLOCK_BYTES);
    for (int l = 0; l < have; l++)
        for (int kk = 0; kk < kn; kk++) {
            int8_t v = base[l * sl + kk * sk];
            if (b_side) blk[(kk >> 2) * 64 + l * 4 + (kk & 3)] = v;
            else blk[l * KCHUNK + kk] = v;
        }
}

/* Panels [p0, p1) of x (int8, `lines` x K, element (l, k) at x[l * sl + k * sk]) packed for
 * the A side (b_side 0: block[r][kk] = x[l0 + r, k0 + kk]) or the B side (1: block[q][c][j]
 * = x[l0 + c, k0 + 4q + j]), zero past the lines and past K. */
static void pack(const int8_t *x, Py_ssize_t sl, Py_ssize_t sk, Py_ssize_t lines, Py_ssize_t K,
                 int b_side, int8_t *out, Py_ssize_t p0, Py_ssize_t p1) {
    Py_ssize_t KP = round_up(K, KCHUNK), chunks = KP / KCHUNK;
    Py_ssize_t group = sl == 1 ? PACK_GROUP : 1;
    for (Py_ssize_t g0 = p0; g0 < p1; g0 += group) {
        Py_ssize_t g1 = g0 + group < p1 ? g0 + group : p1;
        for (Py_ssize_t ch = 0; ch < chunks; ch++) {
            Py_ssize_t k0 = ch * KCHUNK;
            int kn = K - k0 < KCHUNK ? (int)(K - k0) : KCHUNK;
            for (Py_ssize_t p = g0; p < g1; p++) {
                Py_ssize_t l0 = p * LINES;
                int have = lines - l0 < LINES ? (lines - l0 > 0 ? (int)(lines - l0) : 0) : LINES;
                pack_block(x, sl, sk, have, kn, b_side, l0, k0,
                           out + p * LINES * KP + ch * BLOCK_BYTES);
            }
        }
    }
}
#endif

static PyObject *py_amx_pack(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer x, out;
    Py_ssize_t sl, sk, lines, K, u0, u1;
    int b_side, pieces = 1;
    if (!PyArg_ParseTuple(args, "y*w*nnnnpnn|i", &x, &out, &sl, &sk, &lines, &K, &b_side, &u0,
                          &u1, &pieces))
        return NULL;
    Py_ssize_t span = lines > 0 && K > 0 ? (lines - 1) * sl + (K - 1) * sk + 1 : 0;
    int ok = lines >= 1 && K >= 1 && sl >= 1 && sk >= 1 && (sl == 1 || sk == 1) &&
             holds(&x, span, "x") && sized(&out, packed_bytes(lines, K), 1, "out") &&
             units_ok(u0, u1, round_up(lines, 2 * LINES) / LINES) && PIECES_OK(pieces);
#if AMX_BUILD
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        FOR_PIECES(u0, u1, pieces, pack(x.buf, sl, sk, lines, K, b_side, out.buf, p_lo, p_hi));
        Py_END_ALLOW_THREADS
    }
#else
    ok = 0;     /* no packing without the tile loops (a build for another architecture) */
#endif
    return FINISH(ok, "amx_pack: needs the x86-64 build with the AMX loops and consistent "
                      "shapes", &x, &out);
}

static PyObject *py_amx_packed_bytes(PyObject *self, PyObject *args) {
    (void)self;
    Py_ssize_t lines, K;
    if (!PyArg_ParseTuple(args, "nn", &lines, &K)) return NULL;
    return PyLong_FromSsize_t(packed_bytes(lines, K));
}

EXT_METHODS(amxpack) = {
    {"amx_packed_bytes", py_amx_packed_bytes, METH_VARARGS,
     "amx_packed_bytes(lines, K): bytes of a packed operand (lines to 32, K to 64)."},
    {"amx_pack", py_amx_pack, METH_VARARGS,
     "amx_pack(x, out, sl, sk, lines, K, b_side, u0, u1[, pieces]): panels [u0, u1) of 16 "
     "lines of int8 x (element (l, k) at x[l * sl + k * sk]) in the A (b_side False) or B "
     "tile order, zero-padded."},
    {NULL, NULL, 0, NULL},
};
