/* open1b_kernels.int8.ste's straight-through estimator, compiled: the quantizer's dx
 * and its LSQ term per element (ste), or dx with the term's pairwise tree sum instead of the
 * term (ste_sums: the scale's gradient needs only that sum). Float work is the torch code's
 * IEEE float32 operations in its order (-ffp-contract=off), element by element - the same
 * bits in any cut of the elements. */
#include "../core/_ext.h"

#include <math.h>
#include <stdlib.h>

#include "../core/_mathfn.h"
#include "../core/_reduce.h"

/* The estimator of C elements of one row: v = x / d, inside = -127 <= v <= 127,
 * dx = bf16_rne(inside ? g : 0); with `tr`, the LSQ term (inside ? rne(clamp(v)) - v :
 * clamp(v)) * g. x is bf16 bits or float32. The flags are constants at each call below, so
 * every variant is a branch-free loop that vectorizes (a flag tested inside the loop kept
 * it scalar). */
static inline void ste_row(const float *gr, const void *x, int x_bf16, float d, uint16_t *o,
                           float *tr, Py_ssize_t C) {
    for (Py_ssize_t c = 0; c < C; c++) {
        float xv = x_bf16 ? from_bits((uint32_t)((const uint16_t *)x)[c] << 16)
                          : ((const float *)x)[c];
        float v = xv / d;
        int inside = (v >= -127.0f) & (v <= 127.0f);
        o[c] = bf16_rne1(inside ? gr[c] : 0.0f);
        if (tr) {
            float vc = v < -127.0f ? -127.0f : (v > 127.0f ? 127.0f : v);
            float t = inside ? rintf(vc) - v : vc;
            tr[c] = t * gr[c];
        }
    }
}

/* Elements [e, e + n) of the row-major (R, C) operands (inside one row), their term into tr
 * (or none): ste_row at the elements' row divisor (div one per row, or one for all when
 * per_row is 0). */
CLONES static void ste_run(const float *g, const void *x, int x_bf16, const float *div,
                           int per_row, uint16_t *dx, float *tr, Py_ssize_t C, Py_ssize_t e,
                           Py_ssize_t n) {
    float d = div[per_row ? e / C : 0];
    const void *xe = x_bf16 ? (const void *)((const uint16_t *)x + e)
                            : (const void *)((const float *)x + e);
    if (x_bf16 && tr) ste_row(g + e, xe, 1, d, dx + e, tr, n);
    else if (x_bf16) ste_row(g + e, xe, 1, d, dx + e, NULL, n);
    else if (tr) ste_row(g + e, xe, 0, d, dx + e, tr, n);
    else ste_row(g + e, xe, 0, d, dx + e, NULL, n);
}

/* open1b_kernels.int8.ste.ste_cpu for rows [r0, r1) of (R, C): dx, and the term where
 * `term` is given. */
static void ste_loop(const float *g, const void *x, int x_bf16, const float *div, int per_row,
                     uint16_t *dx, float *term, Py_ssize_t C, Py_ssize_t r0, Py_ssize_t r1) {
    for (Py_ssize_t r = r0; r < r1; r++)
        ste_run(g, x, x_bf16, div, per_row, dx, term ? term + r * C : NULL, C, r * C, C);
}

/* The aligned blocks [b0, b1) of B elements of the flattened (R, C) operands (n = R * C):
 * each block's dx, and its term into `ta` (B floats, in cache) summed at once by tree_row -
 * the first log2(B) levels of the term's pairwise tree, the last block padded with +0.0 as
 * the definition pads to next_pow2(n) - into partials[b]: tree_blocks' partials of the term,
 * without the term's R x C floats written and read back. */
static void ste_blocks(const float *g, const void *x, int x_bf16, const float *div,
                       int per_row, uint16_t *dx, float *partials, Py_ssize_t R, Py_ssize_t C,
                       Py_ssize_t B, Py_ssize_t b0, Py_ssize_t b1, float *ta, float *tb) {
    const Py_ssize_t n = R * C;
    for (Py_ssize_t b = b0; b < b1; b++) {
        Py_ssize_t a0 = b * B, m = n - a0 < B ? n - a0 : B;
        for (Py_ssize_t e = a0; e < a0 + m;) {          /* the block's runs, one per row */
            Py_ssize_t run = C - e % C < a0 + m - e ? C - e % C : a0 + m - e;
            ste_run(g, x, x_bf16, div, per_row, dx, ta + (e - a0), C, e, run);
            e += run;
        }
        partials[b] = tree_row(ta, tb, m, B);
    }
}

static PyObject *py_ste(PyObject *self, PyObject *args) {
    (void)self;
    int pieces = 1;
    Py_buffer g, x, div, dx, term;
    Py_ssize_t R, C, r0, r1;
    int x_bf16, per_row;
    if (!PyArg_ParseTuple(args, "y*y*py*pw*w*nnnn|i", &g, &x, &x_bf16, &div, &per_row, &dx, &term,
                          &R, &C, &r0, &r1, &pieces))
        return NULL;
    int ok = R >= 0 && C >= 0 && 0 <= r0 && r0 <= r1 && r1 <= R && g.len == R * C * 4 &&
             x.len == R * C * (x_bf16 ? 2 : 4) && div.len == (per_row ? R : 1) * 4 &&
             dx.len == R * C * 2 && (term.len == 0 || term.len == R * C * 4);
    ok = ok && PIECES_OK(pieces);
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        FOR_PIECES(r0, r1, pieces, ste_loop(g.buf, x.buf, x_bf16, div.buf, per_row, dx.buf,
                                            term.len ? term.buf : NULL, C, p_lo, p_hi));
        Py_END_ALLOW_THREADS
    }
    return FINISH(ok, "ste: inconsistent shapes or row range", &g, &x, &div, &dx, &term);
}

static PyObject *py_ste_sums(PyObject *self, PyObject *args) {
    (void)self;
    int pieces = 1;
    Py_buffer g, x, div, dx, partials;
    Py_ssize_t R, C, B, b0, b1;
    int x_bf16, per_row;
    if (!PyArg_ParseTuple(args, "y*y*py*pw*w*nnnnn|i", &g, &x, &x_bf16, &div, &per_row, &dx,
                          &partials, &R, &C, &B, &b0, &b1, &pieces))
        return NULL;
    Py_ssize_t n = R * C, P = pow2_ceil(n);
    int ok = R >= 1 && C >= 1 && B >= 2 && B <= (1 << 20) && (B & (B - 1)) == 0 && B <= P &&
             g.len == n * 4 && x.len == n * (x_bf16 ? 2 : 4) &&
             div.len == (per_row ? R : 1) * 4 && dx.len == n * 2 && partials.len == P / B * 4 &&
             0 <= b0 && b0 <= b1 && b1 <= (n + B - 1) / B;
    ok = ok && PIECES_OK(pieces);
    float *scratch = NULL;
    if (ok && !(scratch = malloc(sizeof(float) * 2 * B * pieces))) ok = 0;
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        FOR_PIECES(b0, b1, pieces, {
            float *ta = scratch + 2 * B * piece;
            ste_blocks(g.buf, x.buf, x_bf16, div.buf, per_row, dx.buf, partials.buf, R, C, B,
                       p_lo, p_hi, ta, ta + B);
        });
        Py_END_ALLOW_THREADS
    }
    free(scratch);
    return FINISH(ok, "ste_sums: inconsistent shapes, block size or block range", &g, &x, &div,
                  &dx, &partials);
}

EXT_METHODS(ste) = {
    {"ste", py_ste, METH_VARARGS,
     "ste(g, x, x_bf16, div, per_row, dx, term, R, C, r0, r1[, pieces]): the quantizer's STE."},
    {"ste_sums", py_ste_sums, METH_VARARGS,
     "ste_sums(g, x, x_bf16, div, per_row, dx, partials, R, C, B, b0, b1[, pieces]): the STE's "
     "dx and its term's tree partials over the aligned blocks [b0, b1) of B elements."},
    {NULL, NULL, 0, NULL},
};
