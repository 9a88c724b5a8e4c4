/* open1b_kernels.ops.rope's CPU rotation, compiled: the torch code's float32 operations in its
 * order, each product rounded, never fused; rows independent: the same bits. */
#include "../core/_ext.h"

#include "../core/_mathfn.h"

/* open1b_kernels.ops.rope's CPU rotation (_rotate_cpu) for bf16 x (rows of D = 2 half, one row per
 * (batch, token, head), H heads per token, T tokens), rows [r0, r1): with c = cos[t, i] and
 * s = sin[t, i] * sign (sign +-1: exact), y1 = x1 * c - x2 * s and y2 = x2 * c + x1 * s,
 * each product rounded, then one add or subtract, never fused; rounded once to bf16. */
CLONES static void rope_loop(const uint16_t *x, const float *cosv, const float *sinv,
                             float sign, uint16_t *out, Py_ssize_t T, Py_ssize_t H,
                             Py_ssize_t half, Py_ssize_t r0, Py_ssize_t r1) {
    for (Py_ssize_t r = r0; r < r1; r++) {
        Py_ssize_t t = (r / H) % T;
        const uint16_t *xr = x + r * 2 * half;
        uint16_t *o = out + r * 2 * half;
        const float *c = cosv + t * half, *sn = sinv + t * half;
        for (Py_ssize_t i = 0; i < half; i++) {
            float x1 = widen_bf16(xr[i]), x2 = widen_bf16(xr[half + i]);
            float ci = c[i], si = sn[i] * sign;
            float a = x1 * ci, b = x2 * si;
            o[i] = bf16_rne1(a - b);
            float e = x2 * ci, f = x1 * si;
            o[half + i] = bf16_rne1(e + f);
        }
    }
}

static PyObject *py_rope(PyObject *self, PyObject *args) {
    (void)self;
    int pieces = 1;
    Py_buffer x, cs, sn, out;
    Py_ssize_t R, T, H, half, r0, r1;
    float sign;
    if (!PyArg_ParseTuple(args, "y*y*y*fw*nnnnnn|i", &x, &cs, &sn, &sign, &out, &R, &T, &H,
                          &half, &r0, &r1, &pieces))
        return NULL;
    int ok = R >= 0 && T > 0 && H > 0 && half >= 0 && R % (T * H) == 0 && 0 <= r0 &&
             r0 <= r1 && r1 <= R && x.len == R * 2 * half * 2 && out.len == x.len &&
             cs.len == T * half * 4 && sn.len == T * half * 4 && (sign == 1.0f || sign == -1.0f);
    ok = ok && PIECES_OK(pieces);
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        FOR_PIECES(r0, r1, pieces, rope_loop(x.buf, cs.buf, sn.buf, sign, out.buf, T, H, half,
                                             p_lo, p_hi));
        Py_END_ALLOW_THREADS
    }
    return FINISH(ok, "rope: inconsistent shapes, sign or row range", &x, &cs, &sn, &out);
}

EXT_METHODS(rope) = {
    {"rope", py_rope, METH_VARARGS,
     "rope(x, cos, sin, sign, out, R, T, H, half, r0, r1[, pieces]): open1b_kernels.ops.rope's "
     "CPU rotation of bf16 rows."},
    {NULL, NULL, 0, NULL},
};
