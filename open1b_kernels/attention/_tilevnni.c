/* Attention's exact row products on AVX-512 VNNI (open1b_kernels/attention/vnni.py): the
 * float64 values of the products Q K^T and dO V^T of open1b_kernels/attention/compiled.py,
 * from int8 digits, where no AMX tiles run (open1b_kernels/attention/_tileamx.c does it there).
 *
 * Both operands are groups of one row over the head dim D: fixed-point integers N (|N| < 2^21)
 * with one exponent E a row (open1b_kernels/attention/fixed.py), and the product's value is
 * T * 2^(Ea - 147) * 2^(Eb - 147) with T = sum_k Na_k Nb_k, exact in float64 - the value the
 * float64 BLAS product gives in any order. Here T is formed from
 *     N = 2^7 H + L,  H = N >> 7 = 2^7 d0 + d1  (d0 = N >> 14 in [-128, 127], d1, L in [0, 127])
 *     T = 2^14 sum Ha Hb + 2^7 sum Ha Lb + sum La Nb.
 * L is nonzero only for a value 7 or more binades below its row's largest (N = m 2^(e-E+13)
 * with m < 2^8 has its low 7 bits zero while e - E + 13 >= 7): ~2% of a Gaussian row, so
 *   - sum Ha Hb runs dense as four digit products on VPDPBUSD (u8 x s8 -> int32 in fours):
 *     the left operand's d0 goes in as d0 + 128 (unsigned), corrected by 128 times the
 *     right digits' column sums; products of equal weight share an accumulator (hi: d0 d0,
 *     mid: d0 d1 + d1 d0, lo: d1 d1), each below 2 * 255 * 127 * 256 < 2^31 for D <= 256;
 *   - the two sums with an L run over L's nonzeros (kept per 64-row block as a list), each
 *     adding L times a row of the other side's N or H (stored k-major) to 64 outputs.
 * Every partial sum is an integer below 2^53 (|2^14 sum Ha Hb| < 2^14 * 256 * 2^28), so the
 * float64 arithmetic is exact whatever its order and T is exact; the two power-of-two
 * multiplies are exact (no under- or overflow for biased exponents in [1, 255]). Out: the
 * float64 value compiled.py's BLAS product gives (tests/kernels/test_attention_vnni.py).
 *
 * The forward's P V (vnni_values, vnni_pv_acc) is one int8 product a key block: P's
 * integers 0..127 (u8) times V's int8 codes (s8) summed over the block's 64 keys in int32,
 * below 64 * 127^2 < 2^24, so its float32 conversion is exact - the value compiled.py's
 * float32 product of the same integers gives (every partial sum an integer below 2^24) -
 * added into the output as it is made, in _tilesc.c's fwd_acc's float32 operations and order,
 * so no block's product reaches memory.
 *
 * Layouts (per plane, per 64-row block): dig - two digit planes of 64 x D bytes: the left
 * side (A) row-major [digit][row][k] (d0 + 128, d1), the right side (B) in VPDPBUSD's order
 * [digit][16-row group][k / 4][16 rows][4 k] (d0, d1); tr - int32 [k][row]: H (A) or N (B);
 * sp - L's nonzeros as L | k << 8 | row << 16, spn of them; exps - each row's E; corr (B) -
 * 128 (2^14 sum_k d0 + 2^7 sum_k d1) of each row. Rows past the sequence are zeros (E = 1).
 */
#include "../core/_ext.h"

#include <string.h>

#include "_fixed.h"
#include "_online.h"

#define BLK 64             /* BLOCK_M = BLOCK_N (checked by the caller) */
#define EXP_OFFSET 147     /* x = N * 2^(E - 147), open1b_kernels/attention/fixed.py */

/* ------------------------------------------------------------------ the operands' digits */

/* Planes [u0, u1) of bf16 x (P, S, D) as one side's operand (b_side 0: A, 1: B), padded to
 * S_pad rows. */
CLONES static void vnni_rows(const uint16_t *x, int8_t *dig, int32_t *tr, int32_t *sp,
                             int32_t *spn, int32_t *exps, double *corr, Py_ssize_t S,
                             Py_ssize_t S_pad, Py_ssize_t D, int b_side, Py_ssize_t u0,
                             Py_ssize_t u1) {
    Py_ssize_t nblk = S_pad / BLK, per = BLK * D, quads = D / 4;
    /* one row at a time in straight passes (the exponent, N, its digits and their sums, the
     * stores, L's nonzeros) that the compiler vectorizes, where one pass doing all of it per
     * element ran scalar */
    int32_t n[256], hi[256], mid[256];
    for (Py_ssize_t p = u0; p < u1; p++)
        for (Py_ssize_t b = 0; b < nblk; b++) {
            Py_ssize_t blk = p * nblk + b;
            int8_t *d0 = dig + blk * 2 * per, *d1 = d0 + per;
            int32_t *t = tr + blk * per, *s = sp + blk * per, count = 0;
            for (int i = 0; i < BLK; i++) {
                Py_ssize_t r = b * BLK + i;
                const uint16_t *xr = x + (p * S + r) * D;
                int32_t E = 1, s0 = 0, s1 = 0;
                if (r < S) {
                    for (Py_ssize_t k = 0; k < D; k++) {
                        int32_t e = bf16_expo(xr[k]);
                        E = e > E ? e : E;
                    }
                    for (Py_ssize_t k = 0; k < D; k++) n[k] = fixed_int(xr[k], E);
                } else {
                    memset(n, 0, sizeof(int32_t) * D);
                }
                exps[p * S_pad + r] = E;
                for (Py_ssize_t k = 0; k < D; k++) {
                    hi[k] = n[k] >> 14;
                    mid[k] = (n[k] >> 7) & 0x7F;
                }
                for (Py_ssize_t k = 0; k < D; k++) {
                    s0 += hi[k];
                    s1 += mid[k];
                }
                if (b_side) {
                    int8_t *q0 = d0 + (i / 16) * quads * 64 + (i % 16) * 4;
                    int8_t *q1 = d1 + (i / 16) * quads * 64 + (i % 16) * 4;
                    for (Py_ssize_t q = 0; q < quads; q++) {     /* a quad's 4 bytes at once */
                        uint32_t w0 = 0, w1 = 0;
                        for (int j = 0; j < 4; j++) {
                            w0 |= (uint32_t)(uint8_t)hi[4 * q + j] << (8 * j);
                            w1 |= (uint32_t)(uint8_t)mid[4 * q + j] << (8 * j);
                        }
                        memcpy(q0 + q * 64, &w0, 4);
                        memcpy(q1 + q * 64, &w1, 4);
                    }
                    for (Py_ssize_t k = 0; k < D; k++) t[k * BLK + i] = n[k];
                } else {
                    for (Py_ssize_t k = 0; k < D; k++) {
                        d0[i * D + k] = (int8_t)(uint8_t)(hi[k] + 128);
                        d1[i * D + k] = (int8_t)mid[k];
                    }
                    for (Py_ssize_t k = 0; k < D; k++) t[k * BLK + i] = n[k] >> 7;
                }
                for (Py_ssize_t k0 = 0; k0 < D; k0 += 16) {  /* L is mostly zero: test 16 at once */
                    int32_t any = 0;
                    for (Py_ssize_t k = k0; k < k0 + 16; k++) any |= n[k] & 0x7F;
                    if (any)
                        for (Py_ssize_t k = k0; k < k0 + 16; k++)
                            if (n[k] & 0x7F)
                                s[count++] = (n[k] & 0x7F) | (int32_t)(k << 8) | (i << 16);
                }
                corr[p * S_pad + r] = b_side ? 128.0 * (16384.0 * s0 + 128.0 * s1) : 0.0;
            }
            spn[blk] = count;
        }
}

/* Planes x key blocks [u0, u1) of int8 V (P, n_kb * 64, D) in VPDPBUSD's order for P V:
 * [unit][16-column group][k / 4][16 columns][4 k]. */
static void vnni_values(const int8_t *v, int8_t *vq, Py_ssize_t D, Py_ssize_t u0,
                        Py_ssize_t u1) {
    for (Py_ssize_t u = u0; u < u1; u++) {
        const int8_t *src = v + u * BLK * D;
        int8_t *dst = vq + u * BLK * D;
        for (Py_ssize_t k = 0; k < BLK; k++)
            for (Py_ssize_t c = 0; c < D; c++)
                dst[((c / 16) * (BLK / 4) + k / 4) * 64 + (c % 16) * 4 + k % 4] = src[k * D + c];
    }
}

/* --------------------------------------------------------------------------- the products */

#if HAVE_V4
#include <immintrin.h>
#define VNNI __attribute__((target("avx512f,avx512bw,avx512vnni")))


/* acc += the four-byte dot products of u8 x and s8 y, in place. With _mm512_dpbusd_epi32
 * GCC 12 copied the accumulators between registers and spilled them (the product ran at
 * 0.76x the float64 one); the asm pins each to its register. */
#define DPBUSD(ACC, X, Y) __asm__("vpdpbusd %2, %1, %0" : "+v"(ACC) : "v"(X), "v"(Y))

/* P V: rows [0, 4) of p (64 bytes a row, 0..127) times the V block's column groups [cg,
 * cg + NC) into o (float32, rows D apart); 4 x NC accumulators, NC loaded and one broadcast
 * register. */
#define PV_BLOCK(NC)                                                                         \
    VNNI static inline void pv4x##NC(const uint8_t *p, const int8_t *vq, Py_ssize_t D,      \
                                     Py_ssize_t cg, float *o) {                             \
        __m512i acc[4][NC];                                                                  \
        for (int r = 0; r < 4; r++)                                                          \
            for (int c = 0; c < NC; c++) acc[r][c] = _mm512_setzero_si512();                 \
        for (int q = 0; q < BLK / 4; q++) {                                                  \
            __m512i y[NC];                                                                   \
            for (int c = 0; c < NC; c++)                                                     \
                y[c] = _mm512_loadu_si512(vq + ((cg + c) * (BLK / 4) + q) * 64);             \
            for (int r = 0; r < 4; r++) {                                                    \
                int32_t w;                                                                   \
                memcpy(&w, p + r * BLK + 4 * q, 4);                                          \
                const __m512i x = _mm512_set1_epi32(w);                                      \
                for (int c = 0; c < NC; c++) DPBUSD(acc[r][c], x, y[c]);                     \
            }                                                                                \
        }                                                                                    \
        for (int r = 0; r < 4; r++)                                                          \
            for (int c = 0; c < NC; c++)                                                     \
                _mm512_storeu_ps(o + r * D + (cg + c) * 16, _mm512_cvtepi32_ps(acc[r][c]));  \
    }
PV_BLOCK(4)
PV_BLOCK(1)
#undef PV_BLOCK

/* Units [u0, u1) of (BK, R / 4), four rows each: out (BK, R, D) and lse (BK, R) from the band
 * of nk key blocks from first - each key block's P V (p8 (BK, nk, R, 64)) made and added at
 * once by _online.h, as _tilesc.c's fwd_acc adds its float32 I: the same operations on the
 * same values, the same bits. */
VNNI static void pv_acc(const uint8_t *p8, const int8_t *vq, const float *alpha, const int32_t *t,
                        const float *m, const float *l, float *out, float *lse, Py_ssize_t R,
                        Py_ssize_t nk, Py_ssize_t first, Py_ssize_t n_kb, Py_ssize_t D,
                        Py_ssize_t u0, Py_ssize_t u1) {
    float ib[4 * 256] __attribute__((aligned(64)));     /* one key block's I of four rows */
    const Py_ssize_t groups = D / 16, quads = R / 4;
    for (Py_ssize_t u = u0; u < u1; u++) {
        Py_ssize_t bk = u / quads, r0 = (u % quads) * 4, row = bk * R + r0;
        float *acc = out + row * D;
        for (Py_ssize_t i = 0; i < 4 * D; i++) acc[i] = 0.0f;
        for (Py_ssize_t j = 0; j < nk; j++) {
            const uint8_t *p = p8 + ((bk * nk + j) * R + r0) * BLK;
            const int8_t *v = vq + (bk * n_kb + first + j) * BLK * D;
            Py_ssize_t cg = 0;
            for (; cg + 4 <= groups; cg += 4) pv4x4(p, v, D, cg, ib);
            for (; cg < groups; cg++) pv4x1(p, v, D, cg, ib);
            for (int r = 0; r < 4; r++)
                online_add(acc + r * D, ib + r * D, alpha[(row + r) * nk + j],
                           t[(row + r) * nk + j], D);
        }
        for (int r = 0; r < 4; r++)
            lse[row + r] = online_finish(acc + r * D, l[row + r], m[row + r], D);
    }
}

/* Rows i0 .. i0 + 3 of the A block against the 16-row group g of the B block: their dense
 * part 2^14 sum Ha Hb into acc (64 x 64). Twelve accumulators, two loaded and two broadcast
 * registers: no spills. */
VNNI static inline void dense4x16(const int8_t *a, const int8_t *b, const double *corr,
                                  Py_ssize_t D, int i0, int g, double *acc) {
    const Py_ssize_t per = BLK * D;
    const uint8_t *a0 = (const uint8_t *)a + i0 * D, *a1 = a0 + per;
    const int8_t *b0 = b + g * (D / 4) * 64, *b1 = b0 + per;
    __m512i hi0 = _mm512_setzero_si512(), hi1 = hi0, hi2 = hi0, hi3 = hi0;
    __m512i mi0 = hi0, mi1 = hi0, mi2 = hi0, mi3 = hi0, lo0 = hi0, lo1 = hi0, lo2 = hi0, lo3 = hi0;
    for (Py_ssize_t q = 0; q < D / 4; q++) {
        const __m512i y0 = _mm512_loadu_si512(b0 + q * 64), y1 = _mm512_loadu_si512(b1 + q * 64);
#define V_ROW(R, HI, MI, LO)                                                                 \
        do {                                                                                 \
            int32_t w0, w1;                                                                  \
            memcpy(&w0, a0 + (R) * D + 4 * q, 4);                                            \
            memcpy(&w1, a1 + (R) * D + 4 * q, 4);                                            \
            const __m512i x0 = _mm512_set1_epi32(w0), x1 = _mm512_set1_epi32(w1);            \
            DPBUSD(HI, x0, y0);                                                              \
            DPBUSD(MI, x0, y1);                                                              \
            DPBUSD(MI, x1, y0);                                                              \
            DPBUSD(LO, x1, y1);                                                              \
        } while (0)
        V_ROW(0, hi0, mi0, lo0);
        V_ROW(1, hi1, mi1, lo1);
        V_ROW(2, hi2, mi2, lo2);
        V_ROW(3, hi3, mi3, lo3);
#undef V_ROW
    }
    const __m512i his[4] = {hi0, hi1, hi2, hi3}, mis[4] = {mi0, mi1, mi2, mi3};
    const __m512i los[4] = {lo0, lo1, lo2, lo3};
    for (int r = 0; r < 4; r++) {
        /* hi' 2^7 + mid' < 2^30 + 2^24: int32; the rest integers below 2^53 in float64,
         * exact in any order */
        const __m512i hm = _mm512_add_epi32(_mm512_slli_epi32(his[r], 7), mis[r]);
        const __m512d w = _mm512_set1_pd(128.0), w14 = _mm512_set1_pd(16384.0);
        for (int half = 0; half < 2; half++) {
            int col = g * 16 + half * 8;
            __m256i h8 = half ? _mm512_extracti64x4_epi64(hm, 1) : _mm512_castsi512_si256(hm);
            __m256i l8 = half ? _mm512_extracti64x4_epi64(los[r], 1)
                              : _mm512_castsi512_si256(los[r]);
            __m512d v = _mm512_add_pd(_mm512_mul_pd(_mm512_cvtepi32_pd(h8), w),
                                      _mm512_cvtepi32_pd(l8));
            v = _mm512_sub_pd(v, _mm512_loadu_pd(corr + col));
            _mm512_storeu_pd(acc + (i0 + r) * BLK + col, _mm512_mul_pd(v, w14));
        }
    }
}

/* out[i * ldo + j] = (acc[i][j] + acc_t[j][i]) sa_i sb_j over the 64 x 64 tile (with_t 0: no
 * acc_t), by 8 x 8 blocks - acc_t's turned in registers (unpacks, then two rounds of 128-bit
 * lane shuffles). Every output line written once, whole: the out rows are nk * 512 bytes
 * apart, and adding into them in place thrashed the cache sets. */
VNNI static inline void write_out(double *out, Py_ssize_t ldo, const double *acc,
                                  const double *acc_t, int with_t, const double *sa,
                                  const double *sb) {
    static const int col_of[4][2] = {{0, 4}, {2, 6}, {1, 5}, {3, 7}};
    for (int i0 = 0; i0 < BLK; i0 += 8)
        for (int j0 = 0; j0 < BLK; j0 += 8) {
            __m512d rows[8];
            const __m512d s = _mm512_loadu_pd(sb + j0);
            for (int c = 0; c < 8; c++) rows[c] = _mm512_loadu_pd(acc + (i0 + c) * BLK + j0);
            if (with_t) {
                __m512d a[8], t[8], u[8];
                for (int r = 0; r < 8; r++) a[r] = _mm512_loadu_pd(acc_t + (j0 + r) * BLK + i0);
                for (int r = 0; r < 8; r += 2) {
                    t[r] = _mm512_unpacklo_pd(a[r], a[r + 1]);
                    t[r + 1] = _mm512_unpackhi_pd(a[r], a[r + 1]);
                }
                /* u[0] holds columns 0, 4 of rows 0-3; u[1]: 2, 6; u[2]: 1, 5; u[3]: 3, 7
                 * (rows 4-7 in u[4..7]) */
                for (int h = 0; h < 8; h += 4) {
                    u[h] = _mm512_shuffle_f64x2(t[h], t[h + 2], 0x88);
                    u[h + 1] = _mm512_shuffle_f64x2(t[h], t[h + 2], 0xDD);
                    u[h + 2] = _mm512_shuffle_f64x2(t[h + 1], t[h + 3], 0x88);
                    u[h + 3] = _mm512_shuffle_f64x2(t[h + 1], t[h + 3], 0xDD);
                }
                for (int c = 0; c < 4; c++) {
                    rows[col_of[c][0]] = _mm512_add_pd(rows[col_of[c][0]],
                                                       _mm512_shuffle_f64x2(u[c], u[c + 4], 0x88));
                    rows[col_of[c][1]] = _mm512_add_pd(rows[col_of[c][1]],
                                                       _mm512_shuffle_f64x2(u[c], u[c + 4], 0xDD));
                }
            }
            for (int c = 0; c < 8; c++)     /* powers of two: exact */
                _mm512_storeu_pd(out + (i0 + c) * ldo + j0,
                                 _mm512_mul_pd(_mm512_mul_pd(rows[c], _mm512_set1_pd(sa[i0 + c])), s));
        }
}

/* acc[row] += unit L tr[k] over a list of L's nonzeros (row-major order: a row's run summed in
 * registers, then added once). Each product below 2^28 (L < 2^7 times N < 2^21, or 2^7 L
 * times |H| <= 2^14) and every sum an integer below 2^53: the fused multiply-adds are exact. */
VNNI static inline void add_sparse(const int32_t *list, int32_t n, const int32_t *tr, double unit,
                                   double *acc) {
    for (int32_t e = 0; e < n;) {
        const int32_t row = list[e] >> 16;
        __m512d sum[8];
        for (int c = 0; c < 8; c++) sum[c] = _mm512_setzero_pd();
        for (; e < n && (list[e] >> 16) == row; e++) {
            const int32_t v = list[e];
            const __m512d l = _mm512_set1_pd(unit * (double)(v & 0x7F));
            const int32_t *t = tr + ((v >> 8) & 0xFF) * BLK;
            for (int c = 0; c < 8; c++)
                sum[c] = _mm512_fmadd_pd(
                    l, _mm512_cvtepi32_pd(_mm256_loadu_si256((const __m256i *)(t + 8 * c))),
                    sum[c]);
        }
        double *o = acc + row * BLK;
        for (int c = 0; c < 8; c++)
            _mm512_storeu_pd(o + 8 * c, _mm512_add_pd(_mm512_loadu_pd(o + 8 * c), sum[c]));
    }
}

/* One 64 x 64 tile: out[i * ldo + j] = T_ij 2^(Ea_i - 147) 2^(Eb_j - 147) (see the top). */
VNNI static void tile(const int8_t *ad, const int32_t *atr, const int32_t *asp, int32_t an,
                      const int32_t *ae, const int8_t *bd, const int32_t *btr, const int32_t *bsp,
                      int32_t bn, const int32_t *be, const double *bcorr, Py_ssize_t D,
                      double *out, Py_ssize_t ldo, double *acc, double *acc_t) {
    for (int g = 0; g < 4; g++)
        for (int i0 = 0; i0 < BLK; i0 += 4) dense4x16(ad, bd, bcorr, D, i0, g, acc);
    add_sparse(asp, an, btr, 1.0, acc);      /* sum La Nb: L times N's row k */
    if (bn) {                                /* 2^7 sum Ha Lb, into the transposed sums */
        memset(acc_t, 0, sizeof(double) * BLK * BLK);
        add_sparse(bsp, bn, atr, 128.0, acc_t);
    }
    double sa[BLK], sb[BLK];
    for (int i = 0; i < BLK; i++) {
        sa[i] = pow2d(ae[i] - EXP_OFFSET);
        sb[i] = pow2d(be[i] - EXP_OFFSET);
    }
    write_out(out, ldo, acc, acc_t, bn > 0, sa, sb);
}

/* Units [u0, u1) of (BK, nk, heads): the tile of head (h < 0: head u of the group, else h)
 * of KV plane bk, query block qb, against key block first + u of the band. */
VNNI static void products(const int8_t *ad, const int32_t *atr, const int32_t *asp,
                          const int32_t *aspn, const int32_t *aex, const int8_t *bd,
                          const int32_t *btr, const int32_t *bsp, const int32_t *bspn,
                          const int32_t *bex, const double *bcorr, double *out, Py_ssize_t G,
                          Py_ssize_t h, Py_ssize_t qb, Py_ssize_t first, Py_ssize_t nk,
                          Py_ssize_t na, Py_ssize_t nb, Py_ssize_t D, Py_ssize_t u0,
                          Py_ssize_t u1) {
    const Py_ssize_t heads = h < 0 ? G : 1, per = BLK * D, ldo = nk * BLK;
    double acc[2 * BLK * BLK] __attribute__((aligned(64)));  /* a tile's sums, the turned ones */
    for (Py_ssize_t u = u0; u < u1; u++) {
        /* the heads of a key block next to each other: its B block stays in the cache */
        Py_ssize_t bk = u / (heads * nk), j = (u / heads) % nk, hh = u % heads;
        Py_ssize_t ablk = ((bk * G + (h < 0 ? hh : h)) * na + qb), bblk = bk * nb + first + j;
        tile(ad + ablk * 2 * per, atr + ablk * per, asp + ablk * per, aspn[ablk],
             aex + ablk * BLK, bd + bblk * 2 * per, btr + bblk * per, bsp + bblk * per,
             bspn[bblk], bex + bblk * BLK, bcorr + bblk * BLK, D,
             out + (bk * heads + hh) * BLK * ldo + j * BLK, ldo, acc, acc + BLK * BLK);
    }
}
#endif

/* ------------------------------------------------------------------------------ wrappers */

static PyObject *py_vnni_tiles(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    return PyBool_FromLong(cpu_vnni());
}

static PyObject *py_vnni_rows(PyObject *self, PyObject *args) {
    (void)self;
    int pieces = 1, b_side;
    Py_buffer b[7];
    Py_ssize_t P, S, S_pad, D, u0, u1;
    if (!PyArg_ParseTuple(args, "y*w*w*w*w*w*w*nnnnpnn|i", &b[0], &b[1], &b[2], &b[3], &b[4],
                          &b[5], &b[6], &P, &S, &S_pad, &D, &b_side, &u0, &u1, &pieces))
        return NULL;
    Py_ssize_t nblk = S_pad / BLK;
    int ok = P > 0 && S > 0 && S_pad >= S && S_pad % BLK == 0 && D >= 16 && D <= 256 &&
             D % 16 == 0 && sized(&b[0], P * S * D, 2, "x") &&
             sized(&b[1], P * S_pad * D * 2, 1, "dig") && sized(&b[2], P * S_pad * D, 4, "tr") &&
             sized(&b[3], P * S_pad * D, 4, "sp") && sized(&b[4], P * nblk, 4, "spn") &&
             sized(&b[5], P * S_pad, 4, "exps") && sized(&b[6], P * S_pad, 8, "corr") &&
             units_ok(u0, u1, P) && PIECES_OK(pieces);
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        FOR_PIECES(u0, u1, pieces, vnni_rows(b[0].buf, b[1].buf, b[2].buf, b[3].buf, b[4].buf,
                                             b[5].buf, b[6].buf, S, S_pad, D, b_side, p_lo,
                                             p_hi));
        Py_END_ALLOW_THREADS
    }
    return finish(b, 7, ok, "vnni_rows: inconsistent shapes");
}

static PyObject *py_vnni_products(PyObject *self, PyObject *args) {
    (void)self;
    int pieces = 1;
    Py_buffer b[12];
    Py_ssize_t BK, G, h, qb, first, nk, na, nb, D, u0, u1;
    if (!PyArg_ParseTuple(args, "y*y*y*y*y*y*y*y*y*y*y*w*nnnnnnnnnnn|i", &b[0], &b[1], &b[2],
                          &b[3], &b[4], &b[5], &b[6], &b[7], &b[8], &b[9], &b[10], &b[11], &BK,
                          &G, &h, &qb, &first, &nk, &na, &nb, &D, &u0, &u1, &pieces))
        return NULL;
    Py_ssize_t heads = h < 0 ? G : 1, pa = BK * G, ea = pa * na * BLK * D, eb = BK * nb * BLK * D;
    int ok = cpu_vnni() && BK > 0 && G > 0 && h >= -1 && h < G && qb >= 0 && qb < na &&
             first >= 0 && nk > 0 && first + nk <= nb && D >= 16 && D <= 256 && D % 16 == 0 &&
             sized(&b[0], 2 * ea, 1, "a digits") && sized(&b[1], ea, 4, "a tr") &&
             sized(&b[2], ea, 4, "a sp") && sized(&b[3], pa * na, 4, "a spn") &&
             sized(&b[4], pa * na * BLK, 4, "a exps") && sized(&b[5], 2 * eb, 1, "b digits") &&
             sized(&b[6], eb, 4, "b tr") && sized(&b[7], eb, 4, "b sp") &&
             sized(&b[8], BK * nb, 4, "b spn") && sized(&b[9], BK * nb * BLK, 4, "b exps") &&
             sized(&b[10], BK * nb * BLK, 8, "b corr") &&
             sized(&b[11], BK * heads * BLK * nk * BLK, 8, "out") &&
             units_ok(u0, u1, BK * heads * nk) && PIECES_OK(pieces);
#if HAVE_V4
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        FOR_PIECES(u0, u1, pieces, products(b[0].buf, b[1].buf, b[2].buf, b[3].buf, b[4].buf,
                                            b[5].buf, b[6].buf, b[7].buf, b[8].buf, b[9].buf,
                                            b[10].buf, b[11].buf, G, h, qb, first, nk, na, nb,
                                            D, p_lo, p_hi));
        Py_END_ALLOW_THREADS
    }
#endif
    return finish(b, 12, ok, "vnni_products: needs AVX-512 VNNI and consistent shapes");
}

static PyObject *py_vnni_values(PyObject *self, PyObject *args) {
    (void)self;
    int pieces = 1;
    Py_buffer b[2];
    Py_ssize_t units, D, u0, u1;
    if (!PyArg_ParseTuple(args, "y*w*nnnn|i", &b[0], &b[1], &units, &D, &u0, &u1, &pieces))
        return NULL;
    int ok = units > 0 && D >= 16 && D <= 256 && D % 16 == 0 &&
             sized(&b[0], units * BLK * D, 1, "v") && sized(&b[1], units * BLK * D, 1, "vq") &&
             units_ok(u0, u1, units) && PIECES_OK(pieces);
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        FOR_PIECES(u0, u1, pieces, vnni_values(b[0].buf, b[1].buf, D, p_lo, p_hi));
        Py_END_ALLOW_THREADS
    }
    return finish(b, 2, ok, "vnni_values: inconsistent shapes");
}

static PyObject *py_vnni_pv_acc(PyObject *self, PyObject *args) {
    (void)self;
    int pieces = 1;
    Py_buffer b[8];
    Py_ssize_t BK, R, nk, first, n_kb, D, u0, u1;
    if (!PyArg_ParseTuple(args, "y*y*y*y*y*y*w*w*nnnnnnnn|i", &b[0], &b[1], &b[2], &b[3], &b[4],
                          &b[5], &b[6], &b[7], &BK, &R, &nk, &first, &n_kb, &D, &u0, &u1,
                          &pieces))
        return NULL;
    Py_ssize_t rows = BK * R;
    int ok = cpu_vnni() && BK > 0 && R > 0 && R % 4 == 0 && nk > 0 && first >= 0 &&
             first + nk <= n_kb && D >= 16 && D <= 256 && D % 16 == 0 &&
             sized(&b[0], rows * nk * BLK, 1, "p8") && sized(&b[1], BK * n_kb * BLK * D, 1, "vq") &&
             sized(&b[2], rows * nk, 4, "alpha") && sized(&b[3], rows * nk, 4, "t") &&
             sized(&b[4], rows, 4, "m") && sized(&b[5], rows, 4, "l") &&
             sized(&b[6], rows * D, 4, "out") && sized(&b[7], rows, 4, "lse") &&
             units_ok(u0, u1, BK * (R / 4)) && PIECES_OK(pieces);
#if HAVE_V4
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        FOR_PIECES(u0, u1, pieces, pv_acc(b[0].buf, b[1].buf, b[2].buf, b[3].buf, b[4].buf,
                                          b[5].buf, b[6].buf, b[7].buf, R, nk, first, n_kb, D,
                                          p_lo, p_hi));
        Py_END_ALLOW_THREADS
    }
#endif
    return finish(b, 8, ok, "vnni_pv_acc: needs AVX-512 VNNI and consistent shapes");
}

EXT_METHODS(tilevnni) = {
    {"vnni_tiles", py_vnni_tiles, METH_NOARGS,
     "vnni_tiles(): whether vnni_products runs on this CPU (AVX-512 VNNI)."},
    {"vnni_rows", py_vnni_rows, METH_VARARGS,
     "vnni_rows(x, dig, tr, sp, spn, exps, corr, P, S, S_pad, D, b_side, u0, u1[, pieces]): "
     "bf16 planes [u0, u1) of x (P, S, D) as the digits of one side of a row product."},
    {"vnni_products", py_vnni_products, METH_VARARGS,
     "vnni_products(a..., b..., out, BK, G, h, qb, first, nk, na, nb, D, u0, u1[, pieces]): "
     "the exact float64 row products of query block qb (head h, or every head of a group "
     "for h < 0) against the band of nk key blocks from first, 64 x 64 tile units."},
    {"vnni_values", py_vnni_values, METH_VARARGS,
     "vnni_values(v, vq, units, D, u0, u1[, pieces]): int8 V's key blocks [u0, u1) of "
     "(units, 64, D) in the order vnni_pv_acc reads."},
    {"vnni_pv_acc", py_vnni_pv_acc, METH_VARARGS,
     "vnni_pv_acc(p8, vq, alpha, t, m, l, out, lse, BK, R, nk, first, n_kb, D, u0, u1"
     "[, pieces]): the forward's P V (P's integers 0..127 times V's codes) of the band of nk "
     "key blocks from first, each block's added into out as fwd_acc adds it, then out / l "
     "and lse = m + log(l); units of 4 rows of (BK, R / 4)."},
    {NULL, NULL, 0, NULL},
};
