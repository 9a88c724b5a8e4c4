/* The LM head's T from its route's products, compiled (step 2 and 3 of open1b_kernels.ops.lmhead):
 * on the int route the int32 level products weighted into T and rounded once, with T's
 * row and column sums for the check (levels_round_weighted: open1b_kernels.ops.lmhead_int);
 * on the float route the float32 products weighted into the float64 T, then rounded
 * (float_sum: open1b_kernels.ops.lmhead_float). T is an integer below 2^53 and every weight a
 * power of two, so the sums are exact in any order and the one rounding is the torch code's:
 * the same bits. */
#include "../core/_ext.h"

#include <math.h>
#include <stdlib.h>

/* open1b_kernels.ops.lmhead_int's integer route after the int8 GEMMs of one output block, rows
 * [r0, r1) of the n int32 products accs (n, R, C) - each level's, per contraction chunk -
 * with weights w (n, powers of two 2^sh[k]) and, when `base` is given, an int64 (R, C) part
 * of T computed elsewhere (the row-sparse slices' products, already weighted):
 * T = base + sum_k acc_k * w_k in float64 (exact: integers below 2^53, so any order),
 * out[r, c0 + c] = fp32((T * rowf[r]) * colf[c]) (two exact power-of-two multiplies, one
 * rounding: ozaki_mm_cpu's step 3), and T's row sums into rows (R,) and this piece's column
 * sums into cols (C,) as int64 modulo 2^64 (unsigned arithmetic: wrapping is defined) - the
 * exactness check's sums, of T itself, so a product given the wrong weight fails the check
 * as a dropped one does. One read of each product, one write of the output; `t`, `u`:
 * C-element row scratch. */
/* One row of levels_round_loop, all levels of a column at once (NL levels: a constant at
 * the calls for 2 and 3, so the level loop unrolls and the column loop vectorizes - one
 * pass over the products instead of a pass per level through row buffers). Per element
 * the same operations: t = ((base + a_0 w_0) + a_1 w_1) + ..., all exact (integers below
 * 2^53 times powers of two), then the two multiplies and the one rounding to float32; the
 * integer sums are exact in any order. */
static inline __attribute__((always_inline)) void
levels_row(const int32_t *a, Py_ssize_t plane, const int NL, const double *w, const int *sh,
           const int64_t *base, const int has_base, double rf, const double *colf, float *o,
           uint64_t *cols, uint64_t *rowsum, Py_ssize_t C) {
    uint64_t rs = 0;
    for (Py_ssize_t c = 0; c < C; c++) {
        /* has_base is a constant at each call: a test of `base` here left GCC a loop with
         * a branch, which it ran scalar - 3.2 ns an element without a base against 0.9
         * with one (2 cores of a Zen 4, 1,024 x 4,096 elements, 3 levels); now 0.6 */
        double t = has_base ? (double)base[c] : 0.0;
        uint64_t u = has_base ? (uint64_t)base[c] : 0;
        for (int k = 0; k < NL; k++) {
            int32_t v = a[k * plane + c];
            t = t + (double)v * w[k];
            u += (uint64_t)(int64_t)v << sh[k];
        }
        o[c] = (float)((t * rf) * colf[c]);
        rs += u;
        cols[c] += u;
    }
    *rowsum += rs;
}

CLONES static void levels_round_loop(const int32_t *accs, Py_ssize_t n, const double *w,
                                     const int *sh, const int64_t *base, const double *rowf,
                                     const double *colf, float *out, double *t, uint64_t *u,
                                     uint64_t *rows, uint64_t *cols, Py_ssize_t R,
                                     Py_ssize_t C, Py_ssize_t stride, Py_ssize_t c0,
                                     Py_ssize_t r0, Py_ssize_t r1) {
    for (Py_ssize_t r = r0; r < r1; r++) {
        const int64_t *br = base ? base + r * C : NULL;
        if (n == 2 || n == 3) {
            const int32_t *a = accs + r * C;
            float *o = out + r * stride + c0;
            if (n == 2 && br)
                levels_row(a, R * C, 2, w, sh, br, 1, rowf[r], colf, o, cols, rows + r, C);
            else if (n == 2)
                levels_row(a, R * C, 2, w, sh, NULL, 0, rowf[r], colf, o, cols, rows + r, C);
            else if (br)
                levels_row(a, R * C, 3, w, sh, br, 1, rowf[r], colf, o, cols, rows + r, C);
            else
                levels_row(a, R * C, 3, w, sh, NULL, 0, rowf[r], colf, o, cols, rows + r, C);
            continue;
        }
        for (Py_ssize_t c = 0; c < C; c++) {
            t[c] = br ? (double)br[c] : 0.0;
            u[c] = br ? (uint64_t)br[c] : 0;
        }
        for (Py_ssize_t k = 0; k < n; k++) {
            const int32_t *a = accs + k * R * C + r * C;
            double wk = w[k];
            int sk = sh[k];
            for (Py_ssize_t c = 0; c < C; c++) {
                t[c] = t[c] + (double)a[c] * wk;
                u[c] += (uint64_t)(int64_t)a[c] << sk;
            }
        }
        float *o = out + r * stride + c0;
        double rf = rowf[r];
        uint64_t rs = 0;
        for (Py_ssize_t c = 0; c < C; c++) {
            o[c] = (float)((t[c] * rf) * colf[c]);
            rs += u[c];
            cols[c] += u[c];
        }
        rows[r] += rs;
    }
}

/* levels_round_weighted(accs, n, w, rowf, colf, out, rows, cols, base, R, C, stride, c0,
 * r0, r1[, pieces]): base is an int64 (R, C) buffer or empty; every weight a power of two
 * 2^0 .. 2^62 (refused otherwise: the sums' shifts). n may be 0 with a base. */
static PyObject *py_levels_round(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer accs, w, rowf, colf, out, rows, cols, base;
    Py_ssize_t n, R, C, stride, c0, r0, r1;
    int pieces = 1;
    if (!PyArg_ParseTuple(args, "y*ny*y*y*w*w*w*y*nnnnnn|i", &accs, &n, &w, &rowf, &colf, &out,
                          &rows, &cols, &base, &R, &C, &stride, &c0, &r0, &r1, &pieces))
        return NULL;
    int ok = n >= 0 && R >= 0 && C >= 0 && c0 >= 0 && c0 + C <= stride &&
             0 <= r0 && r0 <= r1 && r1 <= R && accs.len == n * R * C * 4 && w.len == n * 8 &&
             rowf.len == R * 8 && colf.len == C * 8 && out.len == R * stride * 4 &&
             rows.len == R * 8 && cols.len == pieces * C * 8 &&
             (base.len == 0 || base.len == R * C * 8) && (n >= 1 || base.len);
    int *sh = ok ? malloc(sizeof(int) * (size_t)(n > 0 ? n : 1)) : NULL;
    if (!sh) ok = 0;
    for (Py_ssize_t k = 0; ok && k < n; k++) {
        int e;
        double m = frexp(((const double *)w.buf)[k], &e);   /* w = 0.5 * 2^e for a power */
        sh[k] = e - 1;
        ok = m == 0.5 && sh[k] >= 0 && sh[k] <= 62;
    }
    ok = ok && PIECES_OK(pieces);
    Py_ssize_t scratch = 2 * (C > 0 ? C : 1);           /* t (double) and u (int64) per piece */
    double *t = NULL;
    if (ok && !(t = malloc((size_t)scratch * pieces * 8))) ok = 0;
    if (ok) {
        const int64_t *b = base.len ? (const int64_t *)base.buf : NULL;
        Py_BEGIN_ALLOW_THREADS
        FOR_PIECES(r0, r1, pieces, {
            double *tp = t + piece * scratch;
            levels_round_loop(accs.buf, n, w.buf, sh, b, rowf.buf, colf.buf, out.buf, tp,
                              (uint64_t *)(tp + C), rows.buf, (uint64_t *)cols.buf + piece * C,
                              R, C, stride, c0, p_lo, p_hi);
        });
        Py_END_ALLOW_THREADS
    }
    free(t);
    free(sh);
    return FINISH(ok, "levels_round_weighted: inconsistent shapes or row range, or a "
                               "weight that is not a power of two 2^0 .. 2^62", &accs, &w, &rowf, &colf, &out, &rows, &cols, &base);
}

/* open1b_kernels.ops.lmhead_float's sum of one output block on the float route, rows [r0, r1):
 * the n float32 products parts (n, R, C) - each an exact float32 GEMM of one contraction
 * chunk, integers below 2^24 - times their weights w (n, powers of two) added to T
 * (float64 (R, C): from its values when `from_t`, else from 0; T is an exact integer, the
 * head product's or the earlier parts'): T' = ((T + p_0 w_0) + p_1 w_1) + ..., exact in any
 * order (integers below 2^53 times powers of two), then with `out` the rounding
 * out[r, c0 + c] = fp32((T' * rowf[r]) * colf[c]) (two exact power-of-two multiplies, one
 * rounding: ozaki_mm_cpu's step 3), else T' stored into T. One pass over the parts where
 * the torch code made one per part plus three over T (zero, two multiplies) and the copy;
 * `acc`: C doubles of row scratch. */
CLONES static void float_sum_loop(const float *parts, Py_ssize_t n, const double *w,
                                  double *t, int from_t, const double *rowf,
                                  const double *colf, float *out, double *acc, Py_ssize_t R,
                                  Py_ssize_t C, Py_ssize_t stride, Py_ssize_t c0,
                                  Py_ssize_t r0, Py_ssize_t r1) {
    for (Py_ssize_t r = r0; r < r1; r++) {
        double *tr = t + r * C;
        for (Py_ssize_t c = 0; c < C; c++) acc[c] = from_t ? tr[c] : 0.0;
        for (Py_ssize_t k = 0; k < n; k++) {
            const float *pk = parts + k * R * C + r * C;
            double wk = w[k];
            for (Py_ssize_t c = 0; c < C; c++) acc[c] = acc[c] + (double)pk[c] * wk;
        }
        if (out) {
            float *o = out + r * stride + c0;
            double rf = rowf[r];
            for (Py_ssize_t c = 0; c < C; c++) o[c] = (float)((acc[c] * rf) * colf[c]);
        } else {
            for (Py_ssize_t c = 0; c < C; c++) tr[c] = acc[c];
        }
    }
}

static PyObject *py_float_sum(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer parts, w, t, rowf, colf, out;
    Py_ssize_t n, R, C, stride, c0, r0, r1;
    int from_t, to_out, pieces = 1;
    if (!PyArg_ParseTuple(args, "y*ny*w*py*y*w*pnnnnnn|i", &parts, &n, &w, &t, &from_t, &rowf,
                          &colf, &out, &to_out, &R, &C, &stride, &c0, &r0, &r1, &pieces))
        return NULL;
    int ok = n >= 0 && R >= 0 && C >= 0 && c0 >= 0 && 0 <= r0 && r0 <= r1 && r1 <= R &&
             parts.len == n * R * C * 4 && w.len == n * 8 && t.len == R * C * 8 &&
             (!to_out || (c0 + C <= stride && rowf.len == R * 8 && colf.len == C * 8 &&
                          out.len == R * stride * 4));
    ok = ok && PIECES_OK(pieces);
    Py_ssize_t row = C > 0 ? C : 1;
    double *acc = NULL;
    if (ok && !(acc = malloc((size_t)row * pieces * 8))) ok = 0;
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        FOR_PIECES(r0, r1, pieces,
                   float_sum_loop(parts.buf, n, w.buf, t.buf, from_t, rowf.buf, colf.buf,
                                  to_out ? out.buf : NULL, acc + piece * row, R, C, stride,
                                  c0, p_lo, p_hi));
        Py_END_ALLOW_THREADS
    }
    free(acc);
    return FINISH(ok, "float_sum: inconsistent shapes or row range", &parts, &w, &t, &rowf, &colf, &out);
}

EXT_METHODS(lmhead_sums) = {
    {"levels_round_weighted", py_levels_round, METH_VARARGS,
     "levels_round_weighted(accs, n, w, rowf, colf, out, rows, cols, base, R, C, stride, c0, "
     "r0, r1[, pieces]): the int route's level sum (plus an int64 base part), rounding and the "
     "check's sums of T for one output block."},
    {"float_sum", py_float_sum, METH_VARARGS,
     "float_sum(parts, n, w, t, from_t, rowf, colf, out, to_out, R, C, stride, c0, r0, r1"
     "[, pieces]): the float route's weighted sum of float32 products into the float64 T of "
     "one output block, or its rounding into out."},
    {NULL, NULL, 0, NULL},
};
