/* open1b_kernels.core.mathfn's exp, log and erfinv, compiled: one element at a time in a vectorized
 * loop, each element by _mathfn.h's exp1 / log1 / erfinv1 - exactly mathfn's float32 operations in
 * its order (-ffp-contract=off, no -ffast-math: setup.py) - instead of torch's one full pass
 * per operation (~30 passes for exp). tests/kernels/test_mathc.py compares them
 * with the torch code on every class of input (normals, subnormals, zeros, infinities, NaN,
 * the clamp edges).
 *
 * Exactness rules every float loop of the extensions relies on (setup.py's flags):
 *   - every float expression is evaluated in float32 (x86-64 SSE / AArch64: no excess
 *     precision), one IEEE operation at a time, round to nearest even;
 *   - no contraction of a*b+c into a fused multiply-add (-ffp-contract=off), no
 *     reassociation or other value-changing optimization (no -ffast-math);
 *   - float <-> int conversions only of integral, in-range values; bit patterns via memcpy.
 */
#include "_ext.h"
#include "_mathfn.h"

/* One loop per function (not a function pointer): the body inlines and vectorizes. */
#define UNARY(NAME, FN)                                                                  \
    CLONES static void loop_##NAME(const float *restrict a, float *restrict b,           \
                                   Py_ssize_t n) {                                        \
        for (Py_ssize_t i = 0; i < n; i++) b[i] = FN(a[i]);                               \
    }                                                                                     \
    static PyObject *py_##NAME(PyObject *self, PyObject *args) {                         \
        (void)self;                                                                       \
        Py_buffer src, dst;                                                               \
        int pieces = 1;                                                                   \
        if (!PyArg_ParseTuple(args, "y*w*|i", &src, &dst, &pieces)) return NULL;          \
        int ok = src.len == dst.len && src.len % 4 == 0 && PIECES_OK(pieces);             \
        if (ok) {                                                                         \
            Py_ssize_t n = src.len / 4;                                                   \
            Py_BEGIN_ALLOW_THREADS                                                        \
            FOR_PIECES(0, n, pieces, loop_##NAME((const float *)src.buf + p_lo,           \
                                                 (float *)dst.buf + p_lo, p_hi - p_lo));   \
            Py_END_ALLOW_THREADS                                                          \
        }                                                                                 \
        return FINISH(ok, "need equal float32 buffers, 1..4096 pieces", &src, &dst);     \
    }

UNARY(exp, exp1)
UNARY(log, log1)
UNARY(erfinv, erfinv1)

EXT_METHODS(mathfn) = {
    {"exp", py_exp, METH_VARARGS, "exp(src, dst[, pieces]): mathfn.exp of float32 src into dst."},
    {"log", py_log, METH_VARARGS, "log(src, dst[, pieces]): mathfn.log of float32 src into dst."},
    {"erfinv", py_erfinv, METH_VARARGS,
     "erfinv(src, dst[, pieces]): mathfn.erfinv of float32 src into dst."},
    {NULL, NULL, 0, NULL},
};
