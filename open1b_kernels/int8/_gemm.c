/* open1b_kernels.int8.gemm's CPU epilogue, compiled: the dequantization of an int32 GEMM result
 * (two float32 multiplies in torch's order, never fused) with the exactness guard's sums
 * read in the same pass (dequant), and the float32 -> bf16 rounding by bit arithmetic
 * (bf16_rne) - the torch code's operations, so its bits, rows independent. */
#include "../core/_ext.h"

#include "../core/_mathfn.h"

CLONES static void bf16_rne_loop(const float *x, uint16_t *out, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) out[i] = bf16_rne1(x[i]);
}

/* open1b_kernels.int8.gemm.dequantize_cpu fused with the guard's sums (open1b_kernels.int8.checksum), rows
 * [r0, r1) of an int32 GEMM result acc (R, C): y = (float)acc (int32 -> float32, round to
 * nearest even, as torch's conversion), y = y * rs[row] (or rs[0] when per_row is 0), then
 * y = y * cs[c] - two float32 multiplies in torch's order, never fused - stored as float32
 * or as bf16 bits (bf16_rne1). With `rows`, also acc's exact int64 row sums and this piece's
 * column sums (`cols`, added to), read while the row is in cache. */
CLONES static void dequant_loop(const int32_t *acc, const float *rs, int per_row,
                                const float *cs, float *out32, uint16_t *out16, int64_t *rows,
                                int64_t *cols, Py_ssize_t C, Py_ssize_t r0, Py_ssize_t r1) {
    for (Py_ssize_t r = r0; r < r1; r++) {
        const int32_t *x = acc + r * C;
        float s = rs[per_row ? r : 0];
        if (out16) {
            uint16_t *o = out16 + r * C;
            for (Py_ssize_t c = 0; c < C; c++) {
                float y = (float)x[c];
                y = y * s;
                y = y * cs[c];
                o[c] = bf16_rne1(y);
            }
        } else {
            float *o = out32 + r * C;
            for (Py_ssize_t c = 0; c < C; c++) {
                float y = (float)x[c];
                y = y * s;
                o[c] = y * cs[c];
            }
        }
        if (rows) {
            int64_t sum = 0;
            for (Py_ssize_t c = 0; c < C; c++) {
                sum += x[c];
                cols[c] += x[c];
            }
            rows[r] = sum;
        }
    }
}

static PyObject *py_dequant(PyObject *self, PyObject *args) {
    (void)self;
    int pieces = 1;
    Py_buffer acc, rs, cs, out, rows, cols;
    Py_ssize_t R, C, r0, r1;
    int out_bf16;
    if (!PyArg_ParseTuple(args, "y*y*y*w*pw*w*nnnn|i", &acc, &rs, &cs, &out, &out_bf16, &rows,
                          &cols, &R, &C, &r0, &r1, &pieces))
        return NULL;
    int per_row = rs.len == R * 4;
    int ok = R >= 0 && C >= 0 && 0 <= r0 && r0 <= r1 && r1 <= R && acc.len == R * C * 4 &&
             (per_row || rs.len == 4) && cs.len == C * 4 &&
             out.len == R * C * (out_bf16 ? 2 : 4) &&
             ((rows.len == R * 8 && cols.len == pieces * C * 8) ||
              (rows.len == 0 && cols.len == 0));
    ok = ok && PIECES_OK(pieces);
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        FOR_PIECES(r0, r1, pieces,
                   dequant_loop(acc.buf, rs.buf, per_row, cs.buf, out_bf16 ? NULL : out.buf,
                                out_bf16 ? out.buf : NULL, rows.len ? rows.buf : NULL,
                                cols.len ? (int64_t *)cols.buf + piece * C : NULL, C,
                                p_lo, p_hi));
        Py_END_ALLOW_THREADS
    }
    return FINISH(ok, "dequant: inconsistent shapes or row range", &acc, &rs, &cs, &out, &rows, &cols);
}

static PyObject *py_bf16_rne(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer src, dst;
    int pieces = 1;
    if (!PyArg_ParseTuple(args, "y*w*|i", &src, &dst, &pieces)) return NULL;
    int ok = pieces >= 1 && pieces <= PIECES_MAX && src.len % 4 == 0 && dst.len * 2 == src.len;
    ok = ok && PIECES_OK(pieces);
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        FOR_PIECES(0, src.len / 4, pieces, bf16_rne_loop((const float *)src.buf + p_lo,
                                                         (uint16_t *)dst.buf + p_lo,
                                                         p_hi - p_lo));
        Py_END_ALLOW_THREADS
    }
    return FINISH(ok, "bf16_rne: need float32 src and bf16 dst of one length", &src, &dst);
}

EXT_METHODS(gemm) = {
    {"dequant", py_dequant, METH_VARARGS,
     "dequant(acc, rs, cs, out, out_bf16, rows, cols, R, C, r0, r1[, pieces]): "
     "open1b_kernels.int8.gemm's dequantization, with the guard's row and column sums when "
     "rows/cols are non-empty."},
    {"bf16_rne", py_bf16_rne, METH_VARARGS,
     "bf16_rne(src, dst[, pieces]): float32 -> bf16 bits (RNE)."},
    {NULL, NULL, 0, NULL},
};
