/* open1b_kernels.int8.hadamard's butterfly stages (hadamard_dim0_cpu_), compiled: one IEEE
 * float32 add and one subtract per element and stage, in the torch stage loop's order
 * (-ffp-contract=off: nothing fused or reassociated), so its bits; columns are independent,
 * so any cut between threads gives them too. */
#include "../core/_ext.h"

#include <string.h>

#include "_hadamard.h"

/* The butterfly stages h = 1, 2, ..., n/2 on the n rows base, base + stride, ...,
   base + (n - 1) * stride (a sub-transform: h counts in steps of `stride` rows), columns
   [c0, c1) of a row-major float32 buffer with C columns, in place. */
static inline void fwht_rows(float *y, Py_ssize_t C, Py_ssize_t base, Py_ssize_t stride,
                             Py_ssize_t n, Py_ssize_t c0, Py_ssize_t c1) {
    for (Py_ssize_t h = 1; h < n; h *= 2)
        for (Py_ssize_t g = 0; g < n; g += 2 * h)
            for (Py_ssize_t i = g; i < g + h; i++) {
                float *a = y + (base + i * stride) * C, *b = y + (base + (i + h) * stride) * C;
                for (Py_ssize_t c = c0; c < c1; c++) {
                    float x = a[c], z = b[c];
                    a[c] = x + z;
                    b[c] = x - z;
                }
            }
}

/* open1b_kernels.int8.hadamard.hadamard_dim0_cpu_'s butterflies on rows [r0, r1) (whole blocks
   of B rows) and columns [c0, c1) of a row-major float32 (R, C) buffer, in place: for
   h = 1, 2, ..., B/2, every pair (row i, row i + h) of each aligned 2h-row group becomes
   (a + b, a - b), one IEEE float32 add and one subtract per element (built with
   -ffp-contract=off: nothing fused or reassociated). The same operations on the same
   operands as the torch stage loop, so the same bits; the normalization stays in torch.
   Why two passes: the stages h < L = 16 pair rows inside each aligned group of L rows, and
   the stages h >= L pair rows of the same residue mod L, so a block is L transforms of L
   rows each, then L transforms of B / L rows (stride L) - every element meets the same
   operands in the same stage order, and each group (L rows of the strip: a few KB) stays
   in L1 through its stages instead of every stage sweeping the whole block. */

static inline __attribute__((always_inline)) void fwht16_vec(float *p, Py_ssize_t s) {
    v16f v[16];
    for (int i = 0; i < 16; i++) memcpy(&v[i], p + i * s, sizeof(v16f));
    stages16(v);
    for (int i = 0; i < 16; i++) memcpy(p + i * s, &v[i], sizeof(v16f));
}

/* fwht_rows for n = 16 rows (stride `stride` rows): whole 16-column vectors in registers,
 * the columns left over by the scalar loop. */
static inline __attribute__((always_inline)) void fwht16(float *y, Py_ssize_t C, Py_ssize_t base, Py_ssize_t stride,
                          Py_ssize_t c0, Py_ssize_t c1) {
    Py_ssize_t c = c0;
    for (; c + 16 <= c1; c += 16) fwht16_vec(y + base * C + c, stride * C);
    if (c < c1) fwht_rows(y, C, base, stride, 16, c, c1);
}

CLONES void hadamard_stages(float *y, Py_ssize_t C, Py_ssize_t r0, Py_ssize_t r1, Py_ssize_t B,
                            Py_ssize_t c0, Py_ssize_t c1) {
    const Py_ssize_t L = B < 16 ? B : 16;
    for (Py_ssize_t base = r0; base < r1; base += B) {
        for (Py_ssize_t q = 0; q < B; q += L) {
            if (L == 16) fwht16(y, C, base + q, 1, c0, c1);
            else fwht_rows(y, C, base + q, 1, L, c0, c1);
        }
        if (B > L)
            for (Py_ssize_t j = 0; j < L; j++) {
                if (B / L == 16) fwht16(y, C, base + j, L, c0, c1);
                else fwht_rows(y, C, base + j, L, B / L, c0, c1);
            }
    }
}

static PyObject *py_fwht_dim0(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer buf;
    Py_ssize_t R, C, r0, r1, B, c0, c1;
    int pieces = 1;
    if (!PyArg_ParseTuple(args, "w*nnnnnnn|i", &buf, &R, &C, &r0, &r1, &B, &c0, &c1, &pieces))
        return NULL;
    int ok = B >= 2 && (B & (B - 1)) == 0 && 0 <= r0 && r0 <= r1 && r1 <= R &&
             r0 % B == 0 && (r1 - r0) % B == 0 && 0 <= c0 && c0 <= c1 && c1 <= C &&
             buf.len == R * C * 4;
    ok = ok && PIECES_OK(pieces);
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        FOR_PIECES(c0, c1, pieces, hadamard_stages((float *)buf.buf, C, r0, r1, B, p_lo, p_hi));
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&buf);
    if (!ok) {
        PyErr_SetString(PyExc_ValueError, "fwht_dim0: inconsistent shapes or buffer size");
        return NULL;
    }
    Py_RETURN_NONE;
}

EXT_METHODS(hadamard) = {
    {"fwht_dim0", py_fwht_dim0, METH_VARARGS,
     "fwht_dim0(buf, R, C, r0, r1, B, c0, c1[, pieces]): Hadamard butterflies along dim 0, in "
     "place."},
    {NULL, NULL, 0, NULL},
};
