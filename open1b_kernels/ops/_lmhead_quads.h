/* The sparse slice's nonzeros as the loop of _lmhead_sparse.c reads them (its only user):
 * per row, quads of (k, |S|) of one sign, made once per block of the slice and kept as one
 * bytes object for several products (open1b_kernels.ops.lmhead_sparse.SparseRows). */
#ifndef OPEN1B_LMHEAD_QUADS_H
#define OPEN1B_LMHEAD_QUADS_H

#include "../core/_ext.h"

#include <stdlib.h>
#include <string.h>

/* The nonzeros of S: per row r, quads of (k, |S|) - the positive ones first, pos[r] of
 * them, then the negative ones - at quads [start[r], start[r + 1]). Made in two passes over
 * the rows (counts, then a prefix sum and the fill), each cut into pieces. */
typedef struct {
    int32_t *k;        /* 4 per quad */
    uint8_t *v;        /* 4 per quad */
    Py_ssize_t *start; /* rows + 1 */
    Py_ssize_t *pos;   /* rows */
} Quads;

static void quads_free(Quads *q) {
    free(q->k);
    free(q->v);
    free(q->start);
    free(q->pos);
}

/* rows [r0, r1): pos[r] = its positive quads, start[r + 1] = all its quads. S's element
 * (r, k) at S[r * ss + k * sk], one of the strides 1: a row at a time, or (ss == 1) the
 * rows side by side, one k at a time */
CLONES static void quads_count(Quads *q, const int8_t *S, Py_ssize_t ss, Py_ssize_t sk,
                               Py_ssize_t K, Py_ssize_t r0, Py_ssize_t r1) {
    if (sk == 1) {
        for (Py_ssize_t r = r0; r < r1; r++) {
            const int8_t *row = S + r * ss;
            Py_ssize_t p = 0, m = 0;
            for (Py_ssize_t k = 0; k < K; k++) {   /* branch-free: vectorized */
                p += row[k] > 0;
                m += row[k] < 0;
            }
            q->pos[r] = p;
            q->start[r + 1] = m;
        }
    } else {
        for (Py_ssize_t r = r0; r < r1; r++) q->pos[r] = q->start[r + 1] = 0;
        for (Py_ssize_t k = 0; k < K; k++) {
            const int8_t *line = S + k * sk;
            for (Py_ssize_t r = r0; r < r1; r++) {
                q->pos[r] += line[r] > 0;
                q->start[r + 1] += line[r] < 0;
            }
        }
    }
    for (Py_ssize_t r = r0; r < r1; r++) {
        q->pos[r] = (q->pos[r] + 3) / 4;
        q->start[r + 1] = q->pos[r] + (q->start[r + 1] + 3) / 4;
    }
}

static inline void quads_put(Quads *q, Py_ssize_t *at, int8_t v, Py_ssize_t k) {
    int neg = v < 0;
    q->k[at[neg]] = (int32_t)k;
    q->v[at[neg]++] = (uint8_t)(neg ? -v : v);
}

/* pad each sign's last quad of row r with zeros at column 0 */
static inline void quads_pad(Quads *q, const Py_ssize_t *at, Py_ssize_t r) {
    Py_ssize_t end[2] = {(q->start[r] + q->pos[r]) * 4, q->start[r + 1] * 4};
    for (int s = 0; s < 2; s++)
        for (Py_ssize_t i = at[s]; i < end[s]; i++) {
            q->k[i] = 0;
            q->v[i] = 0;
        }
}

/* rows [r0, r1)'s quads, start[] summed; 0 when memory could not be had */
static int quads_fill(Quads *q, const int8_t *S, Py_ssize_t ss, Py_ssize_t sk, Py_ssize_t K,
                      Py_ssize_t r0, Py_ssize_t r1) {
    const uint64_t low7 = 0x7F7F7F7F7F7F7F7FULL, high = 0x8080808080808080ULL;
    if (sk == 1) {
        for (Py_ssize_t r = r0; r < r1; r++) {
            const int8_t *row = S + r * ss;
            Py_ssize_t at[2] = {q->start[r] * 4, (q->start[r] + q->pos[r]) * 4};
            for (Py_ssize_t k0 = 0; k0 < K; k0 += 8) {
                uint64_t word = 0;                    /* eight bytes at once: most are zero */
                memcpy(&word, row + k0, (size_t)(K - k0 < 8 ? K - k0 : 8));
                uint64_t nz = (((word & low7) + low7) | word) & high;   /* top bit: != 0 */
                while (nz) {
                    Py_ssize_t k = k0 + (__builtin_ctzll(nz) >> 3);
                    nz &= nz - 1;
                    quads_put(q, at, row[k], k);
                }
            }
            quads_pad(q, at, r);
        }
        return 1;
    }
    Py_ssize_t n = r1 - r0, *at = malloc((size_t)(2 * n) * sizeof(Py_ssize_t));
    if (!at) return 0;
    for (Py_ssize_t r = r0; r < r1; r++) {
        at[2 * (r - r0)] = q->start[r] * 4;
        at[2 * (r - r0) + 1] = (q->start[r] + q->pos[r]) * 4;
    }
    for (Py_ssize_t k = 0; k < K; k++) {
        const int8_t *line = S + k * sk;
        for (Py_ssize_t r0w = r0; r0w < r1; r0w += 8) {
            uint64_t word = 0;
            memcpy(&word, line + r0w, (size_t)(r1 - r0w < 8 ? r1 - r0w : 8));
            uint64_t nz = (((word & low7) + low7) | word) & high;
            while (nz) {
                Py_ssize_t r = r0w + (__builtin_ctzll(nz) >> 3);
                nz &= nz - 1;
                quads_put(q, at + 2 * (r - r0), line[r], k);
            }
        }
    }
    for (Py_ssize_t r = r0; r < r1; r++) quads_pad(q, at + 2 * (r - r0), r);
    free(at);
    return 1;
}

/* the quads of S's n rows, the passes cut into `pieces`; 0 when memory could not be had */
static int quads_make(Quads *q, const int8_t *S, Py_ssize_t ss, Py_ssize_t sk, Py_ssize_t K,
                      Py_ssize_t n, int pieces) {
    q->start = malloc((size_t)(n + 1) * sizeof(Py_ssize_t));
    q->pos = malloc((size_t)(n ? n : 1) * sizeof(Py_ssize_t));
    if (!q->start || !q->pos) return 0;
    FOR_PIECES(0, n, pieces, quads_count(q, S, ss, sk, K, p_lo, p_hi));
    q->start[0] = 0;
    for (Py_ssize_t r = 0; r < n; r++) q->start[r + 1] += q->start[r];
    Py_ssize_t total = q->start[n];
    q->k = malloc((size_t)(total ? total : 1) * 4 * sizeof(int32_t));
    q->v = malloc((size_t)(total ? total : 1) * 4);
    if (!q->k || !q->v) return 0;
    int good[PIECES_MAX];
    for (int i = 0; i < pieces && i < PIECES_MAX; i++) good[i] = 1;
    FOR_PIECES(0, n, pieces, good[piece] = quads_fill(q, S, ss, sk, K, p_lo, p_hi));
    for (int i = 0; i < pieces && i < PIECES_MAX; i++)
        if (!good[i]) return 0;
    return 1;
}

/* A Quads as one bytes object - start (n + 1) and pos (n) as int64, then k (4 per quad)
 * as int32 and v (4 per quad) as bytes - made once and used by several products */
static PyObject *quads_bytes(const Quads *q, Py_ssize_t n) {
    Py_ssize_t total = q->start[n], size = 8 * (2 * n + 1) + 20 * total;
    PyObject *b = PyBytes_FromStringAndSize(NULL, size);
    if (!b) return NULL;
    char *p = PyBytes_AS_STRING(b);
    memcpy(p, q->start, (size_t)(n + 1) * 8);
    memcpy(p + 8 * (n + 1), q->pos, (size_t)n * 8);
    memcpy(p + 8 * (2 * n + 1), q->k, (size_t)total * 16);
    memcpy(p + 8 * (2 * n + 1) + 16 * total, q->v, (size_t)total * 4);
    return b;
}

/* q's arrays pointing into `buf` (quads_bytes' layout) for n rows of K: 1, or 0 with a
 * ValueError when the bytes are not such quads (any k outside [0, K) or |S| above 128) */
static int quads_view(Quads *q, const Py_buffer *buf, Py_ssize_t n, Py_ssize_t K) {
    const char *p = buf->buf;
    Py_ssize_t head = 8 * (2 * n + 1);
    Py_ssize_t total = buf->len >= head ? ((const int64_t *)p)[n] : -1;
    int ok = n >= 0 && total >= 0 && buf->len == head + 20 * total;
    q->start = (Py_ssize_t *)p;
    q->pos = (Py_ssize_t *)(p + 8 * (n + 1));
    q->k = (int32_t *)(p + head);
    q->v = (uint8_t *)(p + head + 16 * total);
    for (Py_ssize_t r = 0; ok && r < n; r++)
        ok = q->start[r] <= q->start[r + 1] && q->pos[r] >= 0 &&
             q->pos[r] <= q->start[r + 1] - q->start[r];
    ok = ok && q->start[0] == 0;
    for (Py_ssize_t i = 0; ok && i < 4 * total; i++)
        ok = q->k[i] >= 0 && q->k[i] < K && q->v[i] <= 128;
    if (!ok)
        PyErr_SetString(PyExc_ValueError, "sparse_mm: the quads do not fit the rows and K given");
    return ok;
}

#endif
