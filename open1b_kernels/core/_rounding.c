/* open1b_kernels.core.rounding's sum of bf16 tensors, compiled (add_bf16): the exact widenings,
 * the IEEE float32 adds in order and one rounding to bf16 - the torch code's operations, so
 * its bits (NaN payloads aside: section 4 of CONTRACT.md). Elements are independent. */
#include "_ext.h"
#include "_mathfn.h"

/* open1b_kernels.core.rounding.add_bf16 on elements [lo, hi): bf16((fp32(a) + fp32(b)) [+ fp32(c)]),
 * the exact widenings, the IEEE float32 adds in order and one rounding (bf16_rne1: torch's
 * conversion). c may be NULL (two operands). */
CLONES static void add_bf16_loop(const uint16_t *a, const uint16_t *b, const uint16_t *c,
                                 uint16_t *out, Py_ssize_t lo, Py_ssize_t hi) {
    if (c)
        for (Py_ssize_t i = lo; i < hi; i++)
            out[i] = bf16_rne1((widen_bf16(a[i]) + widen_bf16(b[i])) + widen_bf16(c[i]));
    else
        for (Py_ssize_t i = lo; i < hi; i++)
            out[i] = bf16_rne1(widen_bf16(a[i]) + widen_bf16(b[i]));
}

static PyObject *py_add_bf16(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer a, b, c, out;
    Py_ssize_t lo, hi;
    int pieces = 1;
    if (!PyArg_ParseTuple(args, "y*y*y*w*nn|i", &a, &b, &c, &out, &lo, &hi, &pieces))
        return NULL;
    Py_ssize_t n = a.len / 2;
    int ok = a.len % 2 == 0 && b.len == a.len && (c.len == 0 || c.len == a.len) &&
             out.len == a.len && 0 <= lo && lo <= hi && hi <= n;
    ok = ok && PIECES_OK(pieces);
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        FOR_PIECES(lo, hi, pieces, add_bf16_loop(a.buf, b.buf, c.len ? c.buf : NULL, out.buf,
                                                 p_lo, p_hi));
        Py_END_ALLOW_THREADS
    }
    return FINISH(ok, "add_bf16: need bf16 operands and output of one length", &a, &b, &c, &out);
}

EXT_METHODS(rounding) = {
    {"add_bf16", py_add_bf16, METH_VARARGS,
     "add_bf16(a, b, c, out, lo, hi[, pieces]): bf16((fp32(a) + fp32(b)) [+ fp32(c)]), bf16 "
     "bits."},
    {NULL, NULL, 0, NULL},
};
