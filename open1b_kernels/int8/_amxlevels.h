/* The LM head's level epilogue of the AMX tile product (_amxmm.c's amx_levels): the int32
 * sums of a head block's levels - one product each, open1b_kernels.ops.lmhead_plan's
 * level_products - weighted into T, rounded once into the logits and summed for the check,
 * per 32 x 32 block while its levels' sums are in cache. The same operations as
 * _lmhead_sums.c's levels_round_weighted, which reads the level products back from memory:
 *     T = sum over levels of (double)s_l * 2^sh_l   (integers below 2^53: exact, any order)
 *     out[r, c] = (float)((T * rowf[r]) * colf[c])  (two float64 multiplies, one rounding)
 *     u = sum over levels of (uint64)s_l << sh_l    (T modulo 2^64: the check's sums)
 * with u added into this piece's row sums and column sums. Why here: at the head's forward
 * (4,096 x 128,256 logits, three levels) the level products are 6.3 GB of int32 written and
 * read again - a tenth of the head's time on the 2-core AMX Xeon VM. */
#ifndef OPEN1B_AMXLEVELS_H
#define OPEN1B_AMXLEVELS_H

#include <stdint.h>

#include "../core/_amx.h"
#include "../core/_ext.h"

#define MAX_LEVELS 4    /* levels a call: the head's slices 2 .. 3 make 1 .. 3 (lmhead_plan) */

typedef struct {
    const double *rowf, *colf;  /* rowf (M), colf (N): exact powers of two */
    double w[MAX_LEVELS];       /* 2^sh[l] */
    int sh[MAX_LEVELS];
    int nl;
    float *out;                 /* (M, ldo): the block's logits */
    Py_ssize_t ldo;
    uint64_t *rows, *cols;      /* this piece's sums (M), (N), modulo 2^64 */
    int stream;                 /* out by streaming stores */
    int v4;                     /* the CPU runs x86-64-v4 (checked, not assumed) */
} lv_epi;

#if AMX_BUILD
#if HAVE_V4
/* A whole 32 x 32 block in AVX-512 lanes: the conversions int32 -> float64 (exact), the
 * multiplies by 2^sh (exact) and adds (exact: integers below 2^53), the two multiplies and
 * vcvtpd2ps (round to nearest even, as the scalar (float) conversion) - lane by lane the
 * scalar form's operations; the sums in uint64 lanes (wrapping, as the scalar form's). */
V4 static void levels_block32(const lv_epi *V, const int32_t *blk, Py_ssize_t plane,
                              Py_ssize_t i, Py_ssize_t j) {
    __m512d cf[4];
    __m512i cs[4];
    for (int q = 0; q < 4; q++) {
        cf[q] = _mm512_loadu_pd(V->colf + j + 8 * q);
        cs[q] = _mm512_setzero_si512();
    }
    for (int r = 0; r < 32; r++) {
        __m512d t[4];
        __m512i u[4];
        for (int q = 0; q < 4; q++) {
            t[q] = _mm512_setzero_pd();
            u[q] = _mm512_setzero_si512();
        }
        for (int l = 0; l < V->nl; l++) {
            const int32_t *x = blk + l * plane + r * 32;
            const __m512d w = _mm512_set1_pd(V->w[l]);
            const __m128i sh = _mm_cvtsi32_si128(V->sh[l]);
            for (int q = 0; q < 4; q++) {
                __m256i xi = _mm256_load_si256((const __m256i *)(x + 8 * q));
                t[q] = _mm512_add_pd(t[q], _mm512_mul_pd(_mm512_cvtepi32_pd(xi), w));
                u[q] = _mm512_add_epi64(u[q], _mm512_sll_epi64(_mm512_cvtepi32_epi64(xi), sh));
            }
        }
        const __m512d rf = _mm512_set1_pd(V->rowf[i + r]);
        float *o = V->out + (i + r) * V->ldo + j;
        for (int q = 0; q < 4; q += 2) {
            __m256 y0 = _mm512_cvtpd_ps(_mm512_mul_pd(_mm512_mul_pd(t[q], rf), cf[q]));
            __m256 y1 = _mm512_cvtpd_ps(_mm512_mul_pd(_mm512_mul_pd(t[q + 1], rf), cf[q + 1]));
            __m512 y = _mm512_insertf32x8(_mm512_castps256_ps512(y0), y1, 1);
            if (V->stream) _mm512_stream_ps(o + 8 * q, y);
            else _mm512_storeu_ps(o + 8 * q, y);
        }
        V->rows[i + r] += (uint64_t)_mm512_reduce_add_epi64(
            _mm512_add_epi64(_mm512_add_epi64(u[0], u[1]), _mm512_add_epi64(u[2], u[3])));
        for (int q = 0; q < 4; q++) cs[q] = _mm512_add_epi64(cs[q], u[q]);
    }
    for (int q = 0; q < 4; q++) {
        uint64_t *c = V->cols + j + 8 * q;
        _mm512_storeu_si512((void *)c, _mm512_add_epi64(_mm512_loadu_si512((void *)c), cs[q]));
    }
}
#endif

/* The levels of one 32 x 32 block of sums (level l at blk + l * plane, row stride 32),
 * `rows` x `cols` of it inside the output at (i, j): the scalar form, for the blocks at the
 * output's edges and builds or CPUs without x86-64-v4. */
static void levels_block(const lv_epi *V, const int32_t *blk, Py_ssize_t plane, Py_ssize_t i,
                         Py_ssize_t j, Py_ssize_t rows, Py_ssize_t cols) {
#if HAVE_V4
    if (rows == 32 && cols == 32 && V->v4) {
        levels_block32(V, blk, plane, i, j);
        return;
    }
#endif
    uint64_t csum[32] = {0};
    for (Py_ssize_t r = 0; r < rows; r++) {
        double rf = V->rowf[i + r];
        float *o = V->out + (i + r) * V->ldo + j;
        uint64_t rs = 0;
        for (Py_ssize_t c = 0; c < cols; c++) {
            double t = 0.0;
            uint64_t u = 0;
            for (int l = 0; l < V->nl; l++) {
                int32_t v = blk[l * plane + r * 32 + c];
                t = t + (double)v * V->w[l];
                u += (uint64_t)(int64_t)v << V->sh[l];
            }
            o[c] = (float)((t * rf) * V->colf[j + c]);
            rs += u;
            csum[c] += u;
        }
        V->rows[i + r] += rs;
    }
    for (Py_ssize_t c = 0; c < cols; c++) V->cols[j + c] += csum[c];
}
#endif

#endif
