/* open1b_kernels.ops.adamw's CPU update, compiled: the torch code's float32 operations in its
 * order, each rounded once (-ffp-contract=off), the square root correctly rounded; elements
 * independent: the same bits. */
#include "../core/_ext.h"

#include <math.h>

#include "../core/_mathfn.h"

/* open1b_kernels.ops.adamw's CPU update (adamw_step_cpu_) on elements [lo, hi), in place: the
 * torch code's float32 operations in its order, each rounded once (no contraction) -
 * m = m * b1 + g * c1, v = v * b2 + (g * g) * c2, u = (m * a) / (sqrt_rn(v) * r2 + eps)
 * with sqrt_rn(v) = float(sqrt(double(v))) (correctly rounded, as open1b_kernels.core.rounding's),
 * p = p * decay - u, stored as bf16 (bf16_rne1: torch's conversion) or float32. k holds
 * (a, r2, decay, b1, b2, c1, c2, eps). NaN payloads are outside the contract: the trainer
 * refuses a non-finite gradient before its update. */
CLONES static void adamw_loop(void *param, int p_bf16, const float *g, float *m, float *v,
                              const float *k, Py_ssize_t lo, Py_ssize_t hi) {
    const float a = k[0], r2 = k[1], decay = k[2], b1 = k[3], b2 = k[4], c1 = k[5], c2 = k[6],
                eps = k[7];
    for (Py_ssize_t i = lo; i < hi; i++) {
        float p = p_bf16 ? widen_bf16(((uint16_t *)param)[i]) : ((float *)param)[i];
        float gi = g[i];
        float mi = m[i] * b1 + gi * c1;
        float vi = v[i] * b2 + (gi * gi) * c2;
        float den = (float)sqrt((double)vi) * r2 + eps;
        float u = (mi * a) / den;
        p = p * decay - u;
        m[i] = mi;
        v[i] = vi;
        if (p_bf16)
            ((uint16_t *)param)[i] = bf16_rne1(p);
        else
            ((float *)param)[i] = p;
    }
}

static PyObject *py_adamw(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer param, g, m, v;
    int p_bf16, pieces = 1;
    float k[8];
    Py_ssize_t n, lo, hi;
    if (!PyArg_ParseTuple(args, "w*py*w*w*ffffffffnnn|i", &param, &p_bf16, &g, &m, &v, &k[0],
                          &k[1], &k[2], &k[3], &k[4], &k[5], &k[6], &k[7], &n, &lo, &hi,
                          &pieces))
        return NULL;
    int ok = n >= 0 && 0 <= lo && lo <= hi && hi <= n && param.len == n * (p_bf16 ? 2 : 4) &&
             g.len == n * 4 && m.len == n * 4 && v.len == n * 4;
    ok = ok && PIECES_OK(pieces);
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        FOR_PIECES(lo, hi, pieces, adamw_loop(param.buf, p_bf16, g.buf, m.buf, v.buf, k, p_lo,
                                              p_hi));
        Py_END_ALLOW_THREADS
    }
    return FINISH(ok, "adamw: inconsistent sizes or range", &param, &g, &m, &v);
}

EXT_METHODS(adamw) = {
    {"adamw", py_adamw, METH_VARARGS,
     "adamw(param, p_bf16, g, m, v, a, r2, decay, b1, b2, c1, c2, eps, n, lo, hi[, pieces]): "
     "open1b_kernels.ops.adamw's update, in place."},
    {NULL, NULL, 0, NULL},
};
