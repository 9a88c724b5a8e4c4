/* Attention's exact tile products on AMX tiles (open1b_kernels/attention/amx.py): the same
 * values as the float64 products of open1b_kernels/attention/compiled.py, from int8 digits.
 *
 * Every product of attention multiplies fixed-point values N * 2^(E - 147) - N an integer
 * with |N| < 2^21, one exponent E per row of the left operand and one per column of the
 * right (open1b_kernels/attention/fixed.py) - and is rounded once to float32 from its exact
 * value. compiled.py forms that exact value as a float64 matrix product (every partial sum
 * an integer below 2^53 times one power of two); here it is formed from the digits of
 * fixed.py, N = d0 * 2^14 + d1 * 2^7 + d2 (d0 = N >> 14 in [-128, 127], d1 and d2 in
 * [0, 127]): the nine int8 digit products, summed by TDPBSSD in int32 (exact: see
 * open1b_kernels/core/_amx.h), grouped by weight into five sums g_s = sum over a + b = s of
 * [A_a B_b] - each at most 3 * 128 * 2^14 < 2^23 for a contraction of at most 128 -, then
 *     T = (((g0 * 2^7 + g1) * 2^7 + g2) * 2^7 + g3) * 2^7 + g4
 * in float64 (every intermediate an integer below 2^53: exact, fused or not) and
 * T * 2^(Ea - 147) * 2^(Eb - 147) (two exact power-of-two multiplies): the float64 value
 * compiled.py's products give, bit for bit, whatever order either sums in. Its one rounding
 * to float32 and the ordered float32 sums of the tiles are written out as compiled.py's
 * loops write them (_tilesc.c), so the bits are those of the definition
 * (tests/kernels/test_attention_amx.py compares them on windows, GQA, padding, extremes).
 *
 * Layouts (digit blocks of 1 KiB, three per 64-wide chunk of a contraction: d0, d1, d2):
 * an A side (rows of the product, 16 a panel) as [digit][16 rows][64 k]; a B side (columns,
 * 16 a panel) as [digit][16 k-quads][16 columns][4 k] - the tile orders of TDPBSSD. Zeros
 * pad a contraction to a multiple of 64 and rows past the sequence (exponent 1).
 */
#include "../core/_ext.h"

#include <math.h>
#include <string.h>

#include "../core/_mathfn.h"
#include "_fixed.h"
#include "_tileamx.h"

#define EXP_OFFSET 147           /* x = N * 2^(E - 147), open1b_kernels/attention/fixed.py */


#if AMX_BUILD

/* The digits of n bf16 values, value c in the group of exponent E[c] (or e_all where E is
 * NULL): d0, d1, d2 rows of n bytes. Straight lanes (selects, variable shifts): vectorized. */
TILE_TARGET static inline void row_digits(const uint16_t *bits, const int32_t *E, int32_t e_all,
                                          Py_ssize_t n, int8_t *d0, int8_t *d1, int8_t *d2) {
    for (Py_ssize_t c = 0; c < n; c++) {
        int32_t v = fixed_int(bits[c], E ? E[c] : e_all);
        d0[c] = (int8_t)(v >> 14);
        d1[c] = (int8_t)((v >> 7) & 0x7F);
        d2[c] = (int8_t)(v & 0x7F);
    }
}

/* Rows [0, 64) x columns [c0, c0 + 16) of three row-major digit planes (t: 64 x ld bytes,
 * planes `plane` apart) in the B order of one digit triple at dst (lines = the columns,
 * contraction = the rows). */
TILE_TARGET static inline void b_order(const int8_t *t, Py_ssize_t ld, Py_ssize_t plane,
                                       Py_ssize_t c0, int8_t *dst) {
    for (int dg = 0; dg < 3; dg++)
        for (int q = 0; q < 16; q++)
            amx_interleave4(t + dg * plane + 4 * q * ld + c0, ld, dst + dg * 1024 + q * 64);
}

/* The same rows and columns in the A order (lines = the columns, contraction = the rows). */
TILE_TARGET static inline void a_order(const int8_t *t, Py_ssize_t ld, Py_ssize_t plane,
                                       Py_ssize_t c0, int8_t *dst) {
    for (int dg = 0; dg < 3; dg++)
        for (int q = 0; q < 4; q++)
            amx_transpose16(t + dg * plane + 16 * q * ld + c0, ld, dst + dg * 1024 + 16 * q, 64);
}

/* ---------------------------------------------------------------- the operands' digits */

/* Planes [u0, u1) of bf16 x (P, S, D), zero-padded to S_pad rows, as digit triples:
 * - rows (cols 0): groups of one row over D (blocked_rows). Per plane, per 64-row block,
 *   4 panels of 16 rows, each DC = ceil(D / 64) chunks: A side (b_side 0: the queries'
 *   and dO's rows, left of Q K^T and dO V^T) or B side (1: K's and V's rows, right of them).
 *   exps (P, S_pad): each row's E.
 * - cols (cols 1): groups of 64 rows of one column (column_values). Per plane, per block,
 *   D / 16 panels of 16 columns, one chunk (the block's 64 rows): A side (Q's and dO's
 *   columns, left of [dK^T] = Q^T dS and [dV^T] = dO^T P) or B side (K's, right of
 *   dQ = dS K). exps (P, n_blocks, D): each column's E in each block. */
TILE_TARGET static void digit_planes(const uint16_t *x, int8_t *out, int32_t *exps,
                                     Py_ssize_t S, Py_ssize_t S_pad, Py_ssize_t D, int cols,
                                     int b_side, Py_ssize_t u0, Py_ssize_t u1) {
    Py_ssize_t nblk = S_pad / BLK, DC = (D + 63) / 64;
    Py_ssize_t per_block = cols ? (D / 16) * DIG : 4 * DC * DIG;
    int32_t e[256];
    int8_t t[3 * BLK * 256];
    for (Py_ssize_t p = u0; p < u1; p++) {
        const uint16_t *xp = x + p * S * D;
        int8_t *op = out + p * nblk * per_block;
        memset(op, 0, nblk * per_block);
        if (!cols) {
            for (Py_ssize_t r = 0; r < S_pad; r++) {
                int32_t em = 1;
                if (r < S)
                    for (Py_ssize_t d = 0; d < D; d++) {
                        int32_t ex = bf16_expo(xp[r * D + d]);
                        em = ex > em ? ex : em;
                    }
                exps[p * S_pad + r] = em;
                if (r >= S) continue;
                row_digits(xp + r * D, NULL, em, D, t, t + 256, t + 512);
                int8_t *panel = op + (r / BLK) * per_block + ((r % BLK) / 16) * DC * DIG;
                int line = (int)(r % 16);
                for (Py_ssize_t ch = 0; ch < DC; ch++) {
                    Py_ssize_t kn = D - ch * 64 < 64 ? D - ch * 64 : 64;
                    for (int dg = 0; dg < 3; dg++) {
                        int8_t *blk = panel + ch * DIG + dg * 1024;
                        const int8_t *src = t + dg * 256 + ch * 64;
                        if (!b_side) {
                            memcpy(blk + line * 64, src, kn);
                            continue;
                        }
                        for (Py_ssize_t q = 0; q < kn / 4; q++)
                            memcpy(blk + q * 64 + line * 4, src + 4 * q, 4);
                    }
                }
            }
            continue;
        }
        for (Py_ssize_t b = 0; b < nblk; b++) {
            Py_ssize_t r0 = b * BLK, r1 = r0 + BLK < S ? r0 + BLK : S;
            for (Py_ssize_t d = 0; d < D; d++) e[d] = 1;
            for (Py_ssize_t r = r0; r < r1; r++)
                for (Py_ssize_t d = 0; d < D; d++) {
                    int32_t ex = bf16_expo(xp[r * D + d]);
                    e[d] = ex > e[d] ? ex : e[d];
                }
            for (Py_ssize_t d = 0; d < D; d++) exps[(p * nblk + b) * D + d] = e[d];
            Py_ssize_t plane = BLK * D;
            memset(t, 0, 3 * plane);
            for (Py_ssize_t r = r0; r < r1; r++)
                row_digits(xp + r * D, e, 0, D, t + (r - r0) * D, t + plane + (r - r0) * D,
                           t + 2 * plane + (r - r0) * D);
            int8_t *ob = op + b * per_block;
            for (Py_ssize_t dp = 0; dp < D / 16; dp++) {
                if (b_side)
                    b_order(t, D, plane, dp * 16, ob + dp * DIG);
                else
                    a_order(t, D, plane, dp * 16, ob + dp * DIG);
            }
        }
    }
}

/* The five weight groups g (5 x 16 x 16 int32) of one 16 x 16 output tile: A's digit
 * triples at a (a chunk every astep bytes) times B's at b (every bstep), over `chunks`
 * chunks. Tiles 0-4 hold g0..g4, 5 an A digit, 6 and 7 B digits: eight loads for nine
 * products. */
TILE_TARGET static inline void xtile(const int8_t *a, Py_ssize_t astep, const int8_t *b,
                                     Py_ssize_t bstep, Py_ssize_t chunks, int32_t *g) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    _tile_zero(4);
    for (Py_ssize_t ch = 0; ch < chunks; ch++) {
        const int8_t *ac = a + ch * astep, *bc = b + ch * bstep;
        _tile_loadd(5, ac, 64);           /* a0 */
        _tile_loadd(6, bc, 64);           /* b0 */
        _tile_loadd(7, bc + 1024, 64);    /* b1 */
        _tile_dpbssd(0, 5, 6);            /* g0 += a0 b0 */
        _tile_dpbssd(1, 5, 7);            /* g1 += a0 b1 */
        _tile_loadd(6, bc + 2048, 64);    /* b2 */
        _tile_dpbssd(2, 5, 6);            /* g2 += a0 b2 */
        _tile_loadd(5, ac + 1024, 64);    /* a1 */
        _tile_dpbssd(2, 5, 7);            /* g2 += a1 b1 */
        _tile_dpbssd(3, 5, 6);            /* g3 += a1 b2 */
        _tile_loadd(7, bc, 64);           /* b0 */
        _tile_dpbssd(1, 5, 7);            /* g1 += a1 b0 */
        _tile_loadd(5, ac + 2048, 64);    /* a2 */
        _tile_dpbssd(2, 5, 7);            /* g2 += a2 b0 */
        _tile_dpbssd(4, 5, 6);            /* g4 += a2 b2 */
        _tile_loadd(7, bc + 1024, 64);    /* b1 */
        _tile_dpbssd(3, 5, 7);            /* g3 += a2 b1 */
    }
    _tile_stored(0, g, 64);
    _tile_stored(1, g + 256, 64);
    _tile_stored(2, g + 512, 64);
    _tile_stored(3, g + 768, 64);
    _tile_stored(4, g + 1024, 64);
}

enum { STORE_F64, STORE_F32, ADD_F32 };

/* A finished tile waiting for its combine: where its 16 x 16 values go (row stride in
 * elements), how (STORE_F64: the float64 value; STORE_F32: its float32 rounding; ADD_F32:
 * that rounding added to what is there), and its row and column scales 2^(E - 147). */
typedef struct {
    void *out;
    Py_ssize_t stride;
    int mode;
    double sa[16], sb[16];
} pending;

/* Row r's exact values (two halves of 8): h0 = g0 * 2^7 + g1 and h1 = g2 * 2^7 + g3 in
 * int32 (below 2^31 for a contraction of at most 256: |g0| <= 2^14 K, |g1| <= 2 * 2^14 K,
 * |g2| <= 3 * 2^14 K, so |h1| <= (3 * 2^7 + 2) 2^14 * 256 < 2^31), then T = h0 * 2^21 +
 * h1 * 2^7 + g4 in float64 - integers below 2^53, exact, fused or not - times the row's and
 * the columns' scales (exact powers of two). */
TILE_TARGET static inline void row_values(const int32_t *g, int r, __m512d sa, __m512d sb0,
                                          __m512d sb1, __m512d *lo, __m512d *hi) {
    __m512i g0 = _mm512_loadu_si512(g + r * 16), g1 = _mm512_loadu_si512(g + 256 + r * 16);
    __m512i g2 = _mm512_loadu_si512(g + 512 + r * 16), g3 = _mm512_loadu_si512(g + 768 + r * 16);
    __m512i g4 = _mm512_loadu_si512(g + 1024 + r * 16);
    __m512i h0 = _mm512_add_epi32(_mm512_slli_epi32(g0, 7), g1);
    __m512i h1 = _mm512_add_epi32(_mm512_slli_epi32(g2, 7), g3);
    const __m512d c21 = _mm512_set1_pd(2097152.0), c7 = _mm512_set1_pd(128.0);
    __m512d t0 = _mm512_fmadd_pd(_mm512_cvtepi32_pd(_mm512_castsi512_si256(h0)), c21,
                                 _mm512_fmadd_pd(_mm512_cvtepi32_pd(_mm512_castsi512_si256(h1)), c7,
                                                 _mm512_cvtepi32_pd(_mm512_castsi512_si256(g4))));
    __m512d t1 = _mm512_fmadd_pd(
        _mm512_cvtepi32_pd(_mm512_extracti64x4_epi64(h0, 1)), c21,
        _mm512_fmadd_pd(_mm512_cvtepi32_pd(_mm512_extracti64x4_epi64(h1, 1)), c7,
                        _mm512_cvtepi32_pd(_mm512_extracti64x4_epi64(g4, 1))));
    *lo = _mm512_mul_pd(_mm512_mul_pd(t0, sa), sb0);
    *hi = _mm512_mul_pd(_mm512_mul_pd(t1, sa), sb1);
}

/* The tile's values stored as the pending tile says (the float32 rounding: vcvtpd2ps, round
 * to nearest even as the scalar (float) conversion). */
TILE_TARGET static void combine(const int32_t *g, const pending *p) {
    __m512d sb0 = _mm512_loadu_pd(p->sb), sb1 = _mm512_loadu_pd(p->sb + 8), lo, hi;
    for (int r = 0; r < 16; r++) {
        row_values(g, r, _mm512_set1_pd(p->sa[r]), sb0, sb1, &lo, &hi);
        if (p->mode == STORE_F64) {
            double *o = (double *)p->out + r * p->stride;
            _mm512_storeu_pd(o, lo);
            _mm512_storeu_pd(o + 8, hi);
            continue;
        }
        __m512 f = _mm512_insertf32x8(_mm512_castps256_ps512(_mm512_cvtpd_ps(lo)),
                                      _mm512_cvtpd_ps(hi), 1);
        float *o = (float *)p->out + r * p->stride;
        if (p->mode == ADD_F32) f = _mm512_add_ps(_mm512_loadu_ps(o), f);
        _mm512_storeu_ps(o, f);
    }
}

/* Tiles computed one ahead of their combine: the next tile's products run on the tile unit
 * while the vector unit combines the one before (their buffers alternate), and the combines
 * keep the tiles' order - so every running sum adds its tiles in the order they came. */
typedef struct {
    int32_t g[2][5 * 256] __attribute__((aligned(64)));
    pending p[2];
    int cur, waiting;
} pipeline;

/* The pending slot for the tile about to be computed into pl->g[pl->cur]. */
static inline pending *next_slot(pipeline *pl) { return &pl->p[pl->cur]; }

/* After the tile in pl->g[pl->cur] was computed: combine the one before it, if any. */
TILE_TARGET static inline void advance(pipeline *pl) {
    if (pl->waiting) combine(pl->g[pl->cur ^ 1], &pl->p[pl->cur ^ 1]);
    pl->waiting = 1;
    pl->cur ^= 1;
}

TILE_TARGET static inline void drain(pipeline *pl) {
    if (pl->waiting) combine(pl->g[pl->cur ^ 1], &pl->p[pl->cur ^ 1]);
    pl->waiting = 0;
}

static inline void scales(double *dst, const int32_t *e) {
    for (int i = 0; i < 16; i++) dst[i] = pow2d(e[i] - EXP_OFFSET);
}

/* ---------------------------------------------------------------- the forward's scores */

/* The query plane of query head h of KV head bk's group (planes b * Hq + kv * G + h). */
static inline Py_ssize_t q_plane(Py_ssize_t bk, Py_ssize_t h, Py_ssize_t Hkv, Py_ssize_t G) {
    return (bk / Hkv) * Hkv * G + (bk % Hkv) * G + h;
}

/* One 16-row panel of the scores below: rows rr .. rr + 15 of KV head bk's R = G * 64 rows
 * of query block qb (query head rr / 64 of the group, its panel (rr % 64) / 16) against the
 * band of nk key blocks from `first`, through the pipeline into dst (16 rows, ld apart). */
TILE_TARGET static inline void scores_unit(pipeline *pl, const int8_t *qd, const int32_t *eq,
                                           const int8_t *kd, const int32_t *ek, float *dst,
                                           Py_ssize_t ld, Py_ssize_t Hkv, Py_ssize_t G,
                                           Py_ssize_t n_blk, Py_ssize_t qb, Py_ssize_t nk,
                                           Py_ssize_t first, Py_ssize_t DC, Py_ssize_t bk,
                                           Py_ssize_t rr) {
    Py_ssize_t S_pad = n_blk * BLK, panel = DC * DIG, h = rr / BLK, pan = (rr % BLK) / 16;
    Py_ssize_t qp = q_plane(bk, h, Hkv, G);
    const int8_t *a = qd + ((qp * n_blk + qb) * 4 + pan) * panel;
    for (Py_ssize_t kp = 0; kp < nk * 4; kp++) {
        Py_ssize_t key = first * BLK + kp * 16;
        pending *t = next_slot(pl);
        xtile(a, DIG, kd + (bk * n_blk * 4 + key / 16) * panel, DIG, DC, pl->g[pl->cur]);
        t->out = dst + kp * 16;
        t->stride = ld;
        t->mode = STORE_F32;
        scales(t->sa, eq + qp * S_pad + qb * BLK + pan * 16);
        scales(t->sb, ek + bk * S_pad + key);
        advance(pl);
    }
}

/* scores_unit with a pipeline of its own, drained: the panel's scores are in dst on return
 * (the forward's one loop, _tileloops.c). Tiles configured by the caller. */
TILE_TARGET void scores_panel(const int8_t *qd, const int32_t *eq, const int8_t *kd,
                              const int32_t *ek, float *dst, Py_ssize_t ld, Py_ssize_t Hkv,
                              Py_ssize_t G, Py_ssize_t n_blk, Py_ssize_t qb, Py_ssize_t nk,
                              Py_ssize_t first, Py_ssize_t DC, Py_ssize_t bk, Py_ssize_t rr) {
    pipeline pl = {.cur = 0, .waiting = 0};
    scores_unit(&pl, qd, eq, kd, ek, dst, ld, Hkv, G, n_blk, qb, nk, first, DC, bk, rr);
    drain(&pl);
}

/* Rows [u0, u1) of (BK * R) - R = G * 64: the 64 rows of query block qb of each of the G
 * query heads of KV head bk - of the exact scores against a band of nk key blocks from key
 * block `first`, rounded to float32 into s32 (BK, R, nk * 64): compiled.forward's Q K^T as
 * its first use (fwd_rows32) rounds it. qd, eq: the
 * queries' row digits (A side) and exponents of every plane (digit_planes); kd, ek: K's
 * (B side). n_blk 64-row blocks a plane. Units of 16 rows. */
TILE_TARGET static void scores(const int8_t *qd, const int32_t *eq, const int8_t *kd,
                               const int32_t *ek, float *s32, Py_ssize_t Hkv, Py_ssize_t G,
                               Py_ssize_t n_blk, Py_ssize_t qb, Py_ssize_t nk, Py_ssize_t first,
                               Py_ssize_t DC, Py_ssize_t u0, Py_ssize_t u1) {
    pipeline pl = {.cur = 0, .waiting = 0};
    Py_ssize_t R = G * BLK, L = nk * BLK;
    amx_tiles_on();
    for (Py_ssize_t unit = u0; unit < u1; unit++) {
        Py_ssize_t row = unit * 16, bk = row / R, rr = row % R;
        scores_unit(&pl, qd, eq, kd, ek, s32 + (bk * R + rr) * L, L, Hkv, G, n_blk, qb, nk,
                    first, DC, bk, rr);
    }
    drain(&pl);
    _tile_release();
}

/* V's int8 codes (BK, n_blk * 64, D) of KV planes [u0, u1) in the B order of P V: per plane,
 * per key block, D / 16 panels of 16 columns, the block's 64 keys the contraction. */
TILE_TARGET static void value_tiles(const int8_t *v8, int8_t *vb, Py_ssize_t n_blk, Py_ssize_t D,
                                    Py_ssize_t u0, Py_ssize_t u1) {
    for (Py_ssize_t p = u0; p < u1; p++)
        for (Py_ssize_t b = 0; b < n_blk; b++) {
            const int8_t *src = v8 + (p * n_blk + b) * BLK * D;
            int8_t *dst = vb + (p * n_blk + b) * (D / 16) * 1024;
            for (Py_ssize_t dp = 0; dp < D / 16; dp++)
                for (int q = 0; q < 16; q++)
                    amx_interleave4(src + 4 * q * D + dp * 16, D, dst + dp * 1024 + q * 64);
        }
}

/* One 16-row panel of P V: the panel's int8 P (16 rows, 64 apart) times one key block's V
 * codes in the B order (vb: D / 16 tiles of 1 KiB) into o (16 x D float32, D apart).
 * Tiles configured by the caller. */
TILE_TARGET void pv_panel(const int8_t *p8, const int8_t *vb, float *o, Py_ssize_t D) {
    int32_t buf[256] __attribute__((aligned(64)));
    _tile_loadd(2, p8, BLK);
    for (Py_ssize_t dp = 0; dp < D / 16; dp++) {
        _tile_zero(0);
        _tile_loadd(3, vb + dp * 1024, 64);
        _tile_dpbssd(0, 2, 3);
        _tile_stored(0, buf, 64);
        for (int r = 0; r < 16; r++)
            _mm512_storeu_ps(o + r * D + dp * 16,
                             _mm512_cvtepi32_ps(_mm512_load_si512(buf + r * 16)));
    }
}

/* The forward's P V, 16-row units [u0, u1) of (BK, nk, R): ii[bk, j, r, :] = the exact
 * integer sum over the 64 keys of block first + j of p8[bk, j, r, key] * v8[key, :] (one
 * TDPBSSD a 16 x 16 tile: 0..127 times -127..127 over 64 keys, below 2^24), as float32 -
 * the float32 BLAS product of compiled.py, exact in both. */
TILE_TARGET static void pv(const int8_t *p8, const int8_t *vb, float *ii, Py_ssize_t R,
                           Py_ssize_t nk, Py_ssize_t first, Py_ssize_t n_blk, Py_ssize_t D,
                           Py_ssize_t u0, Py_ssize_t u1) {
    Py_ssize_t panels = R / 16;
    amx_tiles_on();
    for (Py_ssize_t unit = u0; unit < u1; unit++) {
        Py_ssize_t rp = unit % panels, bj = unit / panels, bk = bj / nk, j = bj % nk;
        pv_panel(p8 + (bj * R + rp * 16) * BLK, vb + ((bk * n_blk + first + j) * (D / 16)) * 1024,
                 ii + (bj * R + rp * 16) * D, D);
    }
    _tile_release();
}

/* ---------------------------------------------------------------- the backward */

/* Visibility as _tilesc.c's: key col visible from query row iff col <= row, col < seq and
 * col > row - window (no lower bound without a window). */
static inline int32_t seen(int32_t row, int32_t col, int32_t seq, int32_t window) {
    int32_t lower = window > 0 ? row - window : INT32_MIN;
    return (col <= row) & (col < seq) & (col > lower);
}

/* One 64 x 64 tile's exact values, rounded to float32 (as (float)s64 in _tilesc.c): the
 * query rows of plane qp, block qb (A digits ad, exponents ae, per plane) against the keys
 * of block kb of KV plane bk (B digits bd, exponents be), into out (64 x 64) - through the
 * pipeline, whose tiles the caller drains before reading out. */
TILE_TARGET static void tile64(pipeline *pl, const int8_t *ad, const int32_t *ae,
                               const int8_t *bd, const int32_t *be, Py_ssize_t qp, Py_ssize_t bk,
                               Py_ssize_t qb, Py_ssize_t kb, Py_ssize_t n_blk, Py_ssize_t DC,
                               float *out) {
    Py_ssize_t S_pad = n_blk * BLK, panel = DC * DIG;
    for (int kp = 0; kp < 4; kp++) {
        const int8_t *b = bd + (bk * n_blk * 4 + kb * 4 + kp) * panel;
        for (int qpan = 0; qpan < 4; qpan++) {
            pending *t = next_slot(pl);
            xtile(ad + ((qp * n_blk + qb) * 4 + qpan) * panel, DIG, b, DIG, DC, pl->g[pl->cur]);
            t->out = out + qpan * 16 * BLK + kp * 16;
            t->stride = BLK;
            t->mode = STORE_F32;
            scales(t->sa, ae + qp * S_pad + qb * BLK + qpan * 16);
            scales(t->sb, be + bk * S_pad + kb * BLK + kp * 16);
            advance(pl);
        }
    }
}

/* Tiles [u0, u1) of (BK, nk) of one step (query head h of each KV group, query block qb):
 * _tilesc.c's bwd_tiles with S and dP from the tiles (tile64) and the fixed-point values
 * as digits: dsr (BK, nk, 4 panels) ds16's rows (A side, contraction over the tile's keys)
 * with their exponents erow (BK, nk, 64); dsc and pc (BK, nk * 4 panels) ds16's and p16's
 * columns (B side, contraction over the block's query rows) with ecd and ecp (BK, nk * 64). */
TILE_TARGET void bwd_tiles_amx(const int8_t *qd, const int32_t *eq, const int8_t *dod,
                               const int32_t *edo, const int8_t *kd, const int32_t *ek,
                               const int8_t *vd, const int32_t *ev, const float *lse,
                               const float *drow, int8_t *dsr, int32_t *erow,
                               int8_t *dsc, int32_t *ecd, int8_t *pc, int32_t *ecp,
                               Py_ssize_t Hkv, Py_ssize_t G, Py_ssize_t n_blk,
                               Py_ssize_t h, Py_ssize_t qb, Py_ssize_t nk,
                               Py_ssize_t first, Py_ssize_t DC, int32_t seq,
                               int32_t window, float scale, Py_ssize_t u0, Py_ssize_t u1) {
    pipeline pl = {.cur = 0, .waiting = 0};
    float st[BLK * BLK], dpt[BLK * BLK];
    uint16_t p16[BLK * BLK], ds16[BLK * BLK];
    int32_t ecol_p[BLK], ecol_ds[BLK];
    int8_t tc[3 * BLK * BLK], tp[3 * BLK * BLK];
    amx_tiles_on();
    for (Py_ssize_t unit = u0; unit < u1; unit++) {
        Py_ssize_t bk = unit / nk, j = unit % nk, kb = first + j, cb = kb * BLK;
        Py_ssize_t qp = q_plane(bk, h, Hkv, G);
        tile64(&pl, qd, eq, kd, ek, qp, bk, qb, kb, n_blk, DC, st);
        tile64(&pl, dod, edo, vd, ev, qp, bk, qb, kb, n_blk, DC, dpt);
        drain(&pl);
        for (int c = 0; c < BLK; c++) ecol_p[c] = ecol_ds[c] = 1;
        for (int i = 0; i < BLK; i++) {
            int32_t row = (int32_t)(qb * BLK + i), live = row < seq;
            float lse_i = lse[bk * BLK + i], drow_i = drow[bk * BLK + i];
            for (int c = 0; c < BLK; c++) {
                int32_t vis = seen(row, (int32_t)cb + c, seq, window) & live;
                float sv = st[i * BLK + c] * scale;
                float e = exp1(vis ? sv - lse_i : 0.0f);
                float pv = vis ? e : 0.0f;
                float dsv = pv * (dpt[i * BLK + c] - drow_i);
                p16[i * BLK + c] = bf16_rne1(pv);
                ds16[i * BLK + c] = bf16_rne1(dsv);
            }
            for (int c = 0; c < BLK; c++) {
                int32_t ep = bf16_expo(p16[i * BLK + c]), ed = bf16_expo(ds16[i * BLK + c]);
                ecol_p[c] = ep > ecol_p[c] ? ep : ecol_p[c];
                ecol_ds[c] = ed > ecol_ds[c] ? ed : ecol_ds[c];
            }
        }
        int8_t *rblk = dsr + (bk * nk + j) * 4 * DIG;
        for (int i = 0; i < BLK; i++) {
            int32_t er = 1;
            for (int c = 0; c < BLK; c++) {
                int32_t ed = bf16_expo(ds16[i * BLK + c]);
                er = ed > er ? ed : er;
            }
            erow[(bk * nk + j) * BLK + i] = er;
            int8_t *o = rblk + (i / 16) * DIG + (i % 16) * 64;
            row_digits(ds16 + i * BLK, NULL, er, BLK, o, o + 1024, o + 2048);
        }
        for (int c = 0; c < BLK; c++) {
            ecd[bk * nk * BLK + j * BLK + c] = ecol_ds[c];
            ecp[bk * nk * BLK + j * BLK + c] = ecol_p[c];
        }
        for (int i = 0; i < BLK; i++) {
            row_digits(ds16 + i * BLK, ecol_ds, 0, BLK, tc + i * BLK, tc + 4096 + i * BLK,
                       tc + 8192 + i * BLK);
            row_digits(p16 + i * BLK, ecol_p, 0, BLK, tp + i * BLK, tp + 4096 + i * BLK,
                       tp + 8192 + i * BLK);
        }
        int8_t *cblk = dsc + (bk * nk + j) * 4 * DIG, *pblk = pc + (bk * nk + j) * 4 * DIG;
        for (int cp = 0; cp < 4; cp++) {
            b_order(tc, BLK, 4096, cp * 16, cblk + cp * DIG);
            b_order(tp, BLK, 4096, cp * 16, pblk + cp * DIG);
        }
    }
    _tile_release();
}

/* dQ's tiles of one step, rows [u0, u1) in 16-row units of (BK * 64): out[bk, i, :] = 0 +
 * fp32(P_0[i, :]) + fp32(P_1[i, :]) + ... (key blocks ascending), P_j = ds16's tile j (dsr)
 * times K's column values of key block first + j (kc, ekc: B side, digit_planes cols) -
 * _tilesc.c's dq_tiles, the products from the tiles. */
TILE_TARGET void dq_amx(const int8_t *dsr, const int32_t *erow, const int8_t *kc,
                        const int32_t *ekc, float *out, Py_ssize_t nk, Py_ssize_t D,
                        Py_ssize_t n_blk, Py_ssize_t first, Py_ssize_t u0, Py_ssize_t u1) {
    pipeline pl = {.cur = 0, .waiting = 0};
    Py_ssize_t dp = D / 16;
    amx_tiles_on();
    for (Py_ssize_t unit = u0; unit < u1; unit++) {
        Py_ssize_t bk = unit / 4, qpan = unit % 4;
        float *o = out + (bk * BLK + qpan * 16) * D;
        for (Py_ssize_t r = 0; r < 16 * D; r++) o[r] = 0.0f;
        for (Py_ssize_t j = 0; j < nk; j++) {
            const int8_t *a = dsr + ((bk * nk + j) * 4 + qpan) * DIG;
            Py_ssize_t kb = first + j;
            for (Py_ssize_t c0 = 0; c0 < dp; c0++) {
                pending *t = next_slot(&pl);
                xtile(a, DIG, kc + ((bk * n_blk + kb) * dp + c0) * DIG, DIG, 1, pl.g[pl.cur]);
                t->out = o + c0 * 16;
                t->stride = D;
                t->mode = ADD_F32;
                scales(t->sa, erow + (bk * nk + j) * BLK + qpan * 16);
                scales(t->sb, ekc + (bk * n_blk + kb) * D + c0 * 16);
                advance(&pl);
            }
        }
    }
    drain(&pl);
    _tile_release();
}

/* dK's or dV's tiles of one step, rows [u0, u1) in 16-row units of (BK * D): acc[bk, d,
 * offset + key] += fp32(P[bk, d, key]) over the band's L keys, P = the block's Q (or dO)
 * column values transposed (lc, elc: A side, digit_planes cols of the query plane of
 * (bk, h), block qb) times ds16's (or p16's) columns (rc, erc) - _tilesc.c's kv_tiles, the
 * products from the tiles. */
TILE_TARGET void kv_amx(const int8_t *lc, const int32_t *elc, const int8_t *rc,
                        const int32_t *erc, float *acc, Py_ssize_t Hkv, Py_ssize_t G,
                        Py_ssize_t n_blk, Py_ssize_t h, Py_ssize_t qb, Py_ssize_t nk,
                        Py_ssize_t D, Py_ssize_t stride, Py_ssize_t offset,
                        Py_ssize_t u0, Py_ssize_t u1) {
    pipeline pl = {.cur = 0, .waiting = 0};
    Py_ssize_t dp = D / 16, L = nk * BLK;
    amx_tiles_on();
    for (Py_ssize_t unit = u0; unit < u1; unit++) {
        Py_ssize_t bk = unit / dp, dpan = unit % dp, qp = q_plane(bk, h, Hkv, G);
        const int8_t *a = lc + ((qp * n_blk + qb) * dp + dpan) * DIG;
        for (Py_ssize_t kp = 0; kp < L / 16; kp++) {
            pending *t = next_slot(&pl);
            xtile(a, DIG, rc + (bk * L / 16 + kp) * DIG, DIG, 1, pl.g[pl.cur]);
            t->out = acc + (bk * D + dpan * 16) * stride + offset + kp * 16;
            t->stride = stride;
            t->mode = ADD_F32;
            scales(t->sa, elc + (qp * n_blk + qb) * D + dpan * 16);
            scales(t->sb, erc + bk * L + kp * 16);
            advance(&pl);
        }
    }
    drain(&pl);
    _tile_release();
}
#endif

/* ---------------------------------------------------------------- Python wrappers */

static PyObject *py_amx_tiles(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    return PyBool_FromLong(amx_ready());
}

static PyObject *py_digit_planes(PyObject *self, PyObject *args) {
    (void)self;
    int pieces = 1, cols, b_side;
    Py_buffer b[3];
    Py_ssize_t P, S, S_pad, D, u0, u1;
    if (!PyArg_ParseTuple(args, "y*w*w*nnnnppnn|i", &b[0], &b[1], &b[2], &P, &S, &S_pad, &D,
                          &cols, &b_side, &u0, &u1, &pieces))
        return NULL;
    Py_ssize_t nblk = S_pad / BLK, DC = (D + 63) / 64;
    Py_ssize_t per_block = cols ? (D / 16) * DIG : 4 * DC * DIG;
    int ok = P > 0 && S > 0 && D >= 16 && D <= 256 && (D & (D - 1)) == 0 && S <= S_pad &&
             S_pad % BLK == 0 && sized(&b[0], P * S * D, 2, "x") &&
             sized(&b[1], P * nblk * per_block, 1, "out") &&
             sized(&b[2], cols ? P * nblk * D : P * S_pad, 4, "exps") && units_ok(u0, u1, P) &&
             PIECES_OK(pieces);
    ok = ok && amx_ready();
#if AMX_BUILD
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        FOR_PIECES(u0, u1, pieces, digit_planes(b[0].buf, b[1].buf, b[2].buf, S, S_pad, D, cols,
                                                b_side, p_lo, p_hi));
        Py_END_ALLOW_THREADS
    }
#endif
    return finish(b, 3, ok, "digit_planes: inconsistent shapes");
}

static PyObject *py_amx_scores(PyObject *self, PyObject *args) {
    (void)self;
    int pieces = 1;
    Py_buffer b[5];
    Py_ssize_t BK, Hkv, G, n_blk, qb, nk, first, D, u0, u1;
    if (!PyArg_ParseTuple(args, "y*y*y*y*w*nnnnnnnnnn|i", &b[0], &b[1], &b[2], &b[3], &b[4], &BK,
                          &Hkv, &G, &n_blk, &qb, &nk, &first, &D, &u0, &u1, &pieces))
        return NULL;
    Py_ssize_t DC = (D + 63) / 64, R = G * BLK;
    int ok = amx_ready() && BK > 0 && Hkv > 0 && BK % Hkv == 0 && G > 0 && n_blk > 0 &&
             0 <= qb && qb < n_blk && nk > 0 && first >= 0 && first + nk <= n_blk && D >= 16 &&
             D <= 256 && sized(&b[0], BK * G * n_blk * 4 * DC * DIG, 1, "qd") &&
             sized(&b[1], BK * G * n_blk * BLK, 4, "eq") &&
             sized(&b[2], BK * n_blk * 4 * DC * DIG, 1, "kd") &&
             sized(&b[3], BK * n_blk * BLK, 4, "ek") &&
             sized(&b[4], BK * R * nk * BLK, 4, "s32") && units_ok(u0, u1, BK * R / 16) &&
             PIECES_OK(pieces);
#if AMX_BUILD
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        FOR_PIECES(u0, u1, pieces, scores(b[0].buf, b[1].buf, b[2].buf, b[3].buf, b[4].buf, Hkv, G,
                                          n_blk, qb, nk, first, DC, p_lo, p_hi));
        Py_END_ALLOW_THREADS
    }
#endif
    return finish(b, 5, ok, "amx_scores: needs AMX tiles and consistent shapes");
}

static PyObject *py_amx_bwd_tiles(PyObject *self, PyObject *args) {
    (void)self;
    int pieces = 1;
    Py_buffer b[16];
    Py_ssize_t BK, Hkv, G, n_blk, h, qb, nk, first, D, seq, window, u0, u1;
    double scale;
    if (!PyArg_ParseTuple(args, "y*y*y*y*y*y*y*y*y*y*w*w*w*w*w*w*nnnnnnnnnnndnn|i", &b[0], &b[1],
                          &b[2], &b[3], &b[4], &b[5], &b[6], &b[7], &b[8], &b[9], &b[10], &b[11],
                          &b[12], &b[13], &b[14], &b[15], &BK, &Hkv, &G, &n_blk, &h, &qb, &nk,
                          &first, &D, &seq, &window, &scale, &u0, &u1, &pieces))
        return NULL;
    Py_ssize_t DC = (D + 63) / 64, S_pad = n_blk * BLK, P = BK * G;
    int ok = amx_ready() && BK > 0 && Hkv > 0 && BK % Hkv == 0 && G > 0 && 0 <= h && h < G &&
             0 <= qb && qb < n_blk && nk > 0 && first >= 0 && first + nk <= n_blk && D >= 16 &&
             D <= 256 && seq > 0 && seq <= S_pad && window >= 0 && window < INT32_MAX &&
             S_pad < INT32_MAX && sized(&b[0], P * n_blk * 4 * DC * DIG, 1, "qd") &&
             sized(&b[1], P * S_pad, 4, "eq") && sized(&b[2], P * n_blk * 4 * DC * DIG, 1, "dod") &&
             sized(&b[3], P * S_pad, 4, "edo") && sized(&b[4], BK * n_blk * 4 * DC * DIG, 1, "kd") &&
             sized(&b[5], BK * S_pad, 4, "ek") && sized(&b[6], BK * n_blk * 4 * DC * DIG, 1, "vd") &&
             sized(&b[7], BK * S_pad, 4, "ev") && sized(&b[8], BK * BLK, 4, "lse") &&
             sized(&b[9], BK * BLK, 4, "drow") && sized(&b[10], BK * nk * 4 * DIG, 1, "dsr") &&
             sized(&b[11], BK * nk * BLK, 4, "erow") && sized(&b[12], BK * nk * 4 * DIG, 1, "dsc") &&
             sized(&b[13], BK * nk * BLK, 4, "ecd") && sized(&b[14], BK * nk * 4 * DIG, 1, "pc") &&
             sized(&b[15], BK * nk * BLK, 4, "ecp") && units_ok(u0, u1, BK * nk) &&
             PIECES_OK(pieces);
#if AMX_BUILD
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        FOR_PIECES(u0, u1, pieces, bwd_tiles_amx(b[0].buf, b[1].buf, b[2].buf, b[3].buf, b[4].buf,
                                                 b[5].buf, b[6].buf, b[7].buf, b[8].buf, b[9].buf,
                                                 b[10].buf, b[11].buf, b[12].buf, b[13].buf,
                                                 b[14].buf, b[15].buf, Hkv, G, n_blk, h, qb, nk,
                                                 first, DC, (int32_t)seq, (int32_t)window,
                                                 (float)scale, p_lo, p_hi));
        Py_END_ALLOW_THREADS
    }
#endif
    return finish(b, 16, ok, "amx_bwd_tiles: needs AMX tiles and consistent shapes");
}

static PyObject *py_amx_dq(PyObject *self, PyObject *args) {
    (void)self;
    int pieces = 1;
    Py_buffer b[5];
    Py_ssize_t BK, nk, D, n_blk, first, u0, u1;
    if (!PyArg_ParseTuple(args, "y*y*y*y*w*nnnnnnn|i", &b[0], &b[1], &b[2], &b[3], &b[4], &BK, &nk,
                          &D, &n_blk, &first, &u0, &u1, &pieces))
        return NULL;
    int ok = amx_ready() && BK > 0 && nk > 0 && D >= 16 && D <= 256 && D % 16 == 0 &&
             first >= 0 && first + nk <= n_blk && sized(&b[0], BK * nk * 4 * DIG, 1, "dsr") &&
             sized(&b[1], BK * nk * BLK, 4, "erow") &&
             sized(&b[2], BK * n_blk * (D / 16) * DIG, 1, "kc") &&
             sized(&b[3], BK * n_blk * D, 4, "ekc") && sized(&b[4], BK * BLK * D, 4, "out") &&
             units_ok(u0, u1, BK * 4) && PIECES_OK(pieces);
#if AMX_BUILD
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        FOR_PIECES(u0, u1, pieces, dq_amx(b[0].buf, b[1].buf, b[2].buf, b[3].buf, b[4].buf, nk, D,
                                          n_blk, first, p_lo, p_hi));
        Py_END_ALLOW_THREADS
    }
#endif
    return finish(b, 5, ok, "amx_dq: needs AMX tiles and consistent shapes");
}

static PyObject *py_amx_kv(PyObject *self, PyObject *args) {
    (void)self;
    int pieces = 1;
    Py_buffer b[5];
    Py_ssize_t BK, Hkv, G, n_blk, h, qb, nk, D, stride, offset, u0, u1;
    if (!PyArg_ParseTuple(args, "y*y*y*y*w*nnnnnnnnnnnn|i", &b[0], &b[1], &b[2], &b[3], &b[4], &BK,
                          &Hkv, &G, &n_blk, &h, &qb, &nk, &D, &stride, &offset, &u0, &u1,
                          &pieces))
        return NULL;
    Py_ssize_t P = BK * G, L = nk * BLK;
    int ok = amx_ready() && BK > 0 && Hkv > 0 && BK % Hkv == 0 && G > 0 && 0 <= h && h < G &&
             0 <= qb && qb < n_blk && nk > 0 && D >= 16 && D <= 256 && D % 16 == 0 &&
             offset >= 0 && offset + L <= stride &&
             sized(&b[0], P * n_blk * (D / 16) * DIG, 1, "lc") &&
             sized(&b[1], P * n_blk * D, 4, "elc") && sized(&b[2], BK * (L / 16) * DIG, 1, "rc") &&
             sized(&b[3], BK * L, 4, "erc") && sized(&b[4], BK * D * stride, 4, "acc") &&
             units_ok(u0, u1, BK * (D / 16)) && PIECES_OK(pieces);
#if AMX_BUILD
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        FOR_PIECES(u0, u1, pieces, kv_amx(b[0].buf, b[1].buf, b[2].buf, b[3].buf, b[4].buf, Hkv, G,
                                          n_blk, h, qb, nk, D, stride, offset, p_lo, p_hi));
        Py_END_ALLOW_THREADS
    }
#endif
    return finish(b, 5, ok, "amx_kv: needs AMX tiles and consistent shapes");
}

static PyObject *py_amx_value_tiles(PyObject *self, PyObject *args) {
    (void)self;
    int pieces = 1;
    Py_buffer b[2];
    Py_ssize_t BK, n_blk, D, u0, u1;
    if (!PyArg_ParseTuple(args, "y*w*nnnnn|i", &b[0], &b[1], &BK, &n_blk, &D, &u0, &u1, &pieces))
        return NULL;
    int ok = amx_ready() && BK > 0 && n_blk > 0 && D >= 16 && D <= 256 && D % 16 == 0 &&
             sized(&b[0], BK * n_blk * BLK * D, 1, "v8") && sized(&b[1], BK * n_blk * BLK * D, 1, "vb") &&
             units_ok(u0, u1, BK) && PIECES_OK(pieces);
#if AMX_BUILD
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        FOR_PIECES(u0, u1, pieces, value_tiles(b[0].buf, b[1].buf, n_blk, D, p_lo, p_hi));
        Py_END_ALLOW_THREADS
    }
#endif
    return finish(b, 2, ok, "amx_value_tiles: needs AMX tiles and consistent shapes");
}

static PyObject *py_amx_pv(PyObject *self, PyObject *args) {
    (void)self;
    int pieces = 1;
    Py_buffer b[3];
    Py_ssize_t BK, R, nk, first, n_blk, D, u0, u1;
    if (!PyArg_ParseTuple(args, "y*y*w*nnnnnnnn|i", &b[0], &b[1], &b[2], &BK, &R, &nk, &first,
                          &n_blk, &D, &u0, &u1, &pieces))
        return NULL;
    int ok = amx_ready() && BK > 0 && R > 0 && R % 16 == 0 && nk > 0 && first >= 0 &&
             first + nk <= n_blk && D >= 16 && D <= 256 && D % 16 == 0 &&
             sized(&b[0], BK * nk * R * BLK, 1, "p8") && sized(&b[1], BK * n_blk * BLK * D, 1, "vb") &&
             sized(&b[2], BK * nk * R * D, 4, "ii") && units_ok(u0, u1, BK * nk * R / 16) &&
             PIECES_OK(pieces);
#if AMX_BUILD
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        FOR_PIECES(u0, u1, pieces, pv(b[0].buf, b[1].buf, b[2].buf, R, nk, first, n_blk, D, p_lo,
                                      p_hi));
        Py_END_ALLOW_THREADS
    }
#endif
    return finish(b, 3, ok, "amx_pv: needs AMX tiles and consistent shapes");
}

EXT_METHODS(tileamx) = {
    {"amx_tiles", py_amx_tiles, METH_NOARGS,
     "amx_tiles(): whether this process runs AMX-INT8 tiles (open1b_kernels/core/_amx.h)."},
    {"digit_planes", py_digit_planes, METH_VARARGS,
     "digit_planes(x, out, exps, P, S, S_pad, D, cols, b_side, u0, u1[, pieces]): the "
     "fixed-point digits of bf16 planes [u0, u1), by rows or by 64-row column groups, in the "
     "A or B tile order."},
    {"amx_scores", py_amx_scores, METH_VARARGS,
     "amx_scores(qd, eq, kd, ek, s32, BK, Hkv, G, n_blk, qb, nk, first, D, u0, u1[, pieces]): "
     "the forward's exact scores of query block qb against its band, rounded to float32, "
     "16-row units."},
    {"amx_value_tiles", py_amx_value_tiles, METH_VARARGS,
     "amx_value_tiles(v8, vb, BK, n_blk, D, u0, u1[, pieces]): V's int8 codes (BK, n_blk * 64,"
     " D) in the B order of P V (lines = D, contraction = a block's keys), KV planes [u0, u1)."},
    {"amx_pv", py_amx_pv, METH_VARARGS,
     "amx_pv(p8, vb, ii, BK, R, nk, first, n_blk, D, u0, u1[, pieces]): the forward's P V "
     "tile products (int8 P (BK, nk, R, 64) by V's codes, exact) as float32 ii (BK, nk, R, D)"
     ", 16-row units of (BK * nk * R)."},
    {"amx_bwd_tiles", py_amx_bwd_tiles, METH_VARARGS,
     "amx_bwd_tiles(qd, eq, dod, edo, kd, ek, vd, ev, lse, drow, dsr, erow, dsc, ecd, pc, ecp, "
     "BK, Hkv, G, n_blk, h, qb, nk, first, D, seq, window, scale, u0, u1[, pieces]): the "
     "backward's p and ds of one step's tiles (BK, nk), as digits."},
    {"amx_dq", py_amx_dq, METH_VARARGS,
     "amx_dq(dsr, erow, kc, ekc, out, BK, nk, D, n_blk, first, u0, u1[, pieces]): dQ's tile "
     "products of one step and their ordered float32 sum, 16-row units of (BK * 64)."},
    {"amx_kv", py_amx_kv, METH_VARARGS,
     "amx_kv(lc, elc, rc, erc, acc, BK, Hkv, G, n_blk, h, qb, nk, D, stride, offset, u0, u1"
     "[, pieces]): dK^T's or dV^T's tile products added to their running sums, 16-row units "
     "of (BK * D)."},
    {NULL, NULL, 0, NULL},
};
