/* open1b_kernels.core.reduce's pairwise tree in C (the compiled loops of reduce, rmsnorm and
 * the loss's logsumexp): zero-pad to the next power of two, add adjacent pairs level by level
 * - the definition's adds in its order, so its bits. */
#ifndef OPEN1B_REDUCE_H
#define OPEN1B_REDUCE_H

#include <Python.h>

/* The smallest power of two >= n (1 for n <= 1): the tree's padded length. */
static inline Py_ssize_t pow2_ceil(Py_ssize_t n) {
    Py_ssize_t P = 1;
    while (P < n) P *= 2;
    return P;
}

/* The tree sum of ta[0 .. n), padded with +0.0 to P (a power of two >= n); ta and tb are
 * P floats of scratch each (both overwritten). */
static inline float tree_row(float *ta, float *tb, Py_ssize_t n, Py_ssize_t P) {
    for (Py_ssize_t i = n; i < P; i++) ta[i] = 0.0f;
    for (Py_ssize_t len = P / 2; len >= 1; len /= 2) {
        for (Py_ssize_t i = 0; i < len; i++) tb[i] = ta[2 * i] + ta[2 * i + 1];
        float *t = ta; ta = tb; tb = t;
    }
    return ta[0];
}

#endif
