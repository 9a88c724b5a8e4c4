/* open1b_kernels.attention._tilesc: compiled tile loops of attention's CPU reference (same bits).
 *
 * open1b_kernels/attention/forward.py and backward.py hold the definition (and the Triton kernels
 * follow it step for step). open1b_kernels/attention/compiled.py runs the same arithmetic with the
 * matrix products in torch's BLAS (exact in any order: see open1b_kernels/attention/fixed.py) and
 * everything between them here: the scores' rounding and scale, the masks, the online
 * softmax, P's int8 quantization, the accumulator, p and ds of the backward, their bf16
 * rounding and fixed-point values, and the ordered sums of tile products. These are
 * elementwise float32 operations, evaluated one IEEE operation at a time in the order of the
 * torch code (-ffp-contract=off, no -ffast-math: setup.py), plus maxima and integer and bit
 * operations, so the bits are the torch code's - tests/kernels/test_attention_compiled.py
 * compares them. What it removes is torch's one pass over memory per operation and the
 * gathers of the band-position loop.
 *
 * Each function works on units [u0, u1) (a row or a tile), independent of each other, so
 * the caller may split the units across threads: the result does not depend on the split.
 */
#include "../core/_ext.h"

#include <math.h>
#include <string.h>

#include "../core/_mathfn.h"
#include "_fixed.h"
#include "_online.h"
#include "_tileamx.h"

static const float RNE_MAGIC = 12582912.0f;  /* 1.5 * 2^23 */
static const int32_t P_EXP_CAP = 126;

/* Positions as int32 (sequences are far below 2^31) and & instead of &&: no branches, so
 * the lane loops vectorize. Key col is visible from query row iff col <= row, col < seq and
 * col > first(row) = row - window (no lower bound without a window). */
static inline int32_t lower_bound(int32_t row, int32_t window) {
    return window > 0 ? row - window : INT32_MIN;
}

static inline int32_t visible(int32_t row, int32_t col, int32_t seq, int32_t lower) {
    return (col <= row) & (col < seq) & (col > lower);
}

static inline int32_t expo_f32(float x) { return (int32_t)((to_bits(x) >> 23) & 0xFF); }

/* The pairwise tree of open1b_kernels.core.reduce over 64 values (s[i] = s[2i] + s[2i+1]). */
static inline float tree64(const float *x) {
    float s[BLK];
    for (int i = 0; i < BLK / 2; i++) s[i] = x[2 * i] + x[2 * i + 1];
    for (int n = BLK / 4; n >= 1; n /= 2)
        for (int i = 0; i < n; i++) s[i] = s[2 * i] + s[2 * i + 1];
    return s[0];
}

/* The scan m = x[c] > m ? x[c] : m over 64 values from m0 (c ascending), by 16 lanes: the
 * same value. The scan skips NaNs and keeps the first of equal values; values that compare
 * equal have the same bits but for a zero's sign, so every order yields the scan's value
 * except where the maximum is a zero that replaced a negative m0: then the scan keeps the
 * first zero in order, taken here from x. Written as lanes because GCC leaves the scan's
 * chain of scalar maxima (each reading back a vector just stored) unvectorized without
 * -ffast-math: half of the forward's softmax pass (perf, AMX Xeon). */
static inline float scan_max64(const float *x, float m0) {
    float acc[16];
    for (int l = 0; l < 16; l++) acc[l] = m0;
    for (int c = 0; c < BLK; c += 16)
        for (int l = 0; l < 16; l++) acc[l] = x[c + l] > acc[l] ? x[c + l] : acc[l];
    for (int h = 8; h >= 1; h /= 2)
        for (int l = 0; l < h; l++) acc[l] = acc[l + h] > acc[l] ? acc[l + h] : acc[l];
    if (acc[0] == 0.0f && m0 < 0.0f)
        for (int c = 0; c < BLK; c++)
            if (x[c] == 0.0f) return x[c];
    return acc[0];
}

static inline float bf16_value(uint16_t bits) { return from_bits((uint32_t)bits << 16); }

/* fixed_values of open1b_kernels.attention.fixed for a value x (bf16) of a group whose largest
 * effective exponent is e: trunc(x * 2^(147 - e)) * 2^(e - 147), exact in float64. */
static inline double fixed_value(uint16_t bits, int32_t e) {
    return trunc((double)bf16_value(bits) * pow2d(147 - e)) * pow2d(e - 147);
}

/* The loops below are written as straight passes over 64 lanes (selects, no early exits)
 * so the compiler vectorizes them; on x86-64 GCC also builds AVX2 and AVX-512 clones, the
 * same IEEE operations on wider registers (FMA stays off), picked at load time. */

/* Forward, one query block's band for rows [u0, u1) of (BK, R): the online softmax over nk
 * key blocks from key `col0`, as forward_reference's loop body. s (BK, R, nk*64) the exact
 * products: float64 (s_f32 0), or their float32 roundings (1: the AMX products,
 * open1b_kernels/attention/_tileamx.c, where the first operation below is that rounding);
 * u (BK, ustride) int32 V row exponents. Out: p8 (BK, nk, R, 64) in the layout of the P V
 * product, float32 (p_i8 0) or int8 (1: the integers 0..127 themselves, for the tiles),
 * alpha and t (BK, R, nk), m and l (BK, R). */
static inline __attribute__((always_inline)) void
fwd_rows_body(const void *s, const int s_f32, const int32_t *u, void *p8, const int p_i8,
              float *alpha, int32_t *t, float *m_out, float *l_out, Py_ssize_t R, Py_ssize_t nk,
              Py_ssize_t ustride, Py_ssize_t col0, Py_ssize_t row0, int32_t seq, int32_t window,
              float scale, Py_ssize_t u0, Py_ssize_t u1) {
    Py_ssize_t L = nk * BLK;
    for (Py_ssize_t unit = u0; unit < u1; unit++) {
        Py_ssize_t bk = unit / R, r = unit % R;
        int32_t row = (int32_t)(row0 + r % BLK);
        const double *srow = (const double *)s + unit * L;
        const float *srow32 = (const float *)s + unit * L;
        const int32_t *urow = u + bk * ustride;
        float m = -INFINITY, l = 0.0f;
        for (Py_ssize_t j = 0; j < nk; j++) {
            float sc[BLK], p[BLK], pu[BLK];
            int32_t vis[BLK];
            Py_ssize_t cb = col0 + j * BLK;
            const double *sj = srow + j * BLK;
            const float *sj32 = srow32 + j * BLK;
            const int32_t *uj = urow + cb;
            int32_t lower = lower_bound(row, window), c0 = (int32_t)cb;
            for (int c = 0; c < BLK; c++) vis[c] = visible(row, c0 + c, seq, lower);
            for (int c = 0; c < BLK; c++) {
                float x = (s_f32 ? sj32[c] : (float)sj[c]) * scale;
                sc[c] = vis[c] ? x : -INFINITY;
            }
            float rowmax = scan_max64(sc, -INFINITY);
            float m_new = m > rowmax ? m : rowmax;
            float a = m == m_new ? 1.0f : (m == -INFINITY ? 0.0f : exp1(m - m_new));
            for (int c = 0; c < BLK; c++) {  /* exp of 0 - 0 on masked lanes, as the torch code */
                float e = exp1(vis[c] ? sc[c] - m_new : 0.0f);
                p[c] = vis[c] ? e : 0.0f;
            }
            for (int c = 0; c < BLK; c++) pu[c] = p[c] * pow2i(-uj[c]);
            float pmax = scan_max64(pu, 0.0f);
            int32_t tt = 133 - expo_f32(pmax);
            tt = tt > P_EXP_CAP ? P_EXP_CAP : tt;
            float up = pow2i(tt);
            Py_ssize_t at = ((bk * nk + j) * R + r) * BLK;
            for (int c = 0; c < BLK; c++) {
                float q = (pu[c] * up + RNE_MAGIC) - RNE_MAGIC;
                q = q > 127.0f ? 127.0f : q;
                if (p_i8)
                    ((int8_t *)p8)[at + c] = (int8_t)q;
                else
                    ((float *)p8)[at + c] = q;
            }
            l = l * a + tree64(p);
            alpha[unit * nk + j] = a;
            t[unit * nk + j] = tt;
            m = m_new;
        }
        m_out[unit] = m;
        l_out[unit] = l;
    }
}

CLONES static void fwd_rows(const double *s64, const int32_t *u, float *p8, float *alpha,
                            int32_t *t, float *m_out, float *l_out, Py_ssize_t R, Py_ssize_t nk,
                            Py_ssize_t ustride, Py_ssize_t col0, Py_ssize_t row0, int32_t seq,
                            int32_t window, float scale, Py_ssize_t u0, Py_ssize_t u1) {
    fwd_rows_body(s64, 0, u, p8, 0, alpha, t, m_out, l_out, R, nk, ustride, col0, row0, seq,
                  window, scale, u0, u1);
}

CLONES static void fwd_rows_i8(const double *s64, const int32_t *u, int8_t *p8, float *alpha,
                               int32_t *t, float *m_out, float *l_out, Py_ssize_t R,
                               Py_ssize_t nk, Py_ssize_t ustride, Py_ssize_t col0,
                               Py_ssize_t row0, int32_t seq, int32_t window, float scale,
                               Py_ssize_t u0, Py_ssize_t u1) {
    fwd_rows_body(s64, 0, u, p8, 1, alpha, t, m_out, l_out, R, nk, ustride, col0, row0, seq,
                  window, scale, u0, u1);
}

CLONES void fwd_rows32(const float *s32, const int32_t *u, int8_t *p8, float *alpha, int32_t *t,
                       float *m_out, float *l_out, Py_ssize_t R, Py_ssize_t nk,
                       Py_ssize_t ustride, Py_ssize_t col0, Py_ssize_t row0, int32_t seq,
                       int32_t window, float scale, Py_ssize_t u0, Py_ssize_t u1) {
    fwd_rows_body(s32, 1, u, p8, 1, alpha, t, m_out, l_out, R, nk, ustride, col0, row0, seq,
                  window, scale, u0, u1);
}

/* Forward, the accumulator of rows [u0, u1): acc = acc * alpha + I * 2^-t over the key
 * blocks ascending, then out = acc / l and lse = m + log(l). I (BK, nk, R, D) float32. */
CLONES void fwd_acc(const float *ii, const float *alpha, const int32_t *t, const float *m,
                    const float *l, float *out, float *lse, Py_ssize_t R, Py_ssize_t nk,
                    Py_ssize_t D, Py_ssize_t u0, Py_ssize_t u1) {
    for (Py_ssize_t unit = u0; unit < u1; unit++) {
        Py_ssize_t bk = unit / R, r = unit % R;
        float *acc = out + unit * D;
        for (Py_ssize_t d = 0; d < D; d++) acc[d] = 0.0f;
        for (Py_ssize_t j = 0; j < nk; j++)
            online_add(acc, ii + ((bk * nk + j) * R + r) * D, alpha[unit * nk + j],
                       t[unit * nk + j], D);
        lse[unit] = online_finish(acc, l[unit], m[unit], D);
    }
}

/* Backward, tiles [u0, u1) of (BK, nk) for one query block of one head per KV head: p, ds
 * and their bf16 roundings as backward_reference's _probs_and_ds, then the fixed-point
 * values the three gradient products take. s64, dp64 (BK, 64, L = nk*64) float64; lse,
 * drow (BK, 64). Out (float64): dsr (BK, nk, 64 q, 64 k), ds16's tile rows (one exponent
 * per query row of a tile); dsc and pc (BK, 64 q, L), ds16's and p16's values with one
 * exponent per key column of a tile (the groups of the dK and dV products). */
CLONES static void bwd_tiles(const double *s64, const double *dp64, const float *lse,
                             const float *drow, double *dsr, double *dsc, double *pc,
                             Py_ssize_t nk, Py_ssize_t col0, Py_ssize_t row0, int32_t seq,
                             int32_t window, float scale, Py_ssize_t u0, Py_ssize_t u1) {
    Py_ssize_t L = nk * BLK;
    uint16_t p16[BLK * BLK], ds16[BLK * BLK];
    int32_t ecol_p[BLK], ecol_ds[BLK];
    for (Py_ssize_t unit = u0; unit < u1; unit++) {
        Py_ssize_t bk = unit / nk, j = unit % nk, cb = col0 + j * BLK;
        for (int c = 0; c < BLK; c++) ecol_p[c] = ecol_ds[c] = 1;
        for (int i = 0; i < BLK; i++) {
            int32_t row = (int32_t)(row0 + i);
            const double *srow = s64 + (bk * BLK + i) * L + j * BLK;
            const double *dprow = dp64 + (bk * BLK + i) * L + j * BLK;
            float lse_i = lse[bk * BLK + i], drow_i = drow[bk * BLK + i];
            uint16_t *pi = p16 + i * BLK, *di = ds16 + i * BLK;
            int32_t lower = lower_bound(row, window), c0 = (int32_t)cb, live = row < seq;
            for (int c = 0; c < BLK; c++) {
                int32_t vis = visible(row, c0 + c, seq, lower) & live;
                float s = (float)srow[c] * scale;
                float e = exp1(vis ? s - lse_i : 0.0f);
                float pv = vis ? e : 0.0f;
                float dsv = pv * ((float)dprow[c] - drow_i);
                pi[c] = bf16_rne1(pv);
                di[c] = bf16_rne1(dsv);
            }
            for (int c = 0; c < BLK; c++) {
                int32_t ep = bf16_expo(pi[c]), ed = bf16_expo(di[c]);
                ecol_p[c] = ep > ecol_p[c] ? ep : ecol_p[c];
                ecol_ds[c] = ed > ecol_ds[c] ? ed : ecol_ds[c];
            }
        }
        double *r_out = dsr + unit * BLK * BLK;
        for (int i = 0; i < BLK; i++) {
            const uint16_t *di = ds16 + i * BLK;
            int32_t erow = 1;
            for (int c = 0; c < BLK; c++) {
                int32_t ed = bf16_expo(di[c]);
                erow = ed > erow ? ed : erow;
            }
            double *ro = r_out + i * BLK;
            for (int c = 0; c < BLK; c++) ro[c] = fixed_value(di[c], erow);
        }
        /* by query rows, each value in its key column's group: the right operands of
         * dK^T = Q^T dS and dV^T = dO^T P (whose (D, L) products the BLAS runs ~1.5-2x
         * faster than the (L, D) ones, K = 64 either way) */
        for (int i = 0; i < BLK; i++) {
            double *co = dsc + (bk * BLK + i) * L + j * BLK;
            double *po = pc + (bk * BLK + i) * L + j * BLK;
            for (int c = 0; c < BLK; c++) co[c] = fixed_value(ds16[i * BLK + c], ecol_ds[c]);
            for (int c = 0; c < BLK; c++) po[c] = fixed_value(p16[i * BLK + c], ecol_p[c]);
        }
    }
}

/* dQ's tiles of one query block, multiplied and summed in one pass: for rows [u0, u1) of
 * (BK * 64), out[b, i, :] = 0 + fp32(P_0[i, :]) + fp32(P_1[i, :]) + ... (key blocks
 * ascending) with P_j = dsr[b, j] (64 x 64) @ kc[b, first + j] (64 x D), the tile products
 * of backward_reference's dQ, without them reaching memory as float64. Each P_j is a sum of products of fixed-point values, every partial sum
 * an integer below 2^53 times one power of two (open1b_kernels/attention/fixed.py), so it
 * is exact in any order, fused multiply-adds included; only its one rounding to float32
 * and the ordered float32 sum are specified, and those are written out here. The products
 * run in register blocks sized for the CPU (_tilemm.h; the batched BLAS calls ran these
 * 64 x 64 x D products at ~30 GFLOP/s on a 2-core Zen 4). D % 16 == 0 (checked). */
/* dK's or dV's tiles of one query block, multiplied and added in one pass: for rows
 * [u0, u1) of (BK * D), acc[b, d, offset + c] = acc[...] + fp32(P[b, d, c]) with
 * P[b] = lhs[b]^T (D x 64) @ rhs[b] (64 x L): the transposed tile products [dS^T Q]^T or
 * [P^T dO]^T of a band of L keys (lhs: Q's or dO's column values (BK, 64, D), rhs: dS's or
 * P's (BK, 64, L)), each element rounded once and added to its running sum, as
 * backward_reference orders them. Exact in any order (dq_tiles' argument); the same
 * register blocks; L % 16 == 0 and D % 8 == 0 (checked). */
/* Both loops exist in three copies (_tilemm.h, included once per copy), each with a
 * register block that fits its CPU's vector registers: x86-64-v4 (32 zmm: 8 rows x 16
 * columns), x86-64-v3 (16 ymm and FMA: 6 rows x 8 columns) and a baseline (16 xmm: 4 rows
 * x 4 columns). One body compiled for all three by target_clones, as before, gave the AVX2
 * copy an 8 x 16 block of 32 ymm accumulators that spilled on every step: dq_tiles and
 * kv_tiles ran ~20x slower on a Zen 3 than on a Zen 4. The sums are exact in any order,
 * so the block shape never changes a bit. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define TM_SUFFIX v4
#define TM_TARGET __attribute__((target("arch=x86-64-v4"), optimize("fp-contract=fast")))
#define TM_LANES 8
#define TM_ROWS 8
#include "_tilemm.h"
#define TM_SUFFIX v3
#define TM_TARGET __attribute__((target("arch=x86-64-v3"), optimize("fp-contract=fast")))
#define TM_LANES 4
#define TM_ROWS 6
#include "_tilemm.h"
#endif
#define TM_SUFFIX base
#define TM_TARGET __attribute__((optimize("fp-contract=fast")))
#define TM_LANES 2
#define TM_ROWS 4
#include "_tilemm.h"

static int tile_level_now = -1;  /* the copy in use; tile_level(n) lowers it for the tests */

static int tile_level(void) {
    if (tile_level_now < 0) tile_level_now = cpu_level();  /* the highest copy this CPU runs */
    return tile_level_now;
}

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define TILE_COPY(name) \
    (tile_level() == 2 ? name##_v4 : tile_level() == 1 ? name##_v3 : name##_base)
#else
#define TILE_COPY(name) name##_base
#endif

static void dq_tiles(const double *dsr, const double *kc, float *out, Py_ssize_t nk,
                     Py_ssize_t D, Py_ssize_t kc_plane, Py_ssize_t first, Py_ssize_t u0,
                     Py_ssize_t u1) {
    TILE_COPY(dq_tiles)(dsr, kc, out, nk, D, kc_plane, first, u0, u1);
}

static void kv_tiles(const double *lhs, const double *rhs, float *acc, Py_ssize_t D,
                     Py_ssize_t L, Py_ssize_t stride, Py_ssize_t offset, Py_ssize_t u0,
                     Py_ssize_t u1) {
    TILE_COPY(kv_tiles)(lhs, rhs, acc, D, L, stride, offset, u0, u1);
}

/* fixed_values of open1b_kernels.attention.fixed for planes [u0, u1) of bf16 x (P, S, D), zero
 * padded to S_pad rows, into float64 out (P, S_pad, D): with `block` = 0 one group per row
 * (over D: blocked_rows), else groups of `block` consecutive rows per column (over the
 * sequence: column_values). Exact (bit and power-of-two operations, trunc). */
/* Output row r of plane p: plane by plane (G == 0), or in compiled.py's grouped layout
 * (G query heads per KV head, planes p = b * Hq + hq): [hq % G, r / 64, b * Hkv + hq / G,
 * r % 64] of (G, S_pad / 64, B * Hkv, 64, D). */
static inline double *plane_row(double *out, Py_ssize_t p, Py_ssize_t r, Py_ssize_t S_pad,
                                Py_ssize_t D, Py_ssize_t G, Py_ssize_t hq, Py_ssize_t bk) {
    if (!G) return out + (p * S_pad + r) * D;
    Py_ssize_t b = p / hq, h = p % hq, n = S_pad / 64;
    return out + ((((h % G) * n + r / 64) * bk + b * (hq / G) + h / G) * 64 + r % 64) * D;
}

CLONES static void fixed_planes(const uint16_t *x, double *out, Py_ssize_t S, Py_ssize_t S_pad,
                                Py_ssize_t D, Py_ssize_t block, Py_ssize_t G, Py_ssize_t hq,
                                Py_ssize_t bk, Py_ssize_t u0, Py_ssize_t u1) {
    int32_t e[256];
    for (Py_ssize_t p = u0; p < u1; p++) {
        const uint16_t *xp = x + p * S * D;
        if (block == 0) {
            for (Py_ssize_t r = 0; r < S_pad; r++) {
                double *o = plane_row(out, p, r, S_pad, D, G, hq, bk);
                if (r >= S) {
                    for (Py_ssize_t d = 0; d < D; d++) o[d] = 0.0;
                    continue;
                }
                const uint16_t *xr = xp + r * D;
                int32_t em = 1;
                for (Py_ssize_t d = 0; d < D; d++) {
                    int32_t ex = bf16_expo(xr[d]);
                    em = ex > em ? ex : em;
                }
                for (Py_ssize_t d = 0; d < D; d++) o[d] = fixed_value(xr[d], em);
            }
            continue;
        }
        for (Py_ssize_t r0 = 0; r0 < S_pad; r0 += block) {
            Py_ssize_t r1 = r0 + block < S ? r0 + block : S;  /* real rows of the block */
            for (Py_ssize_t d = 0; d < D; d++) e[d] = 1;
            for (Py_ssize_t r = r0; r < r1; r++)
                for (Py_ssize_t d = 0; d < D; d++) {
                    int32_t ex = bf16_expo(xp[r * D + d]);
                    e[d] = ex > e[d] ? ex : e[d];
                }
            for (Py_ssize_t r = r0; r < r0 + block; r++) {
                double *o = plane_row(out, p, r, S_pad, D, G, hq, bk);
                if (r >= S) {
                    for (Py_ssize_t d = 0; d < D; d++) o[d] = 0.0;
                    continue;
                }
                for (Py_ssize_t d = 0; d < D; d++) o[d] = fixed_value(xp[r * D + d], e[d]);
            }
        }
    }
}

/* Python wrappers: buffers checked against the shapes before any access. */

static int positions_ok(Py_ssize_t seq, Py_ssize_t window, Py_ssize_t rows, Py_ssize_t cols) {
    if (seq >= 0 && window >= 0 && rows >= 0 && cols >= 0 && seq < INT32_MAX &&
        window < INT32_MAX && rows < INT32_MAX && cols < INT32_MAX)
        return 1;
    PyErr_Format(PyExc_ValueError, "positions out of int32 range (seq %zd, window %zd)", seq,
                 window);
    return 0;
}

/* fwd_rows (s float64, p8 float32), fwd_rows_i8 (s float64, p8 int8: the VNNI P V,
 * _tilevnni.c) or fwd_rows32 (s float32, p8 int8: the AMX tiles). */
static PyObject *fwd_rows_call(PyObject *args, int s_f32, int p_i8) {
    int pieces = 1;
    Py_buffer b[7];
    Py_ssize_t BK, R, nk, ustride, col0, row0, seq, window, u0, u1;
    double scale;
    if (!PyArg_ParseTuple(args, "y*y*w*w*w*w*w*nnnnnnnndnn|i", &b[0], &b[1], &b[2], &b[3], &b[4],
                          &b[5], &b[6], &BK, &R, &nk, &ustride, &col0, &row0, &seq, &window,
                          &scale, &u0, &u1, &pieces))
        return NULL;
    Py_ssize_t rows = BK * R, L = nk * BLK;
    int ok = positions_ok(seq, window, row0 + R, col0 + L) && BK > 0 && R > 0 && nk > 0 && col0 >= 0 && col0 + L <= ustride &&
             sized(&b[0], rows * L, s_f32 ? 4 : 8, "s") && sized(&b[1], BK * ustride, 4, "u") &&
             sized(&b[2], rows * L, p_i8 ? 1 : 4, "p8") && sized(&b[3], rows * nk, 4, "alpha") &&
             sized(&b[4], rows * nk, 4, "t") && sized(&b[5], rows, 4, "m") &&
             sized(&b[6], rows, 4, "l") && units_ok(u0, u1, rows);
    ok = ok && PIECES_OK(pieces);
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        if (s_f32)
            FOR_PIECES(u0, u1, pieces, fwd_rows32(b[0].buf, b[1].buf, b[2].buf, b[3].buf, b[4].buf,
                                                  b[5].buf, b[6].buf, R, nk, ustride, col0, row0,
                                                  seq, window, (float)scale, p_lo, p_hi));
        else if (p_i8)
            FOR_PIECES(u0, u1, pieces, fwd_rows_i8(b[0].buf, b[1].buf, b[2].buf, b[3].buf,
                                                   b[4].buf, b[5].buf, b[6].buf, R, nk, ustride,
                                                   col0, row0, seq, window, (float)scale, p_lo,
                                                   p_hi));
        else
            FOR_PIECES(u0, u1, pieces, fwd_rows(b[0].buf, b[1].buf, b[2].buf, b[3].buf, b[4].buf,
                                                b[5].buf, b[6].buf, R, nk, ustride, col0, row0, seq,
                                                window, (float)scale, p_lo, p_hi));
        Py_END_ALLOW_THREADS
    }
    return finish(b, 7, ok, "fwd_rows: inconsistent shapes");
}

static PyObject *py_fwd_rows(PyObject *self, PyObject *args) {
    (void)self;
    return fwd_rows_call(args, 0, 0);
}

static PyObject *py_fwd_rows_i8(PyObject *self, PyObject *args) {
    (void)self;
    return fwd_rows_call(args, 0, 1);
}

static PyObject *py_fwd_rows32(PyObject *self, PyObject *args) {
    (void)self;
    return fwd_rows_call(args, 1, 1);
}

static PyObject *py_fwd_acc(PyObject *self, PyObject *args) {
    (void)self;
    int pieces = 1;
    Py_buffer b[7];
    Py_ssize_t BK, R, nk, D, u0, u1;
    if (!PyArg_ParseTuple(args, "y*y*y*y*y*w*w*nnnnnn|i", &b[0], &b[1], &b[2], &b[3], &b[4],
                          &b[5], &b[6], &BK, &R, &nk, &D, &u0, &u1, &pieces))
        return NULL;
    Py_ssize_t rows = BK * R;
    int ok = BK > 0 && R > 0 && nk > 0 && D > 0 && sized(&b[0], rows * nk * D, 4, "I") &&
             sized(&b[1], rows * nk, 4, "alpha") && sized(&b[2], rows * nk, 4, "t") &&
             sized(&b[3], rows, 4, "m") && sized(&b[4], rows, 4, "l") &&
             sized(&b[5], rows * D, 4, "out") && sized(&b[6], rows, 4, "lse") &&
             units_ok(u0, u1, rows);
    ok = ok && PIECES_OK(pieces);
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        FOR_PIECES(u0, u1, pieces, fwd_acc(b[0].buf, b[1].buf, b[2].buf, b[3].buf, b[4].buf,
                                           b[5].buf, b[6].buf, R, nk, D, p_lo, p_hi));
        Py_END_ALLOW_THREADS
    }
    return finish(b, 7, ok, "fwd_acc: inconsistent shapes");
}

static PyObject *py_bwd_tiles(PyObject *self, PyObject *args) {
    (void)self;
    int pieces = 1;
    Py_buffer b[7];
    Py_ssize_t BK, nk, col0, row0, seq, window, u0, u1;
    double scale;
    if (!PyArg_ParseTuple(args, "y*y*y*y*w*w*w*nnnnnndnn|i", &b[0], &b[1], &b[2], &b[3], &b[4],
                          &b[5], &b[6], &BK, &nk, &col0, &row0, &seq, &window, &scale, &u0,
                          &u1, &pieces))
        return NULL;
    Py_ssize_t tiles = BK * nk, tile = BLK * BLK;
    int ok = positions_ok(seq, window, row0 + BLK, col0 + nk * BLK) && BK > 0 && nk > 0 && sized(&b[0], tiles * tile, 8, "s64") &&
             sized(&b[1], tiles * tile, 8, "dp64") && sized(&b[2], BK * BLK, 4, "lse") &&
             sized(&b[3], BK * BLK, 4, "drow") && sized(&b[4], tiles * tile, 8, "dsr") &&
             sized(&b[5], tiles * tile, 8, "dsc") && sized(&b[6], tiles * tile, 8, "pc") &&
             units_ok(u0, u1, tiles);
    ok = ok && PIECES_OK(pieces);
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        FOR_PIECES(u0, u1, pieces, bwd_tiles(b[0].buf, b[1].buf, b[2].buf, b[3].buf, b[4].buf,
                                             b[5].buf, b[6].buf, nk, col0, row0, seq, window,
                                             (float)scale, p_lo, p_hi));
        Py_END_ALLOW_THREADS
    }
    return finish(b, 7, ok, "bwd_tiles: inconsistent shapes");
}

static PyObject *py_dq_tiles(PyObject *self, PyObject *args) {
    (void)self;
    int pieces = 1;
    Py_buffer b[3];
    Py_ssize_t BK, nk, D, n_kb, first, u0, u1;
    if (!PyArg_ParseTuple(args, "y*y*w*nnnnnnn|i", &b[0], &b[1], &b[2], &BK, &nk, &D, &n_kb,
                          &first, &u0, &u1, &pieces))
        return NULL;
    int ok = BK > 0 && nk > 0 && D > 0 && D % 16 == 0 && first >= 0 && first + nk <= n_kb &&
             sized(&b[0], BK * nk * BLK * BLK, 8, "dsr") &&
             sized(&b[1], BK * n_kb * BLK * D, 8, "kc") && sized(&b[2], BK * BLK * D, 4, "out") &&
             units_ok(u0, u1, BK * BLK);
    ok = ok && PIECES_OK(pieces);
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        FOR_PIECES(u0, u1, pieces, dq_tiles(b[0].buf, b[1].buf, b[2].buf, nk, D, n_kb * BLK * D,
                                            first, p_lo, p_hi));
        Py_END_ALLOW_THREADS
    }
    return finish(b, 3, ok, "dq_tiles: inconsistent shapes");
}

static PyObject *py_kv_tiles(PyObject *self, PyObject *args) {
    (void)self;
    int pieces = 1;
    Py_buffer b[3];
    Py_ssize_t BK, D, L, stride, offset, u0, u1;
    if (!PyArg_ParseTuple(args, "y*y*w*nnnnnnn|i", &b[0], &b[1], &b[2], &BK, &D, &L, &stride,
                          &offset, &u0, &u1, &pieces))
        return NULL;
    int ok = BK > 0 && D > 0 && D % 8 == 0 && L > 0 && L % 16 == 0 && offset >= 0 &&
             offset + L <= stride && sized(&b[0], BK * BLK * D, 8, "lhs") &&
             sized(&b[1], BK * BLK * L, 8, "rhs") && sized(&b[2], BK * D * stride, 4, "acc") &&
             units_ok(u0, u1, BK * D);
    ok = ok && PIECES_OK(pieces);
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        FOR_PIECES(u0, u1, pieces, kv_tiles(b[0].buf, b[1].buf, b[2].buf, D, L, stride, offset,
                                            p_lo, p_hi));
        Py_END_ALLOW_THREADS
    }
    return finish(b, 3, ok, "kv_tiles: inconsistent shapes");
}

static PyObject *py_fixed_planes(PyObject *self, PyObject *args) {
    (void)self;
    int pieces = 1;
    Py_buffer b[2];
    Py_ssize_t P, S, S_pad, D, block, G, hq, u0, u1;
    if (!PyArg_ParseTuple(args, "y*w*nnnnnnnnn|i", &b[0], &b[1], &P, &S, &S_pad, &D, &block, &G,
                          &hq, &u0, &u1, &pieces))
        return NULL;
    /* grouped: planes of B batches x hq heads, hq a multiple of G, rows in 64-row blocks */
    int ok = P > 0 && S > 0 && D > 0 && D <= 256 && S <= S_pad && block >= 0 &&
             (block == 0 || S_pad % block == 0) && sized(&b[0], P * S * D, 2, "x") &&
             sized(&b[1], P * S_pad * D, 8, "out") && units_ok(u0, u1, P) &&
             (G == 0 || (G > 0 && hq > 0 && hq % G == 0 && P % hq == 0 && S_pad % 64 == 0 &&
                         (block == 0 || block == 64)));
    ok = ok && PIECES_OK(pieces);
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        FOR_PIECES(u0, u1, pieces, fixed_planes(b[0].buf, b[1].buf, S, S_pad, D, block, G, hq,
                                                G ? P / G : 0, p_lo, p_hi));
        Py_END_ALLOW_THREADS
    }
    return finish(b, 2, ok, "fixed_planes: inconsistent shapes");
}

static PyObject *py_tile_level(PyObject *self, PyObject *args) {
    (void)self;
    int want = -1;
    if (!PyArg_ParseTuple(args, "|i", &want)) return NULL;
    if (want >= 0) {
        int top = cpu_level();
        tile_level_now = want < top ? want : top;
    }
    return PyLong_FromLong(tile_level());
}

static PyMethodDef methods[] = {
    {"tile_level", py_tile_level, METH_VARARGS,
     "tile_level([n]): which copy of dq_tiles/kv_tiles runs (2 x86-64-v4, 1 x86-64-v3, 0 the "
     "baseline); n lowers it (capped at what this CPU runs), -1 or none only reads it."},
    {"fwd_rows", py_fwd_rows, METH_VARARGS,
     "fwd_rows(s64, u, p8, alpha, t, m, l, BK, R, nk, ustride, col0, row0, seq, window, scale,"
     " u0, u1): the forward's online softmax over one query block's band."},
    {"fwd_rows_i8", py_fwd_rows_i8, METH_VARARGS,
     "fwd_rows_i8(s64, u, p8, ...): fwd_rows with P as int8 (the VNNI P V's operand)."},
    {"fwd_rows32", py_fwd_rows32, METH_VARARGS,
     "fwd_rows32(s32, u, p8, ...): fwd_rows from the scores' float32 roundings, P as int8 "
     "(the AMX path's operands)."},
    {"fwd_acc", py_fwd_acc, METH_VARARGS,
     "fwd_acc(I, alpha, t, m, l, out, lse, BK, R, nk, D, u0, u1): the forward's accumulator."},
    {"bwd_tiles", py_bwd_tiles, METH_VARARGS,
     "bwd_tiles(s64, dp64, lse, drow, dsr, dsc, pc, BK, nk, col0, row0, seq, window, scale,"
     " u0, u1): p, ds and their fixed-point tiles."},
    {"dq_tiles", py_dq_tiles, METH_VARARGS,
     "dq_tiles(dsr, kc, out, BK, nk, D, n_kb, first, u0, u1): dQ's tile products and their "
     "ordered float32 sum, rows [u0, u1) of (BK * 64)."},
    {"kv_tiles", py_kv_tiles, METH_VARARGS,
     "kv_tiles(lhs, rhs, acc, BK, D, L, stride, offset, u0, u1): dK^T's or dV^T's tile "
     "products added to their running float32 sums, rows [u0, u1) of (BK * D)."},
    {"fixed_planes", py_fixed_planes, METH_VARARGS,
     "fixed_planes(x, out, P, S, S_pad, D, block, G, hq, u0, u1): fixed-point values of "
     "bf16 planes (G > 0: in the grouped layout)."},
    {NULL, NULL, 0, NULL},
};

EXT_TABLE(tileamx);
EXT_TABLE(tileloops);
EXT_TABLE(tilevnni);

EXT_MODULE(_tilesc, "Compiled tile loops of attention's CPU reference (same bits).",
           {methods, open1b_tileamx_methods, open1b_tileloops_methods, open1b_tilevnni_methods})
