/* open1b_kernels.ops.swiglu's CPU reference, compiled: the torch code's float32 operations in
 * its order (exp by ../core/_mathfn.h's exp1, mathfn.exp's), rows independent: the same bits. */
#include "../core/_ext.h"

#include "../core/_mathfn.h"

/* open1b_kernels.ops.swiglu's CPU reference on rows [r0, r1) of the fused gate|up h (R, 2F), bf16
 * bits, one output row at a time: the torch code's float32 operations in its order (exp is
 * exp1, mathfn.exp's), each result rounded once to bf16 (bf16_rne1; NaN payloads are outside
 * the op's contract). Forward: y = (g / (exp(-g) + 1)) * u. Backward, with dy (R, F):
 * den = exp(-g) + 1, s = g / den, sig = 1 / den, dsilu = sig * ((g * (1 - sig)) + 1),
 * dh = [(dy * u) * dsilu | dy * s]. */
CLONES static void swiglu_loop(const uint16_t *h, const uint16_t *dy, uint16_t *out,
                               Py_ssize_t F, Py_ssize_t r0, Py_ssize_t r1) {
    for (Py_ssize_t r = r0; r < r1; r++) {
        const uint16_t *gr = h + r * 2 * F, *ur = gr + F;
        if (!dy) {
            uint16_t *o = out + r * F;
            for (Py_ssize_t c = 0; c < F; c++) {
                float g = widen_bf16(gr[c]), u = widen_bf16(ur[c]);
                float den = exp1(-g) + 1.0f;
                o[c] = bf16_rne1((g / den) * u);
            }
        } else {
            const uint16_t *dr = dy + r * F;
            uint16_t *og = out + r * 2 * F, *ou = og + F;
            for (Py_ssize_t c = 0; c < F; c++) {
                float g = widen_bf16(gr[c]), u = widen_bf16(ur[c]), d = widen_bf16(dr[c]);
                float den = exp1(-g) + 1.0f;
                float sv = g / den;
                float sig = 1.0f / den;
                float dsilu = sig * ((g * (1.0f - sig)) + 1.0f);
                og[c] = bf16_rne1((d * u) * dsilu);
                ou[c] = bf16_rne1(d * sv);
            }
        }
    }
}

static PyObject *py_swiglu(PyObject *self, PyObject *args) {
    (void)self;
    int pieces = 1;
    Py_buffer h, dy, out;
    Py_ssize_t R, F, r0, r1;
    if (!PyArg_ParseTuple(args, "y*y*w*nnnn|i", &h, &dy, &out, &R, &F, &r0, &r1,
                          &pieces))
        return NULL;
    int bwd = dy.len != 0;
    int ok = R >= 0 && F >= 0 && 0 <= r0 && r0 <= r1 && r1 <= R && h.len == R * 2 * F * 2 &&
             (!bwd || dy.len == R * F * 2) && out.len == R * F * 2 * (bwd ? 2 : 1);
    ok = ok && PIECES_OK(pieces);
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        FOR_PIECES(r0, r1, pieces,
                   swiglu_loop(h.buf, bwd ? dy.buf : NULL, out.buf, F, p_lo, p_hi));
        Py_END_ALLOW_THREADS
    }
    return FINISH(ok, "swiglu: inconsistent shapes or row range", &h, &dy, &out);
}

EXT_METHODS(swiglu) = {
    {"swiglu", py_swiglu, METH_VARARGS,
     "swiglu(h, dy, out, R, F, r0, r1[, pieces]): open1b_kernels.ops.swiglu's rows (backward "
     "when dy is non-empty)."},
    {NULL, NULL, 0, NULL},
};
