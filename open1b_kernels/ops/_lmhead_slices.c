/* open1b_kernels.ops.lmhead_slices' slicer (step 1 of open1b_kernels.ops.lmhead), compiled:
 * integer and bit operations only, so the values of the torch code (``slice_rows_cpu``) in any
 * evaluation order and any cut of the rows. */
#include "../core/_ext.h"

#include <string.h>

/* The integer loops get the AVX2 and AVX-512 clones too (no float arithmetic: no rounding
 * question). */
#define SLICE_BITS(src, is_bf16, i)                                                      \
    ((is_bf16) ? ((uint32_t)((const uint16_t *)(src))[i] << 16)                          \
               : ((const uint32_t *)(src))[i])

static inline int32_t slice_exp(uint32_t b) {
    int32_t ef = (int32_t)((b >> 23) & 0xFF);
    return ef < 1 ? 1 : ef;
}

/* The S int8 slices of one element whose group exponent is eb, written S planes apart. */
static inline void slice_put(uint32_t b, int32_t eb, int S, int8_t *restrict o,
                             Py_ssize_t plane) {
    int32_t ef = (int32_t)((b >> 23) & 0xFF);
    int32_t man = (int32_t)(b & 0x7FFFFF) | ((ef != 0) << 23);
    int32_t e = ef < 1 ? 1 : ef;
    int32_t sh = eb - e + (24 - 7 * S);
    sh = sh > 31 ? 31 : sh;
    int32_t mag = man >> sh;
    int32_t neg = -(int32_t)(b >> 31);           /* -1 for negative, else 0 */
    for (int i = 0; i < S; i++) {
        int32_t part = (mag >> (7 * (S - 1 - i))) & 127;
        o[(Py_ssize_t)i * plane] = (int8_t)((part ^ neg) - neg);
    }
}

/* Where slice i (0-based) of element (r, k) goes: out + base + r * rs + k + i * ps. The
 * layouts (see slice_layout): planes (S, R, K) - rs = K, ps = R K; rows interleaved
 * (R, S, K) - rs = S K, ps = K; either with the slices in reverse order (base at the last
 * position, ps negative). */
typedef struct { Py_ssize_t base, rs, ps; } slice_at;

/* Rows r0 .. r1-1 of a row-major (R, K) operand whose rows lie ld elements apart (ld >= K:
 * a block of columns of a wider matrix is read in place), float32 or bf16 bits, one
 * exponent per row; out int8 at `at`; exps int32 (R). Inlined with constant is_bf16 and S
 * below, so each variant's inner loops vectorize. */
static inline __attribute__((always_inline)) void
slice_rows_body(const void *src, const int is_bf16, Py_ssize_t R, Py_ssize_t K, Py_ssize_t ld,
                const int S, Py_ssize_t r0, Py_ssize_t r1, int8_t *restrict out,
                int32_t *restrict exps, slice_at at) {
    (void)R;
    for (Py_ssize_t r = r0; r < r1; r++) {
        int32_t eb = 1;
        for (Py_ssize_t k = 0; k < K; k++) {
            int32_t e = slice_exp(SLICE_BITS(src, is_bf16, r * ld + k));
            eb = e > eb ? e : eb;
        }
        exps[r] = eb;
        int8_t *o = out + at.base + r * at.rs;
        for (Py_ssize_t k = 0; k < K; k++)
            slice_put(SLICE_BITS(src, is_bf16, r * ld + k), eb, S, o + k, at.ps);
    }
}

/* Columns c0 .. c1-1 of a row-major (R, C) operand whose rows lie ld elements apart, one
 * exponent per column (the slicer of its transpose, in the operand's own layout): out int8
 * planes (S, R, C) at `at` (rs = C); exps int32 (C). */
static inline __attribute__((always_inline)) void
slice_cols_body(const void *src, const int is_bf16, Py_ssize_t R, Py_ssize_t C, Py_ssize_t ld,
                const int S, Py_ssize_t c0, Py_ssize_t c1, int8_t *restrict out,
                int32_t *restrict exps, slice_at at) {
    for (Py_ssize_t c = c0; c < c1; c++) exps[c] = 1;
    for (Py_ssize_t r = 0; r < R; r++)
        for (Py_ssize_t c = c0; c < c1; c++) {
            int32_t e = slice_exp(SLICE_BITS(src, is_bf16, r * ld + c));
            exps[c] = e > exps[c] ? e : exps[c];
        }
    for (Py_ssize_t r = 0; r < R; r++) {
        int8_t *o = out + at.base + r * at.rs;
        for (Py_ssize_t c = c0; c < c1; c++)
            slice_put(SLICE_BITS(src, is_bf16, r * ld + c), exps[c], S, o + c, at.ps);
    }
}

#define SLICE_VARIANT(NAME, BODY, BF16, S)                                               \
    CLONES static void NAME(const void *src, Py_ssize_t R, Py_ssize_t K, Py_ssize_t ld,    \
                             Py_ssize_t lo, Py_ssize_t hi, int8_t *out, int32_t *exps,     \
                             slice_at at) {                                                \
        BODY(src, BF16, R, K, ld, S, lo, hi, out, exps, at);                              \
    }
SLICE_VARIANT(slice_rows_b3, slice_rows_body, 1, 3)
SLICE_VARIANT(slice_rows_f3, slice_rows_body, 0, 3)
SLICE_VARIANT(slice_rows_b2, slice_rows_body, 1, 2)
SLICE_VARIANT(slice_rows_f2, slice_rows_body, 0, 2)
SLICE_VARIANT(slice_cols_b3, slice_cols_body, 1, 3)
SLICE_VARIANT(slice_cols_f3, slice_cols_body, 0, 3)
SLICE_VARIANT(slice_cols_b2, slice_cols_body, 1, 2)
SLICE_VARIANT(slice_cols_f2, slice_cols_body, 0, 2)

static void slice_loop(const void *src, int is_bf16, Py_ssize_t R, Py_ssize_t K,
                       Py_ssize_t ld, int S, int by_cols, Py_ssize_t lo, Py_ssize_t hi,
                       int8_t *out, int32_t *exps, slice_at at) {
    if (S == 3 || S == 2) {
        typedef void (*variant)(const void *, Py_ssize_t, Py_ssize_t, Py_ssize_t, Py_ssize_t,
                                Py_ssize_t, int8_t *, int32_t *, slice_at);
        static const variant table[2][2][2] = {
            {{slice_rows_f2, slice_rows_b2}, {slice_rows_f3, slice_rows_b3}},
            {{slice_cols_f2, slice_cols_b2}, {slice_cols_f3, slice_cols_b3}}};
        table[by_cols != 0][S == 3][is_bf16 != 0](src, R, K, ld, lo, hi, out, exps, at);
    } else if (by_cols) {
        slice_cols_body(src, is_bf16, R, K, ld, S, lo, hi, out, exps, at);
    } else {
        slice_rows_body(src, is_bf16, R, K, ld, S, lo, hi, out, exps, at);
    }
}

/* layout bit 0: rows interleaved (R, S, K) instead of planes (row-wise slicing only);
 * bit 1: the slices in reverse order. */
static slice_at slice_layout(int layout, Py_ssize_t R, Py_ssize_t K, int S) {
    slice_at at;
    int rows = (layout & 1) != 0;
    at.rs = rows ? (Py_ssize_t)S * K : K;
    at.ps = rows ? K : R * K;
    at.base = 0;
    if (layout & 2) {
        at.base = (Py_ssize_t)(S - 1) * at.ps;
        at.ps = -at.ps;
    }
    return at;
}

static PyObject *py_slice_rows(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer src, out, exps;
    Py_ssize_t R, K, lo, hi, ld = -1;
    int is_bf16, S, by_cols, pieces = 1, layout = 0;
    if (!PyArg_ParseTuple(args, "y*pnnipw*w*nn|iin", &src, &is_bf16, &R, &K, &S, &by_cols, &out,
                          &exps, &lo, &hi, &pieces, &layout, &ld))
        return NULL;
    if (ld < 0) ld = K;                       /* rows ld elements apart: K when contiguous */
    Py_ssize_t span = R ? (R - 1) * ld + K : 0;
    int ok = S >= 1 && S <= 4 && R >= 0 && K >= 0 && ld >= K && 0 <= lo && lo <= hi &&
             layout >= 0 && layout <= 3 && !(by_cols && (layout & 1)) &&
             hi <= (by_cols ? K : R) && src.len == span * (is_bf16 ? 2 : 4) &&
             out.len == (Py_ssize_t)S * R * K && exps.len == (by_cols ? K : R) * 4;
    ok = ok && PIECES_OK(pieces);
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        slice_at at = slice_layout(layout, R, K, S);
        FOR_PIECES(lo, hi, pieces, slice_loop(src.buf, is_bf16, R, K, ld, S, by_cols, p_lo,
                                              p_hi, (int8_t *)out.buf, (int32_t *)exps.buf,
                                              at));
        Py_END_ALLOW_THREADS
    }
    return FINISH(ok, "slice_planes: inconsistent shapes or buffer sizes", &src, &out, &exps);
}

EXT_METHODS(lmhead_slices) = {
    {"slice_planes", py_slice_rows, METH_VARARGS,
     "slice_planes(src, is_bf16, R, K, S, by_cols, out, exps, lo, hi[, pieces, layout, ld]): "
     "open1b_kernels.ops.lmhead's slicer (rows lo..hi with one exponent per row, or columns lo..hi "
     "with one per column; layout bit 0: rows interleaved, bit 1: slices reversed; src's rows "
     "ld elements apart, K by default)."},
    {NULL, NULL, 0, NULL},
};
