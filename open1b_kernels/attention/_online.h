/* The forward's ordered sum of its key blocks' P V products (forward_reference's online
 * softmax accumulator), for _tilesc.c's fwd_acc (the products from memory) and _tilevnni.c's
 * pv_acc (each made on VNNI and added at once): one definition, so both give its bits. Both
 * files are built with -ffp-contract=off: every multiply and add below is rounded on its own. */
#ifndef OPEN1B_ATTENTION_ONLINE_H
#define OPEN1B_ATTENTION_ONLINE_H

#include "../core/_mathfn.h"

/* One key block: acc = acc * alpha + I * 2^-t over a row's D values. */
static inline void online_add(float *acc, const float *ii, float alpha, int32_t t,
                              Py_ssize_t D) {
    float down = pow2i(-t);
    for (Py_ssize_t d = 0; d < D; d++) acc[d] = acc[d] * alpha + ii[d] * down;
}

/* After the last key block: out = acc / l in place; returns the row's lse = m + log(l). */
static inline float online_finish(float *acc, float l, float m, Py_ssize_t D) {
    for (Py_ssize_t d = 0; d < D; d++) acc[d] = acc[d] / l;
    return m + log1(l);
}

#endif
