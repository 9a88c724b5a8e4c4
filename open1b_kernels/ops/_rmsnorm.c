/* open1b_kernels.ops.rmsnorm's CPU reference, compiled: one row at a time, the same float32
 * operations in the same order (-ffp-contract=off: setup.py), the row sums by reduce's
 * pairwise tree (../core/_reduce.h) - so the same bits; rows are independent. */
#include "../core/_ext.h"

#include <math.h>
#include <stdlib.h>

#include "../core/_mathfn.h"
#include "../core/_reduce.h"

/* open1b_kernels.ops.rmsnorm's CPU reference, one row at a time (rows [r0, r1) of (R, D)): the
 * same float32 operations in the same order, the row sums by open1b_kernels.core.reduce's pairwise
 * tree (zero-padded to P = the next power of two >= D, adjacent pairs level by level) in the
 * caller's scratch rows `ta`, `tb` (P floats each). x is bf16 bits; gain (D float32) or NULL.
 * Forward: ss = tree(x * x), rstd = 1 / sqrt_rn(ss * rd + eps), y = bf16(x * rstd [* g]). */

CLONES static void rms_fwd_loop(const uint16_t *x, const float *gain, float rd, float eps,
                                uint16_t *y, float *rstd, float *ta, float *tb, Py_ssize_t D,
                                Py_ssize_t P, Py_ssize_t r0, Py_ssize_t r1) {
    for (Py_ssize_t r = r0; r < r1; r++) {
        const uint16_t *xr = x + r * D;
        for (Py_ssize_t c = 0; c < D; c++) {
            float v = widen_bf16(xr[c]);
            ta[c] = v * v;
        }
        float ss = tree_row(ta, tb, D, P);
        float den = (float)sqrt((double)(ss * rd + eps));
        float rs = 1.0f / den;
        rstd[r] = rs;
        uint16_t *yr = y + r * D;
        for (Py_ssize_t c = 0; c < D; c++) {
            float v = widen_bf16(xr[c]) * rs;
            if (gain) v = v * gain[c];
            yr[c] = bf16_rne1(v);
        }
    }
}

/* Backward: xhat = x * rstd, dxhat = dy [* g], dot = tree(dxhat * xhat),
 * dx = bf16((dxhat - xhat * (dot * rd)) * rstd); with `prod`, also dy * xhat (float32 (R, D):
 * the gain gradient's terms, tree-summed over rows by the caller). dy is bf16 bits or
 * float32. */
CLONES static void rms_bwd_loop(const void *dy, int dy_bf16, const uint16_t *x,
                                const float *gain, const float *rstd, float rd, uint16_t *dx,
                                float *prod, float *ta, float *tb, Py_ssize_t D, Py_ssize_t P,
                                Py_ssize_t r0, Py_ssize_t r1) {
    for (Py_ssize_t r = r0; r < r1; r++) {
        const uint16_t *xr = x + r * D;
        float rs = rstd[r];
        for (Py_ssize_t c = 0; c < D; c++) {
            float d = dy_bf16 ? widen_bf16(((const uint16_t *)dy)[r * D + c])
                              : ((const float *)dy)[r * D + c];
            float xh = widen_bf16(xr[c]) * rs;
            float dxh = gain ? d * gain[c] : d;
            ta[c] = dxh * xh;
            if (prod) prod[r * D + c] = d * xh;
        }
        float dot = tree_row(ta, tb, D, P);
        float k = dot * rd;
        uint16_t *o = dx + r * D;
        for (Py_ssize_t c = 0; c < D; c++) {
            float d = dy_bf16 ? widen_bf16(((const uint16_t *)dy)[r * D + c])
                              : ((const float *)dy)[r * D + c];
            float xh = widen_bf16(xr[c]) * rs;
            float dxh = gain ? d * gain[c] : d;
            float v = xh * k;
            v = dxh - v;
            o[c] = bf16_rne1(v * rs);
        }
    }
}

static PyObject *py_rms_fwd(PyObject *self, PyObject *args) {
    (void)self;
    int pieces = 1;
    Py_buffer x, gain, y, rstd;
    Py_ssize_t R, D, r0, r1;
    float rd, eps;
    if (!PyArg_ParseTuple(args, "y*y*ffw*w*nnnn|i", &x, &gain, &rd, &eps, &y, &rstd, &R, &D,
                          &r0, &r1, &pieces))
        return NULL;
    int ok = R >= 0 && D > 0 && D <= (1 << 20) && 0 <= r0 && r0 <= r1 && r1 <= R &&
             x.len == R * D * 2 && (gain.len == D * 4 || gain.len == 0) && y.len == R * D * 2 &&
             rstd.len == R * 4;
    ok = ok && PIECES_OK(pieces);
    float *ta = NULL;
    Py_ssize_t P = pow2_ceil(D);
    if (ok && !(ta = malloc(sizeof(float) * 2 * P * pieces))) {
        ok = 0;
    }
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        FOR_PIECES(r0, r1, pieces, rms_fwd_loop(x.buf, gain.len ? gain.buf : NULL, rd, eps, y.buf,
                                                rstd.buf, ta + 2 * P * piece,
                                                ta + 2 * P * piece + P, D, P, p_lo, p_hi));
        Py_END_ALLOW_THREADS
    }
    free(ta);
    return FINISH(ok, "rms_fwd: inconsistent shapes or row range", &x, &gain, &y, &rstd);
}

static PyObject *py_rms_bwd(PyObject *self, PyObject *args) {
    (void)self;
    int pieces = 1;
    Py_buffer dy, x, gain, rstd, dx, prod;
    Py_ssize_t R, D, r0, r1;
    int dy_bf16;
    float rd;
    if (!PyArg_ParseTuple(args, "y*py*y*y*fw*w*nnnn|i", &dy, &dy_bf16, &x, &gain, &rstd, &rd,
                          &dx, &prod, &R, &D, &r0, &r1, &pieces))
        return NULL;
    int ok = R >= 0 && D > 0 && D <= (1 << 20) && 0 <= r0 && r0 <= r1 && r1 <= R &&
             dy.len == R * D * (dy_bf16 ? 2 : 4) && x.len == R * D * 2 &&
             (gain.len == D * 4 || gain.len == 0) && rstd.len == R * 4 &&
             dx.len == R * D * 2 && (prod.len == R * D * 4 || prod.len == 0);
    ok = ok && PIECES_OK(pieces);
    float *ta = NULL;
    Py_ssize_t P = pow2_ceil(D);
    if (ok && !(ta = malloc(sizeof(float) * 2 * P * pieces))) {
        ok = 0;
    }
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        FOR_PIECES(r0, r1, pieces, rms_bwd_loop(dy.buf, dy_bf16, x.buf, gain.len ? gain.buf : NULL,
                                                rstd.buf, rd, dx.buf, prod.len ? prod.buf : NULL,
                                                ta + 2 * P * piece, ta + 2 * P * piece + P, D, P,
                                                p_lo, p_hi));
        Py_END_ALLOW_THREADS
    }
    free(ta);
    return FINISH(ok, "rms_bwd: inconsistent shapes or row range", &dy, &x, &gain, &rstd, &dx, &prod);
}

EXT_METHODS(rmsnorm) = {
    {"rms_fwd", py_rms_fwd, METH_VARARGS,
     "rms_fwd(x, gain, rd, eps, y, rstd, R, D, r0, r1[, pieces]): open1b_kernels.ops.rmsnorm's "
     "forward rows."},
    {"rms_bwd", py_rms_bwd, METH_VARARGS,
     "rms_bwd(dy, dy_bf16, x, gain, rstd, rd, dx, prod, R, D, r0, r1[, pieces]): its backward "
     "rows."},
    {NULL, NULL, 0, NULL},
};
