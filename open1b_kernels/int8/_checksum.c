/* open1b_kernels.int8.checksum's exact sums, compiled: row and column sums of an int32 GEMM
 * result or an int8 matrix (int_sums) and the int8 matrix-vector products of the guard
 * (mv_int8) - integer arithmetic whose every partial sum the caller bounds, so exact in any
 * order, blocking and cut between threads. */
#include "../core/_ext.h"

#include <stdlib.h>
#include <string.h>

/* The exactness guard's sums (open1b_kernels.int8.checksum): row sums (R,) and column sums (C,) of
 * an int32 (R, C) GEMM result, or (acc = NULL) of an int8 (R, C) matrix - integer
 * arithmetic, exact in any order. Rows [r0, r1); `cols` is this piece's own partial sum
 * (added to) or NULL (row sums only), `rows` may be NULL. int8 columns are summed 256 rows
 * at a time into int16 (|sum| <= 128 * 256 = 2^15: exact) in `part` (C int16 of scratch,
 * in L1/L2 for the rows' pass) and then added into the int64 sums: 1/8 of the bytes an
 * int64 accumulator moves per row. */
#define INT8_ROWS_PER_PART 255   /* 255 * 128 < 2^15: an int16 never overflows */

CLONES static void int_sums_loop(const int32_t *acc, const int8_t *a8, int64_t *rows,
                                 int64_t *cols, int16_t *part, Py_ssize_t C, Py_ssize_t r0,
                                 Py_ssize_t r1) {
    if (acc) {
        for (Py_ssize_t r = r0; r < r1; r++) {
            const int32_t *x = acc + r * C;
            int64_t rs = 0;
            if (cols)
                for (Py_ssize_t c = 0; c < C; c++) {
                    rs += x[c];
                    cols[c] += x[c];
                }
            else
                for (Py_ssize_t c = 0; c < C; c++) rs += x[c];
            if (rows) rows[r] = rs;
        }
        return;
    }
    for (Py_ssize_t b0 = r0; b0 < r1; b0 += INT8_ROWS_PER_PART) {
        Py_ssize_t b1 = b0 + INT8_ROWS_PER_PART < r1 ? b0 + INT8_ROWS_PER_PART : r1;
        if (cols) memset(part, 0, sizeof(int16_t) * C);
        for (Py_ssize_t r = b0; r < b1; r++) {
            const int8_t *x = a8 + r * C;
            if (rows && C < (1 << 23)) {      /* |sum| < 2^7 * 2^23 = 2^30: int32 is exact */
                int32_t rs = 0;
                for (Py_ssize_t c = 0; c < C; c++) rs += x[c];
                rows[r] = rs;
            } else if (rows) {
                int64_t rs = 0;
                for (Py_ssize_t c = 0; c < C; c++) rs += x[c];
                rows[r] = rs;
            }
            if (cols)
                for (Py_ssize_t c = 0; c < C; c++) part[c] = (int16_t)(part[c] + x[c]);
        }
        if (cols)
            for (Py_ssize_t c = 0; c < C; c++) cols[c] += part[c];
    }
}

static PyObject *py_int_sums(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer src, rows, cols;
    Py_ssize_t R, C, r0, r1;
    int is_int8, pieces = 1;
    if (!PyArg_ParseTuple(args, "y*pw*w*nnnn|i", &src, &is_int8, &rows, &cols, &R, &C, &r0, &r1,
                          &pieces))
        return NULL;
    int ok = R >= 0 && C >= 0 && 0 <= r0 && r0 <= r1 && r1 <= R &&
             src.len == R * C * (is_int8 ? 1 : 4) && (rows.len == R * 8 || rows.len == 0) &&
             (cols.len == pieces * C * 8 || (cols.len == 0 && rows.len != 0));
    ok = ok && PIECES_OK(pieces);
    int16_t *part = NULL;
    if (ok && is_int8 && cols.len &&
        !(part = malloc(sizeof(int16_t) * (size_t)(C > 0 ? C : 1) * pieces)))
        ok = 0;
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        FOR_PIECES(r0, r1, pieces,
                   int_sums_loop(is_int8 ? NULL : src.buf, is_int8 ? src.buf : NULL,
                                 rows.len ? rows.buf : NULL,
                                 cols.len ? (int64_t *)cols.buf + piece * C : NULL,
                                 part ? part + piece * C : NULL, C, p_lo, p_hi));
        Py_END_ALLOW_THREADS
    }
    free(part);
    return FINISH(ok, "int_sums: inconsistent shapes or row range", &src, &rows, &cols);
}

/* The exactness guard's products: out[r] = sum_k a[r, k] * v[k] in int64 (exact: the
 * caller bounds every sum below 2^63) for rows [r0, r1) of an int8 (R, K) matrix - stored
 * row-major, or (transposed) as the row-major (K, R) storage of a transposed view.
 * With `vl`, `vh` (given when every |v[k]| < 2^31: v = vh * 2^16 + vl, 0 <= vl < 2^16,
 * |vh| < 2^15) the products run in int32 over blocks of MV_BLOCK steps - |a * vl| < 2^23
 * and |a * vh| < 2^22, so a block's sums stay below 2^30 - and each block's two sums go
 * into the int64 total as sh * 2^16 + sl: the same integers, at int32's vector rates (x86
 * multiplies int64 lanes only with AVX-512DQ); a transposed matrix's storage rows go four at
 * a time through each pass over the row sums (one at a time, the LM head's weighted check
 * of a transposed logits gradient took twice as long as in int16: 16 against 8 ms for 2,048
 * x 16,384, now 8). With `v16` (given when every |v[k]| < 2^15,
 * the common case: v is a column sum of slices over a few hundred rows) one int16 product
 * per element, |a * v| < 2^22, blocks of MV_BLOCK steps summing below 2^29 in int32 (one
 * multiply-add of int16 pairs per two elements on x86). */
#define MV_BLOCK 128

static void mv_int8_loop16(const int8_t *a, const int16_t *v16, int64_t *out, int32_t *tl,
                           Py_ssize_t R, Py_ssize_t K, int transposed, Py_ssize_t r0,
                           Py_ssize_t r1);

CLONES static void mv_int8_loop(const int8_t *a, const int64_t *v, const int32_t *vl,
                                const int32_t *vh, int64_t *out, int32_t *tl, int32_t *th,
                                Py_ssize_t R, Py_ssize_t K, int transposed, Py_ssize_t r0,
                                Py_ssize_t r1) {
    if (vl && !transposed) {
        for (Py_ssize_t r = r0; r < r1; r++) {
            const int8_t *x = a + r * K;
            int64_t acc = 0;
            for (Py_ssize_t k0 = 0; k0 < K; k0 += MV_BLOCK) {
                Py_ssize_t k1 = k0 + MV_BLOCK < K ? k0 + MV_BLOCK : K;
                int32_t sl = 0, sh = 0;
                for (Py_ssize_t k = k0; k < k1; k++) {
                    sl += (int32_t)x[k] * vl[k];
                    sh += (int32_t)x[k] * vh[k];
                }
                acc += (int64_t)sh * 65536 + sl;
            }
            out[r] = acc;
        }
        return;
    }
    if (vl) {                               /* tl, th: r1 - r0 int32 of this piece's scratch */
        for (Py_ssize_t r = r0; r < r1; r++) out[r] = 0;
        for (Py_ssize_t k0 = 0; k0 < K; k0 += MV_BLOCK) {
            Py_ssize_t k1 = k0 + MV_BLOCK < K ? k0 + MV_BLOCK : K;
            for (Py_ssize_t r = r0; r < r1; r++) tl[r - r0] = th[r - r0] = 0;
            Py_ssize_t k = k0;
            for (; k + 4 <= k1; k += 4) {   /* four storage rows per pass over the sums */
                const int8_t *x0 = a + k * R, *x1 = x0 + R, *x2 = x1 + R, *x3 = x2 + R;
                int32_t l0 = vl[k], l1 = vl[k + 1], l2 = vl[k + 2], l3 = vl[k + 3];
                int32_t h0 = vh[k], h1 = vh[k + 1], h2 = vh[k + 2], h3 = vh[k + 3];
                for (Py_ssize_t r = r0; r < r1; r++) {
                    int32_t y0 = x0[r], y1 = x1[r], y2 = x2[r], y3 = x3[r];
                    tl[r - r0] += y0 * l0 + y1 * l1 + y2 * l2 + y3 * l3;
                    th[r - r0] += y0 * h0 + y1 * h1 + y2 * h2 + y3 * h3;
                }
            }
            for (; k < k1; k++) {
                const int8_t *x = a + k * R;
                int32_t lk = vl[k], hk = vh[k];
                for (Py_ssize_t r = r0; r < r1; r++) {
                    tl[r - r0] += (int32_t)x[r] * lk;
                    th[r - r0] += (int32_t)x[r] * hk;
                }
            }
            for (Py_ssize_t r = r0; r < r1; r++)
                out[r] += (int64_t)th[r - r0] * 65536 + tl[r - r0];
        }
        return;
    }
    if (!transposed) {
        for (Py_ssize_t r = r0; r < r1; r++) {
            const int8_t *x = a + r * K;
            int64_t acc = 0;
            for (Py_ssize_t k = 0; k < K; k++) acc += (int64_t)x[k] * v[k];
            out[r] = acc;
        }
        return;
    }
    for (Py_ssize_t r = r0; r < r1; r++) out[r] = 0;
    for (Py_ssize_t k = 0; k < K; k++) {
        const int8_t *x = a + k * R;
        int64_t vk = v[k];
        for (Py_ssize_t r = r0; r < r1; r++) out[r] += (int64_t)x[r] * vk;
    }
}

CLONES static void mv_int8_loop16(const int8_t *a, const int16_t *v16, int64_t *out,
                                  int32_t *tl, Py_ssize_t R, Py_ssize_t K, int transposed,
                                  Py_ssize_t r0, Py_ssize_t r1) {
    if (!transposed) {
        for (Py_ssize_t r = r0; r < r1; r++) {
            const int8_t *x = a + r * K;
            int64_t acc = 0;
            for (Py_ssize_t k0 = 0; k0 < K; k0 += MV_BLOCK) {
                Py_ssize_t k1 = k0 + MV_BLOCK < K ? k0 + MV_BLOCK : K;
                int32_t sum = 0;
                for (Py_ssize_t k = k0; k < k1; k++)
                    sum += (int32_t)(int16_t)x[k] * (int32_t)v16[k];
                acc += sum;
            }
            out[r] = acc;
        }
        return;
    }
    for (Py_ssize_t r = r0; r < r1; r++) out[r] = 0;     /* tl: r1 - r0 int32 of scratch */
    for (Py_ssize_t k0 = 0; k0 < K; k0 += MV_BLOCK) {
        Py_ssize_t k1 = k0 + MV_BLOCK < K ? k0 + MV_BLOCK : K;
        for (Py_ssize_t r = r0; r < r1; r++) tl[r - r0] = 0;
        Py_ssize_t k = k0;
        for (; k + 4 <= k1; k += 4) {       /* four storage rows per pass over the sums */
            const int8_t *x0 = a + k * R, *x1 = x0 + R, *x2 = x1 + R, *x3 = x2 + R;
            int32_t w0 = v16[k], w1 = v16[k + 1], w2 = v16[k + 2], w3 = v16[k + 3];
            for (Py_ssize_t r = r0; r < r1; r++)
                tl[r - r0] += (int32_t)x0[r] * w0 + (int32_t)x1[r] * w1 +
                              (int32_t)x2[r] * w2 + (int32_t)x3[r] * w3;
        }
        for (; k < k1; k++) {
            const int8_t *x = a + k * R;
            int32_t vk = v16[k];
            for (Py_ssize_t r = r0; r < r1; r++) tl[r - r0] += (int32_t)x[r] * vk;
        }
        for (Py_ssize_t r = r0; r < r1; r++) out[r] += tl[r - r0];
    }
}

static PyObject *py_mv_int8(PyObject *self, PyObject *args) {
    (void)self;
    int pieces = 1;
    Py_buffer a, v, out;
    Py_ssize_t R, K, r0, r1;
    int transposed;
    if (!PyArg_ParseTuple(args, "y*y*w*nnpnn|i", &a, &v, &out, &R, &K, &transposed, &r0, &r1,
                          &pieces))
        return NULL;
    int ok = R >= 0 && K >= 0 && 0 <= r0 && r0 <= r1 && r1 <= R && a.len == R * K &&
             v.len == K * 8 && out.len == R * 8;
    ok = ok && PIECES_OK(pieces);
    int32_t *vl = NULL, *vh = NULL, *scratch = NULL;
    int16_t *v16 = NULL;
    if (ok && K > 0) {
        const int64_t *vi = v.buf;
        int small = 1, tiny = 1;
        for (Py_ssize_t k = 0; k < K; k++) {
            small &= vi[k] > -((int64_t)1 << 31) && vi[k] < ((int64_t)1 << 31);
            tiny &= vi[k] > -((int64_t)1 << 15) && vi[k] < ((int64_t)1 << 15);
        }
        Py_ssize_t rows = (r1 - r0) + pieces;              /* each piece's rows, rounded up */
        if (tiny && (v16 = malloc(sizeof(int16_t) * (size_t)K)) &&
            (!transposed || (scratch = malloc(sizeof(int32_t) * 2 * (size_t)rows)))) {
            for (Py_ssize_t k = 0; k < K; k++) v16[k] = (int16_t)vi[k];
            small = 0;                                      /* the int16 loop runs */
        } else if (tiny) {
            free(v16);
            v16 = NULL;
        }
        if (small && (vl = malloc(sizeof(int32_t) * 2 * (size_t)K)) &&
            (!transposed || (scratch = malloc(sizeof(int32_t) * 2 * (size_t)rows)))) {
            vh = vl + K;
            for (Py_ssize_t k = 0; k < K; k++) {
                vl[k] = (int32_t)(vi[k] & 0xFFFF);
                vh[k] = (int32_t)((vi[k] - vl[k]) / 65536);
            }
        } else {
            free(vl);
            vl = vh = NULL;
        }
    }
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        Py_ssize_t step = pieces > 1 ? (r1 - r0 + pieces - 1) / pieces : r1 - r0;
        FOR_PIECES(r0, r1, pieces, {
            int32_t *tl = scratch ? scratch + 2 * piece * step : NULL;
            if (v16)
                mv_int8_loop16(a.buf, v16, out.buf, tl, R, K, transposed, p_lo, p_hi);
            else
                mv_int8_loop(a.buf, v.buf, vl, vh, out.buf, tl, tl ? tl + step : NULL, R, K,
                             transposed, p_lo, p_hi);
        });
        Py_END_ALLOW_THREADS
    }
    free(v16);
    free(vl);
    free(scratch);
    return FINISH(ok, "mv_int8: inconsistent shapes or row range", &a, &v, &out);
}

EXT_METHODS(checksum) = {
    {"int_sums", py_int_sums, METH_VARARGS,
     "int_sums(src, is_int8, rows, cols, R, C, r0, r1[, pieces]): exact int64 row/column sums."},
    {"mv_int8", py_mv_int8, METH_VARARGS,
     "mv_int8(a, v, out, R, K, transposed, r0, r1[, pieces]): exact int64 int8 matrix-vector "
     "product."},
    {NULL, NULL, 0, NULL},
};
