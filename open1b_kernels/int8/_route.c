/* open1b_kernels.int8.route's float-route operand, compiled (widen_sq): an int8 matrix widened
 * to float32 (exact) with the exact int64 sums of squares of its rows or columns - the norms
 * that decide whether one float32 GEMM over the whole contraction is exact. Integer sums:
 * exact in any order and cut between threads. */
#include "../core/_ext.h"

#include <stdlib.h>
#include <string.h>

/* The float route's int8 GEMM operand (open1b_kernels.int8.route): rows [r0, r1) of a contiguous
 * int8 (R, C) matrix widened into float32 y (R, C), and the exact int64 sums of squares of
 * its rows (`rows`, R) or, for a transposed operand, of its columns (`cols`, this piece's own
 * C partial sums, added to) - the norms that decide whether one float32 GEMM over the whole
 * contraction is exact. Squares are at most 2^14: a row of C < 2^17 sums below 2^31 in
 * int32, columns are added into int32 `part` for 2^16 rows at a time (< 2^30) and then into
 * int64. One pass: the widening copy the GEMM needs anyway, with the sums beside it. */
#define SQ_ROWS_PER_PART 65536

CLONES static void widen_sq_loop(const int8_t *x, float *y, int64_t *rows, int64_t *cols,
                                 int32_t *part, Py_ssize_t C, Py_ssize_t r0, Py_ssize_t r1) {
    for (Py_ssize_t b0 = r0; b0 < r1; b0 += SQ_ROWS_PER_PART) {
        Py_ssize_t b1 = b0 + SQ_ROWS_PER_PART < r1 ? b0 + SQ_ROWS_PER_PART : r1;
        if (cols) memset(part, 0, sizeof(int32_t) * C);
        for (Py_ssize_t r = b0; r < b1; r++) {
            const int8_t *xr = x + r * C;
            float *yr = y + r * C;
            if (rows) {
                int64_t total = 0;
                for (Py_ssize_t c0 = 0; c0 < C; c0 += 65536) {   /* 2^16 squares < 2^31 */
                    Py_ssize_t c1 = c0 + 65536 < C ? c0 + 65536 : C;
                    int32_t rs = 0;
                    for (Py_ssize_t c = c0; c < c1; c++) {
                        int32_t v = xr[c];
                        yr[c] = (float)v;
                        rs += v * v;
                    }
                    total += rs;
                }
                rows[r] = total;
            } else {
                for (Py_ssize_t c = 0; c < C; c++) {
                    int32_t v = xr[c];
                    yr[c] = (float)v;
                    part[c] += v * v;
                }
            }
        }
        if (cols)
            for (Py_ssize_t c = 0; c < C; c++) cols[c] += part[c];
    }
}

static PyObject *py_widen_sq(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer src, y, rows, cols;
    Py_ssize_t R, C, r0, r1;
    int pieces = 1;
    if (!PyArg_ParseTuple(args, "y*w*w*w*nnnn|i", &src, &y, &rows, &cols, &R, &C, &r0, &r1,
                          &pieces))
        return NULL;
    int ok = R >= 0 && C >= 0 && 0 <= r0 && r0 <= r1 && r1 <= R && src.len == R * C &&
             y.len == R * C * 4 &&
             ((rows.len == R * 8 && cols.len == 0) ||
              (rows.len == 0 && cols.len == pieces * C * 8));
    ok = ok && PIECES_OK(pieces);
    int32_t *part = NULL;
    if (ok && cols.len &&
        !(part = malloc(sizeof(int32_t) * (size_t)(C > 0 ? C : 1) * pieces)))
        ok = 0;
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        FOR_PIECES(r0, r1, pieces,
                   widen_sq_loop(src.buf, y.buf, rows.len ? rows.buf : NULL,
                                 cols.len ? (int64_t *)cols.buf + piece * C : NULL,
                                 part ? part + piece * C : NULL, C, p_lo, p_hi));
        Py_END_ALLOW_THREADS
    }
    free(part);
    return FINISH(ok, "widen_sq: inconsistent shapes or row range", &src, &y, &rows, &cols);
}

EXT_METHODS(route) = {
    {"widen_sq", py_widen_sq, METH_VARARGS,
     "widen_sq(src, y, rows, cols, R, C, r0, r1[, pieces]): int8 -> float32 and exact sums of "
     "squares."},
    {NULL, NULL, 0, NULL},
};
