/* open1b_kernels.ops.xent's CPU reference, compiled: the row logsumexp (xent_lse) and the
 * backward (xent_grad) for float32 logits - the torch code's float32 operations in its order
 * (exp and log by ../core/_mathfn.h, the chunk sums by reduce's tree), rows independent: the
 * same bits. */
#include "../core/_ext.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../core/_mathfn.h"
#include "../core/_reduce.h"

/* open1b_kernels.ops.xent's backward for float32 logits, rows [r0, r1) of (R, V): the torch
 * code's float32 operations in its order - coef = 1 + TWO_Z * lse, d = exp(x - lse) * coef,
 * d - 1 at the target column, then d * g. A target outside [0, V) hits no column, as the
 * torch code's comparison. `out` may be `x` itself (the caller's logits overwritten): the
 * target's logit is read before its row is written. */
static const float XENT_TWO_Z = 0.00019999999494757503f;

CLONES static void xent_grad_loop(const float *x, const int64_t *t, const float *lse, float g,
                                  float *out, Py_ssize_t V, Py_ssize_t r0, Py_ssize_t r1) {
    for (Py_ssize_t r = r0; r < r1; r++) {
        const float *xr = x + r * V;
        float *o = out + r * V;
        float l = lse[r];
        float coef = 1.0f + XENT_TWO_Z * l;
        int64_t tc = t[r];
        int hit = tc >= 0 && tc < V;
        float xt = hit ? xr[tc] : 0.0f;
        for (Py_ssize_t c = 0; c < V; c++) o[c] = (exp1(xr[c] - l) * coef) * g;
        if (hit) o[tc] = ((exp1(xt - l) * coef) - 1.0f) * g;
    }
}

static PyObject *py_xent_grad(PyObject *self, PyObject *args) {
    (void)self;
    int pieces = 1;
    Py_buffer x, t, lse, out;
    Py_ssize_t R, V, r0, r1;
    double g;
    if (!PyArg_ParseTuple(args, "y*y*y*dw*nnnn|i", &x, &t, &lse, &g, &out, &R, &V, &r0, &r1,
                          &pieces))
        return NULL;
    int ok = R >= 0 && V >= 0 && 0 <= r0 && r0 <= r1 && r1 <= R && x.len == R * V * 4 &&
             out.len == R * V * 4 && t.len == R * 8 && lse.len == R * 4;
    ok = ok && PIECES_OK(pieces);
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        FOR_PIECES(r0, r1, pieces,
                   xent_grad_loop(x.buf, t.buf, lse.buf, (float)g, out.buf, V, p_lo, p_hi));
        Py_END_ALLOW_THREADS
    }
    return FINISH(ok, "xent_grad: inconsistent shapes or row range", &x, &t, &lse, &out);
}

/* open1b_kernels.ops.xent's row logsumexp (row_lse_cpu) for float32 logits, rows [r0, r1) of
 * (R, V): the online softmax over CH-column chunks in ascending order (the last padded
 * with -inf), the torch code's operations in its order - the chunk maximum (NaN-sticky, as
 * torch's amax), m' = maximum(m, c) (NaN if either is), s = s * exp(m - m') + tree(exp(x -
 * m')) with the pairwise tree over the CH (a power of two) columns, lse = m + log(s). `ta`,
 * `tb`: CH floats each of scratch. */
/* The chunk maximum in 16 lanes (the sequential scalar max is one long dependency chain):
 * the largest value when no element is NaN - NaN when one is - and any zero maximum's sign
 * left to the caller's scalar loop, which alone fixes it (the first zero wins there).
 * Otherwise the maximum is order-free, so the same value. */

static inline float chunk_max(const float *x, Py_ssize_t n) {
    v16f mx = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY,
               -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY,
               -INFINITY, -INFINITY};
    v16i nan = {0};
    Py_ssize_t c = 0;
    for (; c + 16 <= n; c += 16) {
        v16f v;
        memcpy(&v, x + c, sizeof v);
        v16i gt = v > mx;
        nan |= v != v;
        mx = (v16f)(((v16i)v & gt) | ((v16i)mx & ~gt));
    }
    float m = -INFINITY;
    int any_nan = 0;
    for (int j = 0; j < 16; j++) {
        any_nan |= nan[j] != 0;
        m = mx[j] > m ? mx[j] : m;
    }
    for (; c < n; c++) {
        any_nan |= x[c] != x[c];
        m = x[c] > m ? x[c] : m;
    }
    return any_nan ? NAN : m;
}

CLONES static void xent_lse_loop(const float *x, float *lse, float *ta, float *tb,
                                 Py_ssize_t V, Py_ssize_t CH, Py_ssize_t r0, Py_ssize_t r1) {
    for (Py_ssize_t r = r0; r < r1; r++) {
        const float *xr = x + r * V;
        float m = -INFINITY, s = 0.0f;
        for (Py_ssize_t c0 = 0; c0 < V; c0 += CH) {
            Py_ssize_t n = V - c0 < CH ? V - c0 : CH;
            float cm = chunk_max(xr + c0, n);
            if (cm != cm || cm == 0.0f) {   /* a NaN, or a zero whose sign is the first's */
                cm = n < CH ? -INFINITY : xr[c0];
                for (Py_ssize_t c = 0; c < n; c++) {
                    float v = xr[c0 + c];
                    cm = (v > cm || v != v || cm != cm) ? (cm != cm ? cm : v) : cm;
                }
            }
            float mn = (m != m || cm != cm) ? NAN : (cm > m ? cm : m);
            for (Py_ssize_t c = 0; c < n; c++) ta[c] = exp1(xr[c0 + c] - mn);
            for (Py_ssize_t c = n; c < CH; c++) ta[c] = exp1(-INFINITY - mn);
            float cs = tree_row(ta, tb, CH, CH);
            float sc = s * exp1(m - mn);
            s = sc + cs;
            m = mn;
        }
        lse[r] = m + log1(s);
    }
}

static PyObject *py_xent_lse(PyObject *self, PyObject *args) {
    (void)self;
    int pieces = 1;
    Py_buffer x, lse;
    Py_ssize_t R, V, CH, r0, r1;
    if (!PyArg_ParseTuple(args, "y*w*nnnnn|i", &x, &lse, &R, &V, &CH, &r0, &r1,
                          &pieces))
        return NULL;
    int ok = R >= 0 && V > 0 && CH > 0 && (CH & (CH - 1)) == 0 && 0 <= r0 && r0 <= r1 &&
             r1 <= R && x.len == R * V * 4 && lse.len == R * 4;
    ok = ok && PIECES_OK(pieces);
    float *ta = NULL;
    if (ok && !(ta = malloc(sizeof(float) * 2 * CH * pieces))) ok = 0;
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        FOR_PIECES(r0, r1, pieces, xent_lse_loop(x.buf, lse.buf, ta + 2 * CH * piece,
                                                 ta + 2 * CH * piece + CH, V, CH, p_lo, p_hi));
        Py_END_ALLOW_THREADS
    }
    free(ta);
    return FINISH(ok, "xent_lse: inconsistent shapes or row range", &x, &lse);
}

EXT_METHODS(xent) = {
    {"xent_grad", py_xent_grad, METH_VARARGS,
     "xent_grad(x, t, lse, g, out, R, V, r0, r1[, pieces]): open1b_kernels.ops.xent's backward, "
     "float32."},
    {"xent_lse", py_xent_lse, METH_VARARGS,
     "xent_lse(x, lse, R, V, CH, r0, r1[, pieces]): open1b_kernels.ops.xent's row logsumexp "
     "(float32 rows)."},
    {NULL, NULL, 0, NULL},
};
