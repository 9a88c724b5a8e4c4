/* open1b_kernels.ops.philox's word generator, compiled: Philox4x32-10 in integer arithmetic
 * only (uint32 wrap-around and a 64-bit product for mulhilo), so the same words on any C
 * compiler and CPU, in any cut of the positions. And the truncated normal drawn from them
 * (philox.truncated_normal's CPU path): the definition's float32 operations in its order,
 * erfinv by _mathfn.h's erfinv1 (setup.py's exact-float flags). */
#include "../core/_ext.h"
#include "../core/_mathfn.h"


/* open1b_kernels.ops.philox.random_words_cpu: the uint32 words at positions [offset + lo,
   offset + hi) of Philox4x32-10 stream ``stream`` under key (k0, k1), widened into int64
   (the torch reference's dtype). Integer arithmetic only (uint32 wrap-around and a 64-bit
   product for mulhilo): exact on any C compiler and CPU. */
static inline void philox_block(uint64_t b, uint32_t stream, uint32_t k0, uint32_t k1,
                                uint32_t w[4]) {
    uint32_t c0 = (uint32_t)b, c1 = (uint32_t)(b >> 32), c2 = stream, c3 = 0;
    for (int r = 0; r < 10; r++) {
        uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
        uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
        uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
        c0 = hi1 ^ c1 ^ k0; c1 = lo1; c2 = hi0 ^ c3 ^ k1; c3 = lo0;
        k0 += 0x9E3779B9u; k1 += 0xBB67AE85u;   /* the bump after round 10 is never used */
    }
    w[0] = c0; w[1] = c1; w[2] = c2; w[3] = c3;
}

/* The words at positions [offset + lo, offset + hi) into out (int64 or uint32). */
#define PHILOX_RANGE(NAME, T)                                                             \
    static void NAME(T *o, uint64_t seed, uint32_t stream, uint64_t offset, Py_ssize_t lo,  \
                     Py_ssize_t hi) {                                                       \
        uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32), w[4];                    \
        uint64_t p = offset + (uint64_t)lo, end = offset + (uint64_t)hi;                    \
        while (p < end) {                                                                   \
            philox_block(p >> 2, stream, k0, k1, w);                                        \
            for (unsigned j = (unsigned)(p & 3); j < 4 && p < end; j++, p++) *o++ = (T)w[j]; \
        }                                                                                   \
    }
PHILOX_RANGE(philox_range, int64_t)
PHILOX_RANGE(philox_range32, uint32_t)

/* philox.uniform_from_words and truncnormal_from_uniform of the words w[0..n) into out:
 * u = ((w >> 9) + 0.5) * 2^-23, v = (2u - 1) * erf(sqrt 2), z = clamp(erfinv(v) * sqrt 2,
 * -2, 2), out = z * std - each step one float32 operation (w >> 9 < 2^23 converts exactly). */
static const float TN_TWO_M23 = 1.1920928955078125e-07f, TN_ERF_SQRT2 = 0.9544997215270996f,
                   TN_SQRT2 = 1.4142135381698608f, TN_TRUNC = 2.0f;
CLONES static void truncnormal_words(const uint32_t *restrict w, float *restrict out,
                                     Py_ssize_t n, float std) {
    for (Py_ssize_t i = 0; i < n; i++) {
        float u = ((float)(int32_t)(w[i] >> 9) + 0.5f) * TN_TWO_M23;
        float v = (u * 2.0f - 1.0f) * TN_ERF_SQRT2;
        float z = erfinv1(v) * TN_SQRT2;
        z = z < -TN_TRUNC ? -TN_TRUNC : z;          /* clamp: min(max(z, -2), 2) */
        z = z > TN_TRUNC ? TN_TRUNC : z;
        out[i] = z * std;
    }
}

#define TN_CHUNK 2048   /* words per pass: generated into the stack, then turned into floats */

/* The truncated normal at positions [offset + lo, offset + hi) into out. */
static void truncnormal_range(float *o, uint64_t seed, uint32_t stream, uint64_t offset,
                              float std, Py_ssize_t lo, Py_ssize_t hi) {
    uint32_t w[TN_CHUNK];
    for (Py_ssize_t a = lo; a < hi; a += TN_CHUNK) {
        Py_ssize_t b = hi - a < TN_CHUNK ? hi : a + TN_CHUNK;
        philox_range32(w, seed, stream, offset, a, b);
        truncnormal_words(w, o + (a - lo), b - a, std);
    }
}

static PyObject *py_philox_words(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer out;
    unsigned long long seed, offset;
    unsigned long stream;
    Py_ssize_t lo, hi;
    int pieces = 1;
    if (!PyArg_ParseTuple(args, "KkKw*nn|i", &seed, &stream, &offset, &out, &lo, &hi, &pieces))
        return NULL;
    int ok = 0 <= lo && lo <= hi && out.len == (hi - lo) * 8 && stream <= 0xFFFFFFFFul;
    ok = ok && PIECES_OK(pieces);
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        FOR_PIECES(lo, hi, pieces, philox_range((int64_t *)out.buf + (p_lo - lo), seed,
                                                (uint32_t)stream, offset, p_lo, p_hi));
        Py_END_ALLOW_THREADS
    }
    return FINISH(ok, "philox_words: inconsistent range or buffer size", &out);
}

static PyObject *py_philox_truncnormal(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer out;
    unsigned long long seed, offset;
    unsigned long stream;
    float std;
    Py_ssize_t lo, hi;
    int pieces = 1;
    if (!PyArg_ParseTuple(args, "KkKfw*nn|i", &seed, &stream, &offset, &std, &out, &lo, &hi,
                          &pieces))
        return NULL;
    int ok = 0 <= lo && lo <= hi && out.len == (hi - lo) * 4 && stream <= 0xFFFFFFFFul;
    ok = ok && PIECES_OK(pieces);
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        FOR_PIECES(lo, hi, pieces, truncnormal_range((float *)out.buf + (p_lo - lo), seed,
                                                     (uint32_t)stream, offset, std, p_lo, p_hi));
        Py_END_ALLOW_THREADS
    }
    return FINISH(ok, "philox_truncnormal: inconsistent range or buffer size", &out);
}

EXT_METHODS(philox) = {
    {"philox_words", py_philox_words, METH_VARARGS,
     "philox_words(seed, stream, offset, out, lo, hi[, pieces]): Philox4x32-10 words into int64 "
     "out."},
    {"philox_truncnormal", py_philox_truncnormal, METH_VARARGS,
     "philox_truncnormal(seed, stream, offset, std, out, lo, hi[, pieces]): philox's truncated "
     "normal of standard deviation std (float32) into float32 out."},
    {NULL, NULL, 0, NULL},
};
