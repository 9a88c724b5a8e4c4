/* open1b_kernels.core.reduce's pairwise tree, compiled (_reduce.h): along the rows of a matrix
 * (tree_rows) and over the aligned blocks of one long vector (tree_blocks: the first levels of
 * the blockable tree) - the definition's adds in its order, so its bits; rows and blocks are
 * independent, so any cut between threads gives them too. */
#include "_ext.h"

#include <stdlib.h>
#include <string.h>

#include "_reduce.h"

/* open1b_kernels.core.reduce's pairwise tree along the last dim of a contiguous float32 (R, N)
 * matrix, rows [r0, r1) into out (R,): each row zero-padded to P = next_pow2(N) and summed
 * by tree_row - the definition's adds in its order (adjacent pairs, level by level). */
static PyObject *py_tree_rows(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer x, out;
    Py_ssize_t R, N, r0, r1;
    int pieces = 1;
    if (!PyArg_ParseTuple(args, "y*w*nnnn|i", &x, &out, &R, &N, &r0, &r1, &pieces))
        return NULL;
    Py_ssize_t P = pow2_ceil(N);
    int ok = R >= 0 && N >= 1 && N <= (1 << 24) && x.len == R * N * 4 && out.len == R * 4 &&
             0 <= r0 && r0 <= r1 && r1 <= R;
    ok = ok && PIECES_OK(pieces);
    float *scratch = NULL;
    if (ok && !(scratch = malloc(sizeof(float) * 2 * P * pieces))) ok = 0;
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        FOR_PIECES(r0, r1, pieces, {
            float *ta = scratch + 2 * P * piece, *tb = ta + P;
            for (Py_ssize_t r = p_lo; r < p_hi; r++) {
                memcpy(ta, (const float *)x.buf + r * N, sizeof(float) * N);
                ((float *)out.buf)[r] = tree_row(ta, tb, N, P);
            }
        });
        Py_END_ALLOW_THREADS
    }
    free(scratch);
    return FINISH(ok, "tree_rows: inconsistent shapes or row range", &x, &out);
}

/* open1b_kernels.core.reduce's pairwise tree over one float32 vector x (n values), blocked: the
 * sums of the aligned blocks [lo, hi) of B values (a power of two; the last real block and
 * any block past n padded with +0.0, as the definition pads to P = next_pow2(n)) into
 * partials[b] - the tree's first log2(B) levels, the same adds in the same order
 * (tree_row). The caller then sums the P / B partials by the same tree. */
static PyObject *py_tree_blocks(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer x, partials;
    Py_ssize_t n, B, lo, hi;
    int pieces = 1;
    if (!PyArg_ParseTuple(args, "y*w*nnnn|i", &x, &partials, &n, &B, &lo, &hi, &pieces))
        return NULL;
    Py_ssize_t P = pow2_ceil(n);
    int ok = n > 0 && B >= 2 && B <= (1 << 20) && (B & (B - 1)) == 0 && B <= P &&
             x.len == n * 4 && partials.len == (P / B) * 4 && 0 <= lo && lo <= hi &&
             hi <= P / B;
    ok = ok && PIECES_OK(pieces);
    float *scratch = NULL;
    if (ok && !(scratch = malloc(sizeof(float) * 2 * B * pieces))) ok = 0;
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        FOR_PIECES(lo, hi, pieces, {
            float *ta = scratch + 2 * B * piece, *tb = ta + B;
            const float *xs = x.buf;
            for (Py_ssize_t b = p_lo; b < p_hi; b++) {
                Py_ssize_t a0 = b * B, m = a0 >= n ? 0 : (n - a0 < B ? n - a0 : B);
                if (m) memcpy(ta, xs + a0, sizeof(float) * m);
                ((float *)partials.buf)[b] = tree_row(ta, tb, m, B);
            }
        });
        Py_END_ALLOW_THREADS
    }
    free(scratch);
    return FINISH(ok, "tree_blocks: inconsistent sizes or block range", &x, &partials);
}

EXT_METHODS(reduce) = {
    {"tree_rows", py_tree_rows, METH_VARARGS,
     "tree_rows(x, out, R, N, r0, r1[, pieces]): open1b_kernels.core.reduce's tree along each row."},
    {"tree_blocks", py_tree_blocks, METH_VARARGS,
     "tree_blocks(x, partials, n, B, lo, hi[, pieces]): the tree over aligned blocks of B."},
    {NULL, NULL, 0, NULL},
};
