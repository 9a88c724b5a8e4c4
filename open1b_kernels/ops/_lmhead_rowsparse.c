/* The products of one sparse int8 slice, row by row, added into an int64 sum:
 *
 *   T[r, c] += sum over the k with a[r, k] != 0 of a[r, k] * sum_j 2^shift_j * b_j[k, c]
 *
 * Why: the LM head's logits gradient dlogits = (p - onehot) / M has slices whose nonzeros
 * are few in every row but spread over most of the vocabulary across rows. Slice 2 of an
 * element is nonzero only above 2^-14 of its row's largest magnitude (at least 1 - p_target),
 * i.e. for the tokens a row gives a probability above ~2^-14: ~420 of 128,256 per row at
 * initialization (measured), a few thousand in a trained model's flat rows - while the
 * union over 1,024 rows covers more than half the vocabulary, so the compaction by columns
 * of open1b_kernels.ops.lmhead_plan cannot drop it. In dh = dlogits W its pairs cost a dense
 * product of the vocabulary's length; row by row they cost each nonzero's C columns.
 *
 * a: int8 rows of K with a unit stride along k (row stride lda); b_j: int8 (K, C) with a
 * unit stride along c (row stride ldb), so one nonzero reads C contiguous bytes of each b_j;
 * t: int64 (R, C) row-major. Exact: a nonzero adds at most 2^14 sum_j 2^shift_j in
 * magnitude to a column (|a|, |b| <= 128); an int32 row of C accumulators takes `flush`
 * nonzeros' terms (computed here from the shifts, so it never overflows) before it is added
 * into T. Integer sums: the cut of the rows between threads changes no bit.
 * (open1b_kernels.ops.lmhead_rowsparse is its Python side.)
 */
#include "../core/_ext.h"

#include <stdlib.h>
#include <string.h>

#define MAX_B 3          /* b slices per nonzero: S + 1 - i <= 3 for S <= 3 */
#define MAX_SHIFT 14     /* 2^14 * 3 * 2^14 < 2^31: one nonzero always fits an accumulator */

/* acc[c] += sum_j x_j b_j[c] for the nb b rows of one nonzero (x_j = a value * 2^shift_j):
 * one pass over the accumulators per nonzero, the b rows read side by side */
CLONES static void axpy(int32_t *restrict acc, const int8_t *const *b, const int32_t *x, int nb,
                        Py_ssize_t C) {
    const int8_t *restrict b0 = b[0];
    if (nb == 1) {
        for (Py_ssize_t c = 0; c < C; c++) acc[c] += x[0] * b0[c];
    } else if (nb == 2) {
        const int8_t *restrict b1 = b[1];
        for (Py_ssize_t c = 0; c < C; c++) acc[c] += x[0] * b0[c] + x[1] * b1[c];
    } else {
        const int8_t *restrict b1 = b[1], *restrict b2 = b[2];
        for (Py_ssize_t c = 0; c < C; c++) acc[c] += x[0] * b0[c] + x[1] * b1[c] + x[2] * b2[c];
    }
}

CLONES static void drain(int64_t *restrict t, int32_t *restrict acc, Py_ssize_t C) {
    for (Py_ssize_t c = 0; c < C; c++) {
        t[c] += acc[c];
        acc[c] = 0;
    }
}

/* rows [r0, r1); returns the nonzeros seen, or -1 when the accumulators could not be had */
static Py_ssize_t rows_add(const int8_t *a, Py_ssize_t lda, Py_ssize_t K, const int8_t *const *b,
                           const int *shift, int nb, Py_ssize_t ldb, int64_t *t, Py_ssize_t C,
                           Py_ssize_t flush, Py_ssize_t r0, Py_ssize_t r1) {
    int32_t *acc = calloc((size_t)(C ? C : 1), sizeof(int32_t));
    if (!acc) return -1;
    Py_ssize_t seen = 0;
    for (Py_ssize_t r = r0; r < r1; r++) {
        const int8_t *ar = a + r * lda;
        int64_t *tr = t + r * C;
        Py_ssize_t held = 0;
        for (Py_ssize_t k0 = 0; k0 < K; k0 += 8) {
            uint64_t word = 0;                        /* eight bytes at once: most are zero */
            memcpy(&word, ar + k0, (size_t)(K - k0 < 8 ? K - k0 : 8));
            if (!word) continue;
            for (Py_ssize_t k = k0; k < K && k < k0 + 8; k++) {
                if (!ar[k]) continue;
                const int8_t *rows[MAX_B];
                int32_t x[MAX_B];
                for (int j = 0; j < nb; j++) {
                    rows[j] = b[j] + k * ldb;
                    x[j] = (int32_t)ar[k] * (1 << shift[j]);
                }
                axpy(acc, rows, x, nb, C);
                seen++;
                if (++held == flush) {
                    drain(tr, acc, C);
                    held = 0;
                }
            }
        }
        if (held) drain(tr, acc, C);
    }
    free(acc);
    return seen;
}

static PyObject *py_rows_add(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer a, t, bb[MAX_B];
    PyObject *seq;
    Py_ssize_t R, K, lda, ldb, C, r0, r1;
    int pieces = 1, nb = 0;
    if (!PyArg_ParseTuple(args, "y*nnnOnw*nnn|i", &a, &R, &K, &lda, &seq, &ldb, &t, &C, &r0, &r1,
                          &pieces))
        return NULL;
    int ok = R >= 0 && K >= 1 && lda >= K && ldb >= C && C >= 0 && 0 <= r0 && r0 <= r1 &&
             r1 <= R && PIECES_OK(pieces);
    if (!ok) PyErr_SetString(PyExc_ValueError, "rows_add: inconsistent shapes or row range");
    ok = ok && holds(&a, R ? (R - 1) * lda + K : 0, "rows_add: a") &&
         holds(&t, R * C * 8, "rows_add: t");
    PyObject *fast = ok ? PySequence_Fast(seq, "rows_add: b must be a sequence") : NULL;
    Py_ssize_t n = fast ? PySequence_Fast_GET_SIZE(fast) : 0;
    if (fast && (n < 1 || n > MAX_B)) {
        PyErr_Format(PyExc_ValueError, "rows_add: %zd b slices, needs 1 to %d", n, MAX_B);
        ok = 0;
    }
    ok = ok && fast;
    const int8_t *bp[MAX_B];
    int shift[MAX_B];
    int64_t weight = 0;
    for (Py_ssize_t j = 0; ok && j < n; j++) {
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(fast, j), "y*i", &bb[nb], &shift[j])) {
            ok = 0;
            break;
        }
        bp[nb++] = bb[j].buf;
        ok = holds(&bb[j], C ? (K - 1) * ldb + C : 0, "rows_add: b");
        if (ok && (shift[j] < 0 || shift[j] > MAX_SHIFT)) {
            PyErr_Format(PyExc_ValueError, "rows_add: shift %d outside [0, %d]", shift[j],
                         MAX_SHIFT);
            ok = 0;
        }
        weight += ok ? (int64_t)1 << shift[j] : 0;
    }
    Py_XDECREF(fast);
    /* nonzeros an int32 accumulator takes: each adds at most 2^14 * weight in magnitude */
    Py_ssize_t flush = ok ? (Py_ssize_t)(INT32_MAX / ((int64_t)1 << 14) / weight) : 0;
    Py_ssize_t seen[PIECES_MAX];
    for (int i = 0; ok && i < pieces; i++) seen[i] = 0;   /* a piece with no rows stays 0 */
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        FOR_PIECES(r0, r1, pieces, seen[piece] = rows_add(a.buf, lda, K, bp, shift, nb, ldb, t.buf,
                                                          C, flush, p_lo, p_hi));
        Py_END_ALLOW_THREADS
    }
    Py_ssize_t total = 0;
    for (int i = 0; ok && i < pieces; i++) {
        if (seen[i] < 0) {
            PyErr_NoMemory();
            ok = 0;
        }
        total += seen[i];
    }
    PyBuffer_Release(&a);
    PyBuffer_Release(&t);
    for (int j = 0; j < nb; j++) PyBuffer_Release(&bb[j]);
    return ok ? PyLong_FromSsize_t(total) : NULL;
}

EXT_METHODS(lmhead_rowsparse) = {
    {"rows_add", py_rows_add, METH_VARARGS,
     "rows_add(a, R, K, lda, [(b_j, shift_j), ...], ldb, t, C, r0, r1[, pieces]): for rows "
     "[r0, r1), t[r, c] += sum over a[r, k] != 0 of a[r, k] * sum_j 2^shift_j b_j[k, c] "
     "(int8 a and b_j, int64 t); returns the nonzeros of a it multiplied."},
    {NULL, NULL, 0, NULL},
};
