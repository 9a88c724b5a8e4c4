/* open1b_kernels.core._mathc: compiled loops for the CPU reference of open1b_kernels.core.mathfn's exp and log.
 *
 * The torch code in open1b_kernels/core/mathfn.py is the definition (and the Triton twins follow it
 * step for step); these loops evaluate exactly the same float32 operations in the same
 * order, so they give the same bits - tests/kernels/test_mathc.py compares them on every
 * class of input (normals, subnormals, zeros, infinities, NaN, the clamp edges). They only
 * remove torch's cost of one full pass per operation (~30 passes for exp). It also holds
 * the integer row slicer of open1b_kernels.ops.lmhead (bit operations only: exact in any order)
 * and the Philox4x32-10 word generator of open1b_kernels.ops.philox (integer arithmetic only).
 *
 * Exactness rules this file relies on (and setup.py enforces with its flags):
 *   - every float expression is evaluated in float32 (x86-64 SSE / AArch64: no excess
 *     precision; -fexcess-precision=standard), one IEEE operation at a time, round to
 *     nearest even;
 *   - no contraction of a*b+c into a fused multiply-add (-ffp-contract=off), no
 *     reassociation or other value-changing optimization (no -ffast-math);
 *   - float <-> int conversions only of integral, in-range values; bit patterns via memcpy.
 * Constants are the float32 values of mathfn.py (written as exact float literals).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <math.h>
#include <float.h>
#include <string.h>
#include <stdlib.h>

#include "_mathfn.h"
#include "_pieces.h"

static inline float widen_bf16(uint16_t v) { return from_bits((uint32_t)v << 16); }

/* One loop per function (not a function pointer): the body inlines and vectorizes; on
 * x86-64 GCC also builds AVX2 and AVX-512 clones picked at load time (the same IEEE
 * operations on wider registers - FMA stays off - so the same bits; tests/kernels/
 * test_mathc.py compares each loop with the torch code on the machine's widest clone).
 * The AVX-512 clone targets x86-64-v4 (AVX-512 F, BW, DQ, VL, CD), not AVX-512F alone:
 * without BW the int8/int16 lanes and without DQ/VL the compare masks fell back to
 * 256-bit or scalar code (measured, Zen 4: the level pass 0.47x, the codes 0.47x, the
 * slicer 0.76-0.81x the time of the AVX-512F clone). A CPU with AVX-512F but not the
 * rest takes the AVX2 clone. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define CLONES __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
/* Loops that compare whole vectors of GCC's vector extension get a plain x86-64-v4 copy
 * chosen at run time: GCC lowers such comparisons before target_clones copies a function,
 * so in a clone they became one scalar compare per lane (an all-vector loop, rebuilt with
 * target("arch=x86-64-v4"), compiles to mask compares and blends). */
#define HAVE_V4 1
#define V4 __attribute__((target("arch=x86-64-v4")))
static int v4_ok;                       /* set once when the module loads (PyInit__mathc) */
/* The same for loops whose AVX2 form needs its own register blocking (rotq's tile: an
 * 8-lane copy for x86-64-v3, where the 16-lane body spilled half its registers). */
#define V3 __attribute__((target("arch=x86-64-v3")))
static int v3_ok;
#else
#define CLONES
#define HAVE_V4 0
#endif

#define UNARY(NAME, FN)                                                                  \
    CLONES static void loop_##NAME(const float *restrict a, float *restrict b,           \
                                   Py_ssize_t n) {                                        \
        for (Py_ssize_t i = 0; i < n; i++) b[i] = FN(a[i]);                               \
    }                                                                                     \
    static PyObject *py_##NAME(PyObject *self, PyObject *args) {                         \
        (void)self;                                                                       \
        Py_buffer src, dst;                                                               \
        int pieces = 1;                                                                   \
        if (!PyArg_ParseTuple(args, "y*w*|i", &src, &dst, &pieces)) return NULL;          \
        if (src.len != dst.len || src.len % 4 || !PIECES_OK(pieces)) {                    \
            PyBuffer_Release(&src);                                                       \
            PyBuffer_Release(&dst);                                                       \
            PyErr_SetString(PyExc_ValueError, "need equal float32 buffers, 1..4096 pieces");\
            return NULL;                                                                  \
        }                                                                                 \
        Py_ssize_t n = src.len / 4;                                                       \
        Py_BEGIN_ALLOW_THREADS                                                            \
        FOR_PIECES(0, n, pieces, loop_##NAME((const float *)src.buf + p_lo,               \
                                             (float *)dst.buf + p_lo, p_hi - p_lo));       \
        Py_END_ALLOW_THREADS                                                              \
        PyBuffer_Release(&src);                                                           \
        PyBuffer_Release(&dst);                                                           \
        Py_RETURN_NONE;                                                                   \
    }

UNARY(exp, exp1)
UNARY(log, log1)

/* open1b_kernels.ops.lmhead's slicer (slice_rows_cpu): integer and bit operations only, so any
 * evaluation order gives the same result. Integer loops also get an AVX-512 clone (no float
 * arithmetic, so no rounding question). */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define ICLONES __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#else
#define ICLONES
#endif

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

/* Rows r0 .. r1-1 of a row-major (R, K) operand, float32 or bf16 bits, one exponent per
 * row; out int8 at `at`; exps int32 (R). Inlined with constant is_bf16 and S below, so
 * each variant's inner loops vectorize. */
static inline __attribute__((always_inline)) void
slice_rows_body(const void *src, const int is_bf16, Py_ssize_t R, Py_ssize_t K, const int S,
                Py_ssize_t r0, Py_ssize_t r1, int8_t *restrict out, int32_t *restrict exps,
                slice_at at) {
    (void)R;
    for (Py_ssize_t r = r0; r < r1; r++) {
        int32_t eb = 1;
        for (Py_ssize_t k = 0; k < K; k++) {
            int32_t e = slice_exp(SLICE_BITS(src, is_bf16, r * K + k));
            eb = e > eb ? e : eb;
        }
        exps[r] = eb;
        int8_t *o = out + at.base + r * at.rs;
        for (Py_ssize_t k = 0; k < K; k++)
            slice_put(SLICE_BITS(src, is_bf16, r * K + k), eb, S, o + k, at.ps);
    }
}

/* Columns c0 .. c1-1 of a row-major (R, C) operand, one exponent per column (the slicer of
 * its transpose, in the operand's own layout): out int8 planes (S, R, C) at `at` (rs = C);
 * exps int32 (C). */
static inline __attribute__((always_inline)) void
slice_cols_body(const void *src, const int is_bf16, Py_ssize_t R, Py_ssize_t C, const int S,
                Py_ssize_t c0, Py_ssize_t c1, int8_t *restrict out, int32_t *restrict exps,
                slice_at at) {
    for (Py_ssize_t c = c0; c < c1; c++) exps[c] = 1;
    for (Py_ssize_t r = 0; r < R; r++)
        for (Py_ssize_t c = c0; c < c1; c++) {
            int32_t e = slice_exp(SLICE_BITS(src, is_bf16, r * C + c));
            exps[c] = e > exps[c] ? e : exps[c];
        }
    for (Py_ssize_t r = 0; r < R; r++) {
        int8_t *o = out + at.base + r * at.rs;
        for (Py_ssize_t c = c0; c < c1; c++)
            slice_put(SLICE_BITS(src, is_bf16, r * C + c), exps[c], S, o + c, at.ps);
    }
}

#define SLICE_VARIANT(NAME, BODY, BF16, S)                                               \
    ICLONES static void NAME(const void *src, Py_ssize_t R, Py_ssize_t K, Py_ssize_t lo,    \
                             Py_ssize_t hi, int8_t *out, int32_t *exps, slice_at at) {    \
        BODY(src, BF16, R, K, S, lo, hi, out, exps, at);                                  \
    }
SLICE_VARIANT(slice_rows_b3, slice_rows_body, 1, 3)
SLICE_VARIANT(slice_rows_f3, slice_rows_body, 0, 3)
SLICE_VARIANT(slice_rows_b2, slice_rows_body, 1, 2)
SLICE_VARIANT(slice_rows_f2, slice_rows_body, 0, 2)
SLICE_VARIANT(slice_cols_b3, slice_cols_body, 1, 3)
SLICE_VARIANT(slice_cols_f3, slice_cols_body, 0, 3)
SLICE_VARIANT(slice_cols_b2, slice_cols_body, 1, 2)
SLICE_VARIANT(slice_cols_f2, slice_cols_body, 0, 2)

static void slice_loop(const void *src, int is_bf16, Py_ssize_t R, Py_ssize_t K, int S,
                       int by_cols, Py_ssize_t lo, Py_ssize_t hi, int8_t *out, int32_t *exps,
                       slice_at at) {
    if (S == 3 || S == 2) {
        typedef void (*variant)(const void *, Py_ssize_t, Py_ssize_t, Py_ssize_t, Py_ssize_t,
                                int8_t *, int32_t *, slice_at);
        static const variant table[2][2][2] = {
            {{slice_rows_f2, slice_rows_b2}, {slice_rows_f3, slice_rows_b3}},
            {{slice_cols_f2, slice_cols_b2}, {slice_cols_f3, slice_cols_b3}}};
        table[by_cols != 0][S == 3][is_bf16 != 0](src, R, K, lo, hi, out, exps, at);
    } else if (by_cols) {
        slice_cols_body(src, is_bf16, R, K, S, lo, hi, out, exps, at);
    } else {
        slice_rows_body(src, is_bf16, R, K, S, lo, hi, out, exps, at);
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
    Py_ssize_t R, K, lo, hi;
    int is_bf16, S, by_cols, pieces = 1, layout = 0;
    if (!PyArg_ParseTuple(args, "y*pnnipw*w*nn|ii", &src, &is_bf16, &R, &K, &S, &by_cols, &out,
                          &exps, &lo, &hi, &pieces, &layout))
        return NULL;
    int ok = S >= 1 && S <= 4 && R >= 0 && K >= 0 && 0 <= lo && lo <= hi &&
             layout >= 0 && layout <= 3 && !(by_cols && (layout & 1)) &&
             hi <= (by_cols ? K : R) && src.len == R * K * (is_bf16 ? 2 : 4) &&
             out.len == (Py_ssize_t)S * R * K && exps.len == (by_cols ? K : R) * 4;
    ok = ok && PIECES_OK(pieces);
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        slice_at at = slice_layout(layout, R, K, S);
        FOR_PIECES(lo, hi, pieces, slice_loop(src.buf, is_bf16, R, K, S, by_cols, p_lo, p_hi,
                                              (int8_t *)out.buf, (int32_t *)exps.buf, at));
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&src);
    PyBuffer_Release(&out);
    PyBuffer_Release(&exps);
    if (!ok) {
        PyErr_SetString(PyExc_ValueError, "slice_planes: inconsistent shapes or buffer sizes");
        return NULL;
    }
    Py_RETURN_NONE;
}

/* The butterfly stages h = 1, 2, ..., n/2 on the n rows base, base + stride, ...,
   base + (n - 1) * stride (a sub-transform: h counts in steps of `stride` rows), columns
   [c0, c1) of a row-major float32 buffer with C columns, in place. */
static inline void fwht_rows(float *y, Py_ssize_t C, Py_ssize_t base, Py_ssize_t stride,
                             Py_ssize_t n, Py_ssize_t c0, Py_ssize_t c1) {
    for (Py_ssize_t h = 1; h < n; h *= 2)
        for (Py_ssize_t g = 0; g < n; g += 2 * h)
            for (Py_ssize_t i = g; i < g + h; i++) {
                float *a = y + (base + i * stride) * C, *b = y + (base + (i + h) * stride) * C;
                for (Py_ssize_t c = c0; c < c1; c++) {
                    float x = a[c], z = b[c];
                    a[c] = x + z;
                    b[c] = x - z;
                }
            }
}

/* open1b_kernels.int8.hadamard.hadamard_dim0_cpu_'s butterflies on rows [r0, r1) (whole blocks
   of B rows) and columns [c0, c1) of a row-major float32 (R, C) buffer, in place: for
   h = 1, 2, ..., B/2, every pair (row i, row i + h) of each aligned 2h-row group becomes
   (a + b, a - b), one IEEE float32 add and one subtract per element (built with
   -ffp-contract=off: nothing fused or reassociated). The same operations on the same
   operands as the torch stage loop, so the same bits; the normalization stays in torch.
   Why two passes: the stages h < L = 16 pair rows inside each aligned group of L rows, and
   the stages h >= L pair rows of the same residue mod L, so a block is L transforms of L
   rows each, then L transforms of B / L rows (stride L) - every element meets the same
   operands in the same stage order, and each group (L rows of the strip: a few KB) stays
   in L1 through its stages instead of every stage sweeping the whole block. */
/* Sixteen rows p, p + s, ..., p + 15 s of one vector of 16 columns: the butterfly stages
 * h = 1, 2, 4, 8 of fwht_rows (n = 16) with the rows held in registers - two loads and
 * stores per element instead of eight. GCC's vector extension: elementwise IEEE float32
 * adds and subtracts (one instruction per 16, 8 or 4 lanes by the clone), so every element
 * meets the same operands in the same stage order as the scalar loop: the same bits. */
typedef float v16f __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));

/* 8 lanes: the x86-64-v3 copies of rotq's tile (16 rows of one 8-column vector fill AVX2's
 * 16 ymm registers; 16-lane vectors split into two ymm each spilled on every stage). */
typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));

#define BFLY(a, b) { __typeof__(v[0]) x_ = v[a], z_ = v[b]; v[a] = x_ + z_; v[b] = x_ - z_; }
#define STAGES16                                                                               \
    BFLY(0, 1) BFLY(2, 3) BFLY(4, 5) BFLY(6, 7) BFLY(8, 9) BFLY(10, 11) BFLY(12, 13) BFLY(14, 15) \
    BFLY(0, 2) BFLY(1, 3) BFLY(4, 6) BFLY(5, 7) BFLY(8, 10) BFLY(9, 11) BFLY(12, 14) BFLY(13, 15) \
    BFLY(0, 4) BFLY(1, 5) BFLY(2, 6) BFLY(3, 7) BFLY(8, 12) BFLY(9, 13) BFLY(10, 14) BFLY(11, 15) \
    BFLY(0, 8) BFLY(1, 9) BFLY(2, 10) BFLY(3, 11) BFLY(4, 12) BFLY(5, 13) BFLY(6, 14) BFLY(7, 15)
/* The butterfly stages h = 1, 2, 4, 8 of 16 rows held in registers (fwht_rows' order), on
 * vectors of 16 or 8 columns: the same operations per element either way. */
static inline __attribute__((always_inline)) void stages16(v16f *v) { STAGES16 }
static inline __attribute__((always_inline)) void stages16_8(v8f *v) { STAGES16 }
#undef STAGES16
#undef BFLY

static inline __attribute__((always_inline)) void fwht16_vec(float *p, Py_ssize_t s) {
    v16f v[16];
    for (int i = 0; i < 16; i++) memcpy(&v[i], p + i * s, sizeof(v16f));
    stages16(v);
    for (int i = 0; i < 16; i++) memcpy(p + i * s, &v[i], sizeof(v16f));
}

/* fwht_rows for n = 16 rows (stride `stride` rows): whole 16-column vectors in registers,
 * the columns left over by the scalar loop. */
static inline __attribute__((always_inline)) void fwht16(float *y, Py_ssize_t C, Py_ssize_t base, Py_ssize_t stride,
                          Py_ssize_t c0, Py_ssize_t c1) {
    Py_ssize_t c = c0;
    for (; c + 16 <= c1; c += 16) fwht16_vec(y + base * C + c, stride * C);
    if (c < c1) fwht_rows(y, C, base, stride, 16, c, c1);
}

CLONES static void fwht_dim0_loop(float *y, Py_ssize_t C, Py_ssize_t r0, Py_ssize_t r1,
                                  Py_ssize_t B, Py_ssize_t c0, Py_ssize_t c1) {
    const Py_ssize_t L = B < 16 ? B : 16;
    for (Py_ssize_t base = r0; base < r1; base += B) {
        for (Py_ssize_t q = 0; q < B; q += L) {
            if (L == 16) fwht16(y, C, base + q, 1, c0, c1);
            else fwht_rows(y, C, base + q, 1, L, c0, c1);
        }
        if (B > L)
            for (Py_ssize_t j = 0; j < L; j++) {
                if (B / L == 16) fwht16(y, C, base + j, L, c0, c1);
                else fwht_rows(y, C, base + j, L, B / L, c0, c1);
            }
    }
}

static PyObject *py_fwht_dim0(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer buf;
    Py_ssize_t R, C, r0, r1, B, c0, c1;
    int pieces = 1;
    if (!PyArg_ParseTuple(args, "w*nnnnnnn|i", &buf, &R, &C, &r0, &r1, &B, &c0, &c1, &pieces))
        return NULL;
    int ok = B >= 2 && (B & (B - 1)) == 0 && 0 <= r0 && r0 <= r1 && r1 <= R &&
             r0 % B == 0 && (r1 - r0) % B == 0 && 0 <= c0 && c0 <= c1 && c1 <= C &&
             buf.len == R * C * 4;
    ok = ok && PIECES_OK(pieces);
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        FOR_PIECES(c0, c1, pieces, fwht_dim0_loop((float *)buf.buf, C, r0, r1, B, p_lo, p_hi));
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&buf);
    if (!ok) {
        PyErr_SetString(PyExc_ValueError, "fwht_dim0: inconsistent shapes or buffer size");
        return NULL;
    }
    Py_RETURN_NONE;
}

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

/* The words at positions [offset + lo, offset + hi) into out. */
static void philox_range(int64_t *o, uint64_t seed, uint32_t stream, uint64_t offset,
                         Py_ssize_t lo, Py_ssize_t hi) {
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32), w[4];
    uint64_t p = offset + (uint64_t)lo, end = offset + (uint64_t)hi;
    while (p < end) {
        philox_block(p >> 2, stream, k0, k1, w);
        for (unsigned j = (unsigned)(p & 3); j < 4 && p < end; j++, p++) *o++ = (int64_t)w[j];
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
    PyBuffer_Release(&out);
    if (!ok) {
        PyErr_SetString(PyExc_ValueError, "philox_words: inconsistent range or buffer size");
        return NULL;
    }
    Py_RETURN_NONE;
}

/* The end of a wrapper: release its n buffers, then None - or NULL with `msg` as a
 * ValueError when the arguments were inconsistent (nothing was computed). */
static PyObject *finish(Py_buffer **bufs, int n, int ok, const char *msg) {
    for (int i = 0; i < n; i++) PyBuffer_Release(bufs[i]);
    if (ok) Py_RETURN_NONE;
    PyErr_SetString(PyExc_ValueError, msg);
    return NULL;
}

/* open1b_kernels.ops.lmhead's integer route after the int8 GEMMs of one output block, rows
 * [r0, r1) of the n int32 products accs (n, R, C) - each level's, per contraction chunk -
 * with weights w (n, powers of two 2^sh[k]) and, when `base` is given, an int64 (R, C) part
 * of T computed elsewhere (the row-sparse slices' products, already weighted):
 * T = base + sum_k acc_k * w_k in float64 (exact: integers below 2^53, so any order),
 * out[r, c0 + c] = fp32((T * rowf[r]) * colf[c]) (two exact power-of-two multiplies, one
 * rounding: ozaki_mm_cpu's step 3), and T's row sums into rows (R,) and this piece's column
 * sums into cols (C,) as int64 modulo 2^64 (unsigned arithmetic: wrapping is defined) - the
 * exactness check's sums, of T itself, so a product given the wrong weight fails the check
 * as a dropped one does. One read of each product, one write of the output; `t`, `u`:
 * C-element row scratch. */
/* One row of levels_round_loop, all levels of a column at once (NL levels: a constant at
 * the calls for 2 and 3, so the level loop unrolls and the column loop vectorizes - one
 * pass over the products instead of a pass per level through row buffers). Per element
 * the same operations: t = ((base + a_0 w_0) + a_1 w_1) + ..., all exact (integers below
 * 2^53 times powers of two), then the two multiplies and the one rounding to float32; the
 * integer sums are exact in any order. */
static inline __attribute__((always_inline)) void
levels_row(const int32_t *a, Py_ssize_t plane, const int NL, const double *w, const int *sh,
           const int64_t *base, double rf, const double *colf, float *o, uint64_t *cols,
           uint64_t *rowsum, Py_ssize_t C) {
    uint64_t rs = 0;
    for (Py_ssize_t c = 0; c < C; c++) {
        double t = base ? (double)base[c] : 0.0;
        uint64_t u = base ? (uint64_t)base[c] : 0;
        for (int k = 0; k < NL; k++) {
            int32_t v = a[k * plane + c];
            t = t + (double)v * w[k];
            u += (uint64_t)(int64_t)v << sh[k];
        }
        o[c] = (float)((t * rf) * colf[c]);
        rs += u;
        cols[c] += u;
    }
    *rowsum += rs;
}

CLONES static void levels_round_loop(const int32_t *accs, Py_ssize_t n, const double *w,
                                     const int *sh, const int64_t *base, const double *rowf,
                                     const double *colf, float *out, double *t, uint64_t *u,
                                     uint64_t *rows, uint64_t *cols, Py_ssize_t R,
                                     Py_ssize_t C, Py_ssize_t stride, Py_ssize_t c0,
                                     Py_ssize_t r0, Py_ssize_t r1) {
    for (Py_ssize_t r = r0; r < r1; r++) {
        const int64_t *br = base ? base + r * C : NULL;
        if (n == 2 || n == 3) {
            if (n == 2)
                levels_row(accs + r * C, R * C, 2, w, sh, br, rowf[r], colf,
                           out + r * stride + c0, cols, rows + r, C);
            else
                levels_row(accs + r * C, R * C, 3, w, sh, br, rowf[r], colf,
                           out + r * stride + c0, cols, rows + r, C);
            continue;
        }
        for (Py_ssize_t c = 0; c < C; c++) {
            t[c] = br ? (double)br[c] : 0.0;
            u[c] = br ? (uint64_t)br[c] : 0;
        }
        for (Py_ssize_t k = 0; k < n; k++) {
            const int32_t *a = accs + k * R * C + r * C;
            double wk = w[k];
            int sk = sh[k];
            for (Py_ssize_t c = 0; c < C; c++) {
                t[c] = t[c] + (double)a[c] * wk;
                u[c] += (uint64_t)(int64_t)a[c] << sk;
            }
        }
        float *o = out + r * stride + c0;
        double rf = rowf[r];
        uint64_t rs = 0;
        for (Py_ssize_t c = 0; c < C; c++) {
            o[c] = (float)((t[c] * rf) * colf[c]);
            rs += u[c];
            cols[c] += u[c];
        }
        rows[r] += rs;
    }
}

/* levels_round_weighted(accs, n, w, rowf, colf, out, rows, cols, base, R, C, stride, c0,
 * r0, r1[, pieces]): base is an int64 (R, C) buffer or empty; every weight a power of two
 * 2^0 .. 2^62 (refused otherwise: the sums' shifts). n may be 0 with a base. */
static PyObject *py_levels_round(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer accs, w, rowf, colf, out, rows, cols, base;
    Py_ssize_t n, R, C, stride, c0, r0, r1;
    int pieces = 1;
    if (!PyArg_ParseTuple(args, "y*ny*y*y*w*w*w*y*nnnnnn|i", &accs, &n, &w, &rowf, &colf, &out,
                          &rows, &cols, &base, &R, &C, &stride, &c0, &r0, &r1, &pieces))
        return NULL;
    int ok = n >= 0 && R >= 0 && C >= 0 && c0 >= 0 && c0 + C <= stride &&
             0 <= r0 && r0 <= r1 && r1 <= R && accs.len == n * R * C * 4 && w.len == n * 8 &&
             rowf.len == R * 8 && colf.len == C * 8 && out.len == R * stride * 4 &&
             rows.len == R * 8 && cols.len == pieces * C * 8 &&
             (base.len == 0 || base.len == R * C * 8) && (n >= 1 || base.len);
    int *sh = ok ? malloc(sizeof(int) * (size_t)(n > 0 ? n : 1)) : NULL;
    if (!sh) ok = 0;
    for (Py_ssize_t k = 0; ok && k < n; k++) {
        int e;
        double m = frexp(((const double *)w.buf)[k], &e);   /* w = 0.5 * 2^e for a power */
        sh[k] = e - 1;
        ok = m == 0.5 && sh[k] >= 0 && sh[k] <= 62;
    }
    ok = ok && PIECES_OK(pieces);
    Py_ssize_t scratch = 2 * (C > 0 ? C : 1);           /* t (double) and u (int64) per piece */
    double *t = NULL;
    if (ok && !(t = malloc((size_t)scratch * pieces * 8))) ok = 0;
    if (ok) {
        const int64_t *b = base.len ? (const int64_t *)base.buf : NULL;
        Py_BEGIN_ALLOW_THREADS
        FOR_PIECES(r0, r1, pieces, {
            double *tp = t + piece * scratch;
            levels_round_loop(accs.buf, n, w.buf, sh, b, rowf.buf, colf.buf, out.buf, tp,
                              (uint64_t *)(tp + C), rows.buf, (uint64_t *)cols.buf + piece * C,
                              R, C, stride, c0, p_lo, p_hi);
        });
        Py_END_ALLOW_THREADS
    }
    free(t);
    free(sh);
    Py_buffer *bufs[] = {&accs, &w, &rowf, &colf, &out, &rows, &cols, &base};
    return finish(bufs, 8, ok, "levels_round_weighted: inconsistent shapes or row range, or a "
                               "weight that is not a power of two 2^0 .. 2^62");
}

/* open1b_kernels.ops.float_products' sum of one output block on the float route, rows [r0, r1):
 * the n float32 products parts (n, R, C) - each an exact float32 GEMM of one contraction
 * chunk, integers below 2^24 - times their weights w (n, powers of two) added to T
 * (float64 (R, C): from its values when `from_t`, else from 0; T is an exact integer, the
 * head product's or the earlier parts'): T' = ((T + p_0 w_0) + p_1 w_1) + ..., exact in any
 * order (integers below 2^53 times powers of two), then with `out` the rounding
 * out[r, c0 + c] = fp32((T' * rowf[r]) * colf[c]) (two exact power-of-two multiplies, one
 * rounding: ozaki_mm_cpu's step 3), else T' stored into T. One pass over the parts where
 * the torch code made one per part plus three over T (zero, two multiplies) and the copy;
 * `acc`: C doubles of row scratch. */
CLONES static void float_sum_loop(const float *parts, Py_ssize_t n, const double *w,
                                  double *t, int from_t, const double *rowf,
                                  const double *colf, float *out, double *acc, Py_ssize_t R,
                                  Py_ssize_t C, Py_ssize_t stride, Py_ssize_t c0,
                                  Py_ssize_t r0, Py_ssize_t r1) {
    for (Py_ssize_t r = r0; r < r1; r++) {
        double *tr = t + r * C;
        for (Py_ssize_t c = 0; c < C; c++) acc[c] = from_t ? tr[c] : 0.0;
        for (Py_ssize_t k = 0; k < n; k++) {
            const float *pk = parts + k * R * C + r * C;
            double wk = w[k];
            for (Py_ssize_t c = 0; c < C; c++) acc[c] = acc[c] + (double)pk[c] * wk;
        }
        if (out) {
            float *o = out + r * stride + c0;
            double rf = rowf[r];
            for (Py_ssize_t c = 0; c < C; c++) o[c] = (float)((acc[c] * rf) * colf[c]);
        } else {
            for (Py_ssize_t c = 0; c < C; c++) tr[c] = acc[c];
        }
    }
}

static PyObject *py_float_sum(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer parts, w, t, rowf, colf, out;
    Py_ssize_t n, R, C, stride, c0, r0, r1;
    int from_t, to_out, pieces = 1;
    if (!PyArg_ParseTuple(args, "y*ny*w*py*y*w*pnnnnnn|i", &parts, &n, &w, &t, &from_t, &rowf,
                          &colf, &out, &to_out, &R, &C, &stride, &c0, &r0, &r1, &pieces))
        return NULL;
    int ok = n >= 0 && R >= 0 && C >= 0 && c0 >= 0 && 0 <= r0 && r0 <= r1 && r1 <= R &&
             parts.len == n * R * C * 4 && w.len == n * 8 && t.len == R * C * 8 &&
             (!to_out || (c0 + C <= stride && rowf.len == R * 8 && colf.len == C * 8 &&
                          out.len == R * stride * 4));
    ok = ok && PIECES_OK(pieces);
    Py_ssize_t row = C > 0 ? C : 1;
    double *acc = NULL;
    if (ok && !(acc = malloc((size_t)row * pieces * 8))) ok = 0;
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        FOR_PIECES(r0, r1, pieces,
                   float_sum_loop(parts.buf, n, w.buf, t.buf, from_t, rowf.buf, colf.buf,
                                  to_out ? out.buf : NULL, acc + piece * row, R, C, stride,
                                  c0, p_lo, p_hi));
        Py_END_ALLOW_THREADS
    }
    free(acc);
    Py_buffer *bufs[] = {&parts, &w, &t, &rowf, &colf, &out};
    return finish(bufs, 6, ok, "float_sum: inconsistent shapes or row range");
}

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
    Py_buffer *bufs[] = {&src, &rows, &cols};
    return finish(bufs, 3, ok, "int_sums: inconsistent shapes or row range");
}

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
    Py_buffer *bufs[] = {&src, &y, &rows, &cols};
    return finish(bufs, 4, ok, "widen_sq: inconsistent shapes or row range");
}

/* open1b_kernels.ops.xent's backward for float32 logits, rows [r0, r1) of (R, V): the torch
 * code's float32 operations in its order - coef = 1 + TWO_Z * lse, d = exp(x - lse) * coef,
 * d - 1 at the target column, then d * g. A target outside [0, V) hits no column, as the
 * torch code's comparison. */
static const float XENT_TWO_Z = 0.00019999999494757503f;

CLONES static void xent_grad_loop(const float *x, const int64_t *t, const float *lse, float g,
                                  float *out, Py_ssize_t V, Py_ssize_t r0, Py_ssize_t r1) {
    for (Py_ssize_t r = r0; r < r1; r++) {
        const float *xr = x + r * V;
        float *o = out + r * V;
        float l = lse[r];
        float coef = 1.0f + XENT_TWO_Z * l;
        for (Py_ssize_t c = 0; c < V; c++) o[c] = (exp1(xr[c] - l) * coef) * g;
        int64_t tc = t[r];
        if (tc >= 0 && tc < V) o[tc] = ((exp1(xr[tc] - l) * coef) - 1.0f) * g;
    }
}

static PyObject *py_xent_grad(PyObject *self, PyObject *args) {
    (void)self;
    int pieces = 1;
    Py_buffer x, t, lse, out;
    Py_ssize_t R, V, r0, r1;
    double g;
    if (!PyArg_ParseTuple(args, "y*y*y*dw*nnnn|i", &x, &t, &lse, &g, &out, &R, &V, &r0, &r1,
                          &pieces))
        return NULL;
    int ok = R >= 0 && V >= 0 && 0 <= r0 && r0 <= r1 && r1 <= R && x.len == R * V * 4 &&
             out.len == R * V * 4 && t.len == R * 8 && lse.len == R * 4;
    ok = ok && PIECES_OK(pieces);
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        FOR_PIECES(r0, r1, pieces,
                   xent_grad_loop(x.buf, t.buf, lse.buf, (float)g, out.buf, V, p_lo, p_hi));
        Py_END_ALLOW_THREADS
    }
    Py_buffer *bufs[] = {&x, &t, &lse, &out};
    return finish(bufs, 4, ok, "xent_grad: inconsistent shapes or row range");
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
    Py_buffer *bufs[] = {&a, &v, &out};
    return finish(bufs, 3, ok, "mv_int8: inconsistent shapes or row range");
}

CLONES static void bf16_rne_loop(const float *x, uint16_t *out, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) out[i] = bf16_rne1(x[i]);
}

/* The quantizer's straight-through estimator (open1b_kernels.int8.quantize.ste_cpu) for rows
 * [r0, r1) of (R, C): v = x / div[row] (div one per row, or one for all when per_row is 0),
 * inside = -127 <= v <= 127, dx = bf16_rne(inside ? g : 0); with `term`, the LSQ term
 * (inside ? rne(clamp(v)) - v : clamp(v)) * g. x is bf16 bits or float32. */
/* One row of ste_loop; the flags are constants at each call below, so every variant is a
 * branch-free loop that vectorizes (a flag tested inside the loop kept it scalar). */
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

CLONES static void ste_loop(const float *g, const void *x, int x_bf16, const float *div,
                            int per_row, uint16_t *dx, float *term, Py_ssize_t C,
                            Py_ssize_t r0, Py_ssize_t r1) {
    for (Py_ssize_t r = r0; r < r1; r++) {
        float d = div[per_row ? r : 0];
        const float *gr = g + r * C;
        uint16_t *o = dx + r * C;
        const void *xr = x_bf16 ? (const void *)((const uint16_t *)x + r * C)
                                : (const void *)((const float *)x + r * C);
        if (x_bf16 && term) ste_row(gr, xr, 1, d, o, term + r * C, C);
        else if (x_bf16) ste_row(gr, xr, 1, d, o, NULL, C);
        else if (term) ste_row(gr, xr, 0, d, o, term + r * C, C);
        else ste_row(gr, xr, 0, d, o, NULL, C);
    }
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
    Py_buffer *bufs[] = {&acc, &rs, &cs, &out, &rows, &cols};
    return finish(bufs, 6, ok, "dequant: inconsistent shapes or row range");
}

/* open1b_kernels.ops.rmsnorm's CPU reference, one row at a time (rows [r0, r1) of (R, D)): the
 * same float32 operations in the same order, the row sums by open1b_kernels.core.reduce's pairwise
 * tree (zero-padded to P = the next power of two >= D, adjacent pairs level by level) in the
 * caller's scratch rows `ta`, `tb` (P floats each). x is bf16 bits; gain (D float32) or NULL.
 * Forward: ss = tree(x * x), rstd = 1 / sqrt_rn(ss * rd + eps), y = bf16(x * rstd [* g]). */
/* The smallest power of two >= n (1 for n <= 1): the tree's padded length. */
static inline Py_ssize_t pow2_ceil(Py_ssize_t n) {
    Py_ssize_t P = 1;
    while (P < n) P *= 2;
    return P;
}

static inline float tree_row(float *ta, float *tb, Py_ssize_t n, Py_ssize_t P) {
    for (Py_ssize_t i = n; i < P; i++) ta[i] = 0.0f;
    for (Py_ssize_t len = P / 2; len >= 1; len /= 2) {
        for (Py_ssize_t i = 0; i < len; i++) tb[i] = ta[2 * i] + ta[2 * i + 1];
        float *t = ta; ta = tb; tb = t;
    }
    return ta[0];
}


CLONES static void rms_fwd_loop(const uint16_t *x, const float *gain, float rd, float eps,
                                uint16_t *y, float *rstd, float *ta, float *tb, Py_ssize_t D,
                                Py_ssize_t P, Py_ssize_t r0, Py_ssize_t r1) {
    for (Py_ssize_t r = r0; r < r1; r++) {
        const uint16_t *xr = x + r * D;
        for (Py_ssize_t c = 0; c < D; c++) {
            float v = widen_bf16(xr[c]);
            ta[c] = v * v;
        }
        float ss = tree_row(ta, tb, D, P);
        float den = (float)sqrt((double)(ss * rd + eps));
        float rs = 1.0f / den;
        rstd[r] = rs;
        uint16_t *yr = y + r * D;
        for (Py_ssize_t c = 0; c < D; c++) {
            float v = widen_bf16(xr[c]) * rs;
            if (gain) v = v * gain[c];
            yr[c] = bf16_rne1(v);
        }
    }
}

/* Backward: xhat = x * rstd, dxhat = dy [* g], dot = tree(dxhat * xhat),
 * dx = bf16((dxhat - xhat * (dot * rd)) * rstd); with `prod`, also dy * xhat (float32 (R, D):
 * the gain gradient's terms, tree-summed over rows by the caller). dy is bf16 bits or
 * float32. */
CLONES static void rms_bwd_loop(const void *dy, int dy_bf16, const uint16_t *x,
                                const float *gain, const float *rstd, float rd, uint16_t *dx,
                                float *prod, float *ta, float *tb, Py_ssize_t D, Py_ssize_t P,
                                Py_ssize_t r0, Py_ssize_t r1) {
    for (Py_ssize_t r = r0; r < r1; r++) {
        const uint16_t *xr = x + r * D;
        float rs = rstd[r];
        for (Py_ssize_t c = 0; c < D; c++) {
            float d = dy_bf16 ? widen_bf16(((const uint16_t *)dy)[r * D + c])
                              : ((const float *)dy)[r * D + c];
            float xh = widen_bf16(xr[c]) * rs;
            float dxh = gain ? d * gain[c] : d;
            ta[c] = dxh * xh;
            if (prod) prod[r * D + c] = d * xh;
        }
        float dot = tree_row(ta, tb, D, P);
        float k = dot * rd;
        uint16_t *o = dx + r * D;
        for (Py_ssize_t c = 0; c < D; c++) {
            float d = dy_bf16 ? widen_bf16(((const uint16_t *)dy)[r * D + c])
                              : ((const float *)dy)[r * D + c];
            float xh = widen_bf16(xr[c]) * rs;
            float dxh = gain ? d * gain[c] : d;
            float v = xh * k;
            v = dxh - v;
            o[c] = bf16_rne1(v * rs);
        }
    }
}

static PyObject *py_rms_fwd(PyObject *self, PyObject *args) {
    (void)self;
    int pieces = 1;
    Py_buffer x, gain, y, rstd;
    Py_ssize_t R, D, r0, r1;
    float rd, eps;
    if (!PyArg_ParseTuple(args, "y*y*ffw*w*nnnn|i", &x, &gain, &rd, &eps, &y, &rstd, &R, &D,
                          &r0, &r1, &pieces))
        return NULL;
    int ok = R >= 0 && D > 0 && D <= (1 << 20) && 0 <= r0 && r0 <= r1 && r1 <= R &&
             x.len == R * D * 2 && (gain.len == D * 4 || gain.len == 0) && y.len == R * D * 2 &&
             rstd.len == R * 4;
    ok = ok && PIECES_OK(pieces);
    float *ta = NULL;
    Py_ssize_t P = pow2_ceil(D);
    if (ok && !(ta = malloc(sizeof(float) * 2 * P * pieces))) {
        ok = 0;
    }
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        FOR_PIECES(r0, r1, pieces, rms_fwd_loop(x.buf, gain.len ? gain.buf : NULL, rd, eps, y.buf,
                                                rstd.buf, ta + 2 * P * piece,
                                                ta + 2 * P * piece + P, D, P, p_lo, p_hi));
        Py_END_ALLOW_THREADS
    }
    free(ta);
    Py_buffer *bufs[] = {&x, &gain, &y, &rstd};
    return finish(bufs, 4, ok, "rms_fwd: inconsistent shapes or row range");
}

static PyObject *py_rms_bwd(PyObject *self, PyObject *args) {
    (void)self;
    int pieces = 1;
    Py_buffer dy, x, gain, rstd, dx, prod;
    Py_ssize_t R, D, r0, r1;
    int dy_bf16;
    float rd;
    if (!PyArg_ParseTuple(args, "y*py*y*y*fw*w*nnnn|i", &dy, &dy_bf16, &x, &gain, &rstd, &rd,
                          &dx, &prod, &R, &D, &r0, &r1, &pieces))
        return NULL;
    int ok = R >= 0 && D > 0 && D <= (1 << 20) && 0 <= r0 && r0 <= r1 && r1 <= R &&
             dy.len == R * D * (dy_bf16 ? 2 : 4) && x.len == R * D * 2 &&
             (gain.len == D * 4 || gain.len == 0) && rstd.len == R * 4 &&
             dx.len == R * D * 2 && (prod.len == R * D * 4 || prod.len == 0);
    ok = ok && PIECES_OK(pieces);
    float *ta = NULL;
    Py_ssize_t P = pow2_ceil(D);
    if (ok && !(ta = malloc(sizeof(float) * 2 * P * pieces))) {
        ok = 0;
    }
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        FOR_PIECES(r0, r1, pieces, rms_bwd_loop(dy.buf, dy_bf16, x.buf, gain.len ? gain.buf : NULL,
                                                rstd.buf, rd, dx.buf, prod.len ? prod.buf : NULL,
                                                ta + 2 * P * piece, ta + 2 * P * piece + P, D, P,
                                                p_lo, p_hi));
        Py_END_ALLOW_THREADS
    }
    free(ta);
    Py_buffer *bufs[] = {&dy, &x, &gain, &rstd, &dx, &prod};
    return finish(bufs, 6, ok, "rms_bwd: inconsistent shapes or row range");
}

/* open1b_kernels.ops.swiglu's CPU reference on rows [r0, r1) of the fused gate|up h (R, 2F), bf16
 * bits, one output row at a time: the torch code's float32 operations in its order (exp is
 * exp1, mathfn.exp's), each result rounded once to bf16 (bf16_rne1; NaN payloads are outside
 * the op's contract). Forward: y = (g / (exp(-g) + 1)) * u. Backward, with dy (R, F):
 * den = exp(-g) + 1, s = g / den, sig = 1 / den, dsilu = sig * ((g * (1 - sig)) + 1),
 * dh = [(dy * u) * dsilu | dy * s]. */
CLONES static void swiglu_loop(const uint16_t *h, const uint16_t *dy, uint16_t *out,
                               Py_ssize_t F, Py_ssize_t r0, Py_ssize_t r1) {
    for (Py_ssize_t r = r0; r < r1; r++) {
        const uint16_t *gr = h + r * 2 * F, *ur = gr + F;
        if (!dy) {
            uint16_t *o = out + r * F;
            for (Py_ssize_t c = 0; c < F; c++) {
                float g = widen_bf16(gr[c]), u = widen_bf16(ur[c]);
                float den = exp1(-g) + 1.0f;
                o[c] = bf16_rne1((g / den) * u);
            }
        } else {
            const uint16_t *dr = dy + r * F;
            uint16_t *og = out + r * 2 * F, *ou = og + F;
            for (Py_ssize_t c = 0; c < F; c++) {
                float g = widen_bf16(gr[c]), u = widen_bf16(ur[c]), d = widen_bf16(dr[c]);
                float den = exp1(-g) + 1.0f;
                float sv = g / den;
                float sig = 1.0f / den;
                float dsilu = sig * ((g * (1.0f - sig)) + 1.0f);
                og[c] = bf16_rne1((d * u) * dsilu);
                ou[c] = bf16_rne1(d * sv);
            }
        }
    }
}

static PyObject *py_swiglu(PyObject *self, PyObject *args) {
    (void)self;
    int pieces = 1;
    Py_buffer h, dy, out;
    Py_ssize_t R, F, r0, r1;
    if (!PyArg_ParseTuple(args, "y*y*w*nnnn|i", &h, &dy, &out, &R, &F, &r0, &r1,
                          &pieces))
        return NULL;
    int bwd = dy.len != 0;
    int ok = R >= 0 && F >= 0 && 0 <= r0 && r0 <= r1 && r1 <= R && h.len == R * 2 * F * 2 &&
             (!bwd || dy.len == R * F * 2) && out.len == R * F * 2 * (bwd ? 2 : 1);
    ok = ok && PIECES_OK(pieces);
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        FOR_PIECES(r0, r1, pieces,
                   swiglu_loop(h.buf, bwd ? dy.buf : NULL, out.buf, F, p_lo, p_hi));
        Py_END_ALLOW_THREADS
    }
    Py_buffer *bufs[] = {&h, &dy, &out};
    return finish(bufs, 3, ok, "swiglu: inconsistent shapes or row range");
}

/* open1b_kernels.ops.rope's CPU rotation (_rotate_cpu) for bf16 x (rows of D = 2 half, one row per
 * (batch, token, head), H heads per token, T tokens), rows [r0, r1): with c = cos[t, i] and
 * s = sin[t, i] * sign (sign +-1: exact), y1 = x1 * c - x2 * s and y2 = x2 * c + x1 * s,
 * each product rounded, then one add or subtract, never fused; rounded once to bf16. */
CLONES static void rope_loop(const uint16_t *x, const float *cosv, const float *sinv,
                             float sign, uint16_t *out, Py_ssize_t T, Py_ssize_t H,
                             Py_ssize_t half, Py_ssize_t r0, Py_ssize_t r1) {
    for (Py_ssize_t r = r0; r < r1; r++) {
        Py_ssize_t t = (r / H) % T;
        const uint16_t *xr = x + r * 2 * half;
        uint16_t *o = out + r * 2 * half;
        const float *c = cosv + t * half, *sn = sinv + t * half;
        for (Py_ssize_t i = 0; i < half; i++) {
            float x1 = widen_bf16(xr[i]), x2 = widen_bf16(xr[half + i]);
            float ci = c[i], si = sn[i] * sign;
            float a = x1 * ci, b = x2 * si;
            o[i] = bf16_rne1(a - b);
            float e = x2 * ci, f = x1 * si;
            o[half + i] = bf16_rne1(e + f);
        }
    }
}

static PyObject *py_rope(PyObject *self, PyObject *args) {
    (void)self;
    int pieces = 1;
    Py_buffer x, cs, sn, out;
    Py_ssize_t R, T, H, half, r0, r1;
    float sign;
    if (!PyArg_ParseTuple(args, "y*y*y*fw*nnnnnn|i", &x, &cs, &sn, &sign, &out, &R, &T, &H,
                          &half, &r0, &r1, &pieces))
        return NULL;
    int ok = R >= 0 && T > 0 && H > 0 && half >= 0 && R % (T * H) == 0 && 0 <= r0 &&
             r0 <= r1 && r1 <= R && x.len == R * 2 * half * 2 && out.len == x.len &&
             cs.len == T * half * 4 && sn.len == T * half * 4 && (sign == 1.0f || sign == -1.0f);
    ok = ok && PIECES_OK(pieces);
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        FOR_PIECES(r0, r1, pieces, rope_loop(x.buf, cs.buf, sn.buf, sign, out.buf, T, H, half,
                                             p_lo, p_hi));
        Py_END_ALLOW_THREADS
    }
    Py_buffer *bufs[] = {&x, &cs, &sn, &out};
    return finish(bufs, 4, ok, "rope: inconsistent shapes, sign or row range");
}

/* open1b_kernels.ops.xent's row logsumexp (row_lse_cpu) for float32 logits, rows [r0, r1) of
 * (R, V): the online softmax over CH-column chunks in ascending order (the last padded
 * with -inf), the torch code's operations in its order - the chunk maximum (NaN-sticky, as
 * torch's amax), m' = maximum(m, c) (NaN if either is), s = s * exp(m - m') + tree(exp(x -
 * m')) with the pairwise tree over the CH (a power of two) columns, lse = m + log(s). `ta`,
 * `tb`: CH floats each of scratch. */
/* The chunk maximum in 16 lanes (the sequential scalar max is one long dependency chain):
 * the largest value when no element is NaN - NaN when one is - and any zero maximum's sign
 * left to the caller's scalar loop, which alone fixes it (the first zero wins there).
 * Otherwise the maximum is order-free, so the same value. */

static inline float chunk_max(const float *x, Py_ssize_t n) {
    v16f mx = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY,
               -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY,
               -INFINITY, -INFINITY};
    v16i nan = {0};
    Py_ssize_t c = 0;
    for (; c + 16 <= n; c += 16) {
        v16f v;
        memcpy(&v, x + c, sizeof v);
        v16i gt = v > mx;
        nan |= v != v;
        mx = (v16f)(((v16i)v & gt) | ((v16i)mx & ~gt));
    }
    float m = -INFINITY;
    int any_nan = 0;
    for (int j = 0; j < 16; j++) {
        any_nan |= nan[j] != 0;
        m = mx[j] > m ? mx[j] : m;
    }
    for (; c < n; c++) {
        any_nan |= x[c] != x[c];
        m = x[c] > m ? x[c] : m;
    }
    return any_nan ? NAN : m;
}

CLONES static void xent_lse_loop(const float *x, float *lse, float *ta, float *tb,
                                 Py_ssize_t V, Py_ssize_t CH, Py_ssize_t r0, Py_ssize_t r1) {
    for (Py_ssize_t r = r0; r < r1; r++) {
        const float *xr = x + r * V;
        float m = -INFINITY, s = 0.0f;
        for (Py_ssize_t c0 = 0; c0 < V; c0 += CH) {
            Py_ssize_t n = V - c0 < CH ? V - c0 : CH;
            float cm = chunk_max(xr + c0, n);
            if (cm != cm || cm == 0.0f) {   /* a NaN, or a zero whose sign is the first's */
                cm = n < CH ? -INFINITY : xr[c0];
                for (Py_ssize_t c = 0; c < n; c++) {
                    float v = xr[c0 + c];
                    cm = (v > cm || v != v || cm != cm) ? (cm != cm ? cm : v) : cm;
                }
            }
            float mn = (m != m || cm != cm) ? NAN : (cm > m ? cm : m);
            for (Py_ssize_t c = 0; c < n; c++) ta[c] = exp1(xr[c0 + c] - mn);
            for (Py_ssize_t c = n; c < CH; c++) ta[c] = exp1(-INFINITY - mn);
            float cs = tree_row(ta, tb, CH, CH);
            float sc = s * exp1(m - mn);
            s = sc + cs;
            m = mn;
        }
        lse[r] = m + log1(s);
    }
}

static PyObject *py_xent_lse(PyObject *self, PyObject *args) {
    (void)self;
    int pieces = 1;
    Py_buffer x, lse;
    Py_ssize_t R, V, CH, r0, r1;
    if (!PyArg_ParseTuple(args, "y*w*nnnnn|i", &x, &lse, &R, &V, &CH, &r0, &r1,
                          &pieces))
        return NULL;
    int ok = R >= 0 && V > 0 && CH > 0 && (CH & (CH - 1)) == 0 && 0 <= r0 && r0 <= r1 &&
             r1 <= R && x.len == R * V * 4 && lse.len == R * 4;
    ok = ok && PIECES_OK(pieces);
    float *ta = NULL;
    if (ok && !(ta = malloc(sizeof(float) * 2 * CH * pieces))) ok = 0;
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        FOR_PIECES(r0, r1, pieces, xent_lse_loop(x.buf, lse.buf, ta + 2 * CH * piece,
                                                 ta + 2 * CH * piece + CH, V, CH, p_lo, p_hi));
        Py_END_ALLOW_THREADS
    }
    free(ta);
    Py_buffer *bufs[] = {&x, &lse};
    return finish(bufs, 2, ok, "xent_lse: inconsistent shapes or row range");
}

/* open1b_kernels.int8.quantize.rotate_quantize_cols_cpu: rotate the columns [c0, c1) of the
 * float32 (R, C) buffer y (R a multiple of B) after filling it from a source, in L2-sized
 * tiles (tr rows x tc columns, whole B-row blocks); per tile: fill, the butterfly stages
 * (fwht_dim0_loop: the same operations as hadamard_dim0_cpu_), the exact power-of-two
 * scale, and the running column maximum and minimum (NaN-sticky, as torch's amax/amin and
 * maximum/minimum). Sources, rows >= P zero:
 *   kind 0 - bf16 (P, C) row-major: y[i, j] = s[i, j]
 *   kind 1 - y already holds the data (widen_t wrote a transposed bf16 source into it)
 *   kind 2 - int8 (P, C): y[i, j] = (float)s[i, j]
 *   kind 3 - int8 (P, C) times a row scale: y[i, j] = (float)s[i, j] * rs[i] (one rounding). */
static inline float nan_max(float a, float b) { return (a != a || b != b) ? NAN : (b > a ? b : a); }
static inline float nan_min(float a, float b) { return (a != a || b != b) ? NAN : (b < a ? b : a); }
#define NAN_BITS 0x7fc00000  /* the float bits of NAN (GCC: __builtin_nanf(""), quiet, +) */
/* nan_max (OP >) or nan_min (OP <) of every lane of ACC and V into ACC: NaN's bits where
 * either is NaN, else V where V OP ACC, else ACC - the scalar functions lane by lane. */
#define VNAN_EXT_T(ACC, V, OP, VI, VF) {                                                  \
        VI bad_ = ((ACC) != (ACC)) | ((V) != (V)), take_ = (V) OP (ACC);                  \
        VI m_ = ((VI)(V) & take_) | ((VI)(ACC) & ~take_);                                 \
        (ACC) = (VF)((m_ & ~bad_) | (((VI){0} + NAN_BITS) & bad_)); }

CLONES static void rotq_fill(int kind, const void *src, const float *rs, Py_ssize_t P,
                             float *y, Py_ssize_t C, Py_ssize_t r0, Py_ssize_t r1,
                             Py_ssize_t c0, Py_ssize_t c1) {
    if (kind == 1) return;                   /* filled by widen_t before (see py_widen_t) */
    for (Py_ssize_t i = r0; i < r1; i++) {
        float *yi = y + i * C;
        if (i >= P) {
            for (Py_ssize_t j = c0; j < c1; j++) yi[j] = 0.0f;
        } else if (kind == 0) {
            const uint16_t *si = (const uint16_t *)src + i * C;
            for (Py_ssize_t j = c0; j < c1; j++) yi[j] = widen_bf16(si[j]);
        } else if (kind == 2) {
            const int8_t *si = (const int8_t *)src + i * C;
            for (Py_ssize_t j = c0; j < c1; j++) yi[j] = (float)si[j];
        } else {
            const int8_t *si = (const int8_t *)src + i * C;
            float sc = rs[i];
            for (Py_ssize_t j = c0; j < c1; j++) yi[j] = (float)si[j] * sc;
        }
    }
}

CLONES static void rotq_finish(float *y, Py_ssize_t C, Py_ssize_t r0, Py_ssize_t r1,
                               Py_ssize_t c0, Py_ssize_t c1, float scale, float *cmax,
                               float *cmin) {
    for (Py_ssize_t i = r0; i < r1; i++) {
        float *yi = y + i * C;
        for (Py_ssize_t j = c0; j < c1; j++) {
            float v = yi[j] * scale;
            yi[j] = v;
            cmax[j] = nan_max(cmax[j], v);
            cmin[j] = nan_min(cmin[j], v);
        }
    }
}

/* The same tile for B = 256 in two register passes over whole W-column vectors (W = 16, or
 * 8 in the x86-64-v3 copies: 16 rows of 8 floats fill AVX2's 16 ymm registers, where the
 * 16-lane body, two ymm a vector, spilled about two of every three vector operations to the
 * stack - on a Zen 3 the rotation of the gate|up weight ran 0.8x the time with 8 lanes,
 * the same bits: each column is its own transform, whatever the lanes): pass 1
 * fills 16 rows of a vector from the source (rotq_fill's conversions, the same operation
 * per element) and runs the stages h = 1..8 (fwht16_vec's); pass 2 runs the stages
 * h = 16..128 on a residue class of 16 rows, the scale (rotq_finish's multiply) and the
 * store, then the class's column extremes (rotq_finish's, read back from L1): two sweeps
 * over the tile instead of four. The extremes meet the rows in another order, which only
 * the sign of a zero extreme can show (NaN-sticky maxima are otherwise order-free), and
 * the caller takes max(|cmax|, |cmin|). (Written with scalar compares: GCC lowered vector
 * comparisons of the vector extension to scalar code here.) Returns the first column the
 * vectors did not cover (the caller runs rotq_fill, fwht_dim0_loop and rotq_finish on the
 * rest). */
typedef uint16_t v16u16 __attribute__((vector_size(32)));
typedef int8_t v16i8 __attribute__((vector_size(16)));


/* One vector of columns [c, c + W) of row i (rotq_fill's conversion per element), for
 * W = 16 (rotq_load16) and W = 8 (rotq_load8). */
#define ROTQ_LOAD(NAME, VF, VI, VU16, VI8)                                                    \
    static inline __attribute__((always_inline)) void NAME(int kind, const void *src,         \
                                                           const float *rs, Py_ssize_t P,     \
                                                           const float *y, Py_ssize_t C,      \
                                                           Py_ssize_t i, Py_ssize_t c,        \
                                                           VF *out) {                         \
        VF f;                                                                                 \
        if (kind == 1) {                                                                      \
            memcpy(&f, y + i * C + c, sizeof f);                                              \
        } else if (i >= P) {                                                                  \
            f = (VF){0};                                                                      \
        } else if (kind == 0) {                                                               \
            VU16 h;                                                                           \
            memcpy(&h, (const uint16_t *)src + i * C + c, sizeof h);                          \
            f = (VF)(__builtin_convertvector(h, VI) << 16);          /* widen_bf16 */         \
        } else {                                                                              \
            VI8 b;                                                                            \
            memcpy(&b, (const int8_t *)src + i * C + c, sizeof b);                            \
            f = __builtin_convertvector(__builtin_convertvector(b, VI), VF);  /* exact */     \
            if (kind == 3) f = f * rs[i];                                  /* one rounding */ \
        }                                                                                     \
        *out = f;                                                                             \
    }
typedef uint16_t v8u16 __attribute__((vector_size(16)));
typedef int8_t v8i8 __attribute__((vector_size(8)));
ROTQ_LOAD(rotq_load16, v16f, v16i, v16u16, v16i8)
ROTQ_LOAD(rotq_load8, v8f, v8i, v8u16, v8i8)

#define VEC(W) VEC_(W)
#define VEC_(W) v##W##f
#define VINT(W) VINT_(W)
#define VINT_(W) v##W##i
#define LOAD(W) LOAD_(W)
#define LOAD_(W) rotq_load##W
#define STAGES(W) STAGES_(W)
#define STAGES_(W) STAGES_##W
#define STAGES_16 stages16
#define STAGES_8 stages16_8
#define ROTQ_TILE(NAME, KIND, ATTR, VEXT, W)                                                  \
    ATTR static Py_ssize_t NAME(const void *src, const float *rs, Py_ssize_t P, float *y,     \
                                  Py_ssize_t C, Py_ssize_t r0, Py_ssize_t r1, Py_ssize_t c0,  \
                                  Py_ssize_t c1, float scale, float *cmax, float *cmin) {     \
        Py_ssize_t cv = c0 + (c1 - c0) / W * W;                                               \
        for (Py_ssize_t base = r0; base < r1; base += 256) {                                  \
            for (Py_ssize_t q = 0; q < 256; q += 16)                                          \
                for (Py_ssize_t c = c0; c < cv; c += W) {                                     \
                    VEC(W) v[16];                                                             \
                    for (int t = 0; t < 16; t++)                                              \
                        LOAD(W)(KIND,   src, rs, P, y, C, base + q + t, c, &v[t]);            \
                    STAGES(W)(v);                                                             \
                    for (int t = 0; t < 16; t++)                                              \
                        memcpy(y + (base + q + t) * C + c, &v[t], 4 * W);                     \
                }                                                                             \
            for (Py_ssize_t j = 0; j < 16; j++)                                               \
                for (Py_ssize_t c = c0; c < cv; c += W) {                                     \
                    VEC(W) v[16];                                                             \
                    for (int t = 0; t < 16; t++)                                              \
                        memcpy(&v[t], y + (base + j + 16 * t) * C + c, 4 * W);                \
                    STAGES(W)(v);                                                             \
                    for (int t = 0; t < 16; t++) {                                            \
                        v[t] = v[t] * scale;                                                  \
                        memcpy(y + (base + j + 16 * t) * C + c, &v[t], 4 * W);                \
                    }                                                                         \
                    if (VEXT) {                  /* the extremes lane by lane, in registers */ \
                        VEC(W) mx, mn;                                                        \
                        memcpy(&mx, cmax + c, 4 * W);                                         \
                        memcpy(&mn, cmin + c, 4 * W);                                         \
                        for (int t = 0; t < 16; t++) {                                        \
                            VNAN_EXT_T(mx, v[t], >, VINT(W), VEC(W));                         \
                            VNAN_EXT_T(mn, v[t], <, VINT(W), VEC(W));                         \
                        }                                                                     \
                        memcpy(cmax + c, &mx, 4 * W);                                         \
                        memcpy(cmin + c, &mn, 4 * W);                                         \
                    } else                                                                    \
                    for (int t = 0; t < 16; t++) {     /* rotq_finish's extremes, from L1 */  \
                        const float *yr = y + (base + j + 16 * t) * C + c;                    \
                        for (int l = 0; l < W; l++) {                                         \
                            cmax[c + l] = nan_max(cmax[c + l], yr[l]);                        \
                            cmin[c + l] = nan_min(cmin[c + l], yr[l]);                        \
                        }                                                                     \
                    }                                                                         \
                }                                                                             \
        }                                                                                     \
        return cv;                                                                            \
    }
ROTQ_TILE(rotq_tile_k0, 0, CLONES, 0, 16)
ROTQ_TILE(rotq_tile_k1, 1, CLONES, 0, 16)
ROTQ_TILE(rotq_tile_k2, 2, CLONES, 0, 16)
ROTQ_TILE(rotq_tile_k3, 3, CLONES, 0, 16)
#if HAVE_V4
ROTQ_TILE(rotq_tile_v4_k0, 0, V4, 1, 16)
ROTQ_TILE(rotq_tile_v4_k1, 1, V4, 1, 16)
ROTQ_TILE(rotq_tile_v4_k2, 2, V4, 1, 16)
ROTQ_TILE(rotq_tile_v4_k3, 3, V4, 1, 16)
ROTQ_TILE(rotq_tile_v3_k0, 0, V3, 1, 8)
ROTQ_TILE(rotq_tile_v3_k1, 1, V3, 1, 8)
ROTQ_TILE(rotq_tile_v3_k2, 2, V3, 1, 8)
ROTQ_TILE(rotq_tile_v3_k3, 3, V3, 1, 8)
#endif

/* The tile copies by CPU level (rows: the target_clones copies, x86-64-v4, x86-64-v3) and
 * source kind (columns). */
typedef Py_ssize_t (*rotq_tile_fn)(const void *, const float *, Py_ssize_t, float *,
                                   Py_ssize_t, Py_ssize_t, Py_ssize_t, Py_ssize_t, Py_ssize_t,
                                   float, float *, float *);
static const rotq_tile_fn rotq_tiles[][4] = {
    {rotq_tile_k0, rotq_tile_k1, rotq_tile_k2, rotq_tile_k3},
#if HAVE_V4
    {rotq_tile_v4_k0, rotq_tile_v4_k1, rotq_tile_v4_k2, rotq_tile_v4_k3},
    {rotq_tile_v3_k0, rotq_tile_v3_k1, rotq_tile_v3_k2, rotq_tile_v3_k3},
#endif
};

static Py_ssize_t rotq_tile256(int kind, const void *src, const float *rs, Py_ssize_t P,
                               float *y, Py_ssize_t C, Py_ssize_t r0, Py_ssize_t r1,
                               Py_ssize_t c0, Py_ssize_t c1, float scale, float *cmax,
                               float *cmin) {
    int level = 0;
#if HAVE_V4
    level = v4_ok ? 1 : v3_ok ? 2 : 0;
#endif
    return rotq_tiles[level][kind](src, rs, P, y, C, r0, r1, c0, c1, scale, cmax, cmin);
}

/* v4([on]) and v3([on]): whether the plain x86-64-v4 copies run, and the x86-64-v3 ones
 * where those do not (False where the CPU or the build has none); with an argument, switch
 * them off (0) or back on where available (1), so that a test on an AVX-512 machine also
 * runs the copies every other CPU takes. */
static PyObject *copy_switch(PyObject *args, int *flag, int v4) {
    int on = -1;
    if (!PyArg_ParseTuple(args, "|i", &on)) return NULL;
#if HAVE_V4
    if (on >= 0) {
        __builtin_cpu_init();
        *flag = on && (v4 ? __builtin_cpu_supports("x86-64-v4")
                          : __builtin_cpu_supports("x86-64-v3"));
    }
    return PyBool_FromLong(*flag);
#else
    (void)on;
    (void)flag;
    (void)v4;
    Py_RETURN_FALSE;
#endif
}

#if !HAVE_V4
static int v4_ok, v3_ok;                /* never set: no plain copies in this build */
#endif
static PyObject *py_v4(PyObject *self, PyObject *args) {
    (void)self;
    return copy_switch(args, &v4_ok, 1);
}
static PyObject *py_v3(PyObject *self, PyObject *args) {
    (void)self;
    return copy_switch(args, &v3_ok, 0);
}

static PyObject *py_rotq(PyObject *self, PyObject *args) {
    (void)self;
    int pieces = 1;
    Py_buffer src, rs, y, cmax, cmin;
    int kind;
    Py_ssize_t P, R, C, B, tr, tc, c0, c1;
    float scale;
    if (!PyArg_ParseTuple(args, "iy*y*nw*nnnfw*w*nnnn|i", &kind, &src, &rs, &P, &y, &R, &C, &B,
                          &scale, &cmax, &cmin, &tr, &tc, &c0, &c1, &pieces))
        return NULL;
    Py_ssize_t esize = kind == 0 ? 2 : 1;
    int ok = kind >= 0 && kind <= 3 && B >= 2 && (B & (B - 1)) == 0 && R % B == 0 &&
             0 <= P && P <= R && tr > 0 && tr % B == 0 && tc > 0 && 0 <= c0 && c0 <= c1 &&
             c1 <= C && (kind == 1 || src.len == P * C * esize) && y.len == R * C * 4 &&
             cmax.len == C * 4 && cmin.len == C * 4 && (kind != 3 || rs.len == P * 4);
    ok = ok && PIECES_OK(pieces);
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        FOR_PIECES(c0, c1, pieces, {
        for (Py_ssize_t j0 = p_lo; j0 < p_hi; j0 += tc) {
            Py_ssize_t j1 = j0 + tc < p_hi ? j0 + tc : p_hi;
            for (Py_ssize_t i0 = 0; i0 < R; i0 += tr) {
                Py_ssize_t i1 = i0 + tr < R ? i0 + tr : R;
                Py_ssize_t jt = j0;         /* the columns left to the scalar loops */
                if (B == 256)
                    jt = rotq_tile256(kind, src.buf, kind == 3 ? rs.buf : NULL, P, y.buf, C,
                                      i0, i1, j0, j1, scale, cmax.buf, cmin.buf);
                if (jt < j1) {
                    rotq_fill(kind, src.buf, kind == 3 ? rs.buf : NULL, P, y.buf, C, i0, i1,
                              jt, j1);
                    fwht_dim0_loop(y.buf, C, i0, i1, B, jt, j1);
                    rotq_finish(y.buf, C, i0, i1, jt, j1, scale, cmax.buf, cmin.buf);
                }
            }
        }
        });
        Py_END_ALLOW_THREADS
    }
    Py_buffer *bufs[] = {&src, &rs, &y, &cmax, &cmin};
    return finish(bufs, 5, ok, "rotq: inconsistent shapes, kind or column range");
}

/* A 4 x 4 transpose in 64-bit words (the standard block swaps: exchange the off-diagonal
 * halves, then quarters): x[r] holds row r of a 4 x 4 block of 16-bit elements (element k
 * at bits 16k); afterwards x[r] holds column r. Bit moves only; the caller composes and
 * splits the words with shifts, so the element order does not depend on the byte order. */
static inline void transpose4x16(uint64_t *x) {
    for (int r = 0; r < 2; r++) {
        uint64_t t = ((x[r] >> 32) ^ x[r + 2]) & 0x00000000FFFFFFFFull;
        x[r] ^= t << 32;
        x[r + 2] ^= t;
    }
    for (int r = 0; r < 4; r += 2) {
        uint64_t t = ((x[r] >> 16) ^ x[r + 1]) & 0x0000FFFF0000FFFFull;
        x[r] ^= t << 16;
        x[r + 1] ^= t;
    }
}

/* A bf16 (Q, P) row-major source into the float32 (R, Q) buffer y transposed, rows
 * [r0, r1) of y: y[i, j] = s[j, i] for i < P, zero rows from P. In 64 x 64 blocks (one
 * block of each in L1, few pages at a time): torch's transposed copy is 3-4x slower. Inside
 * a block, 4 x 4 tiles transposed in 64-bit words (four loads of four source elements,
 * four rows of four stores) where an element at a time walked a source column; the edges
 * element by element. Bit moves and the exact widening: the same values. */
CLONES static void widen_t_loop(const uint16_t *src, float *y, Py_ssize_t P, Py_ssize_t Q,
                                Py_ssize_t r0, Py_ssize_t r1) {
    for (Py_ssize_t ib = r0; ib < r1; ib += 64) {
        Py_ssize_t ie = ib + 64 < r1 ? ib + 64 : r1;
        Py_ssize_t real = ie < P ? ie : P;              /* rows of y with a source column */
        Py_ssize_t iv = real > ib ? ib + (real - ib) / 4 * 4 : ib;
        for (Py_ssize_t jb = 0; jb < Q; jb += 64) {
            Py_ssize_t je = jb + 64 < Q ? jb + 64 : Q;
            Py_ssize_t jv = jb + (je - jb) / 4 * 4;
            for (Py_ssize_t i0 = ib; i0 < iv; i0 += 4)
                for (Py_ssize_t j0 = jb; j0 < jv; j0 += 4) {
                    uint64_t x[4];
                    for (int r = 0; r < 4; r++) {
                        const uint16_t *sr = src + (j0 + r) * P + i0;
                        x[r] = (uint64_t)sr[0] | (uint64_t)sr[1] << 16 |
                               (uint64_t)sr[2] << 32 | (uint64_t)sr[3] << 48;
                    }
                    transpose4x16(x);
                    for (int r = 0; r < 4; r++) {
                        float *yr = y + (i0 + r) * Q + j0;
                        for (int k = 0; k < 4; k++)
                            yr[k] = widen_bf16((uint16_t)(x[r] >> (16 * k)));
                    }
                }
            for (Py_ssize_t i = ib; i < ie; i++) {
                float *yi = y + i * Q;
                if (i >= P) {
                    for (Py_ssize_t j = jb; j < je; j++) yi[j] = 0.0f;
                    continue;
                }
                for (Py_ssize_t j = i < iv ? jv : jb; j < je; j++)
                    yi[j] = widen_bf16(src[j * P + i]);
            }
        }
    }
}

static PyObject *py_widen_t(PyObject *self, PyObject *args) {
    (void)self;
    int pieces = 1;
    Py_buffer src, y;
    Py_ssize_t P, Q, R, r0, r1;
    if (!PyArg_ParseTuple(args, "y*w*nnnnn|i", &src, &y, &P, &Q, &R, &r0, &r1,
                          &pieces))
        return NULL;
    int ok = 0 <= P && P <= R && Q >= 0 && 0 <= r0 && r0 <= r1 && r1 <= R &&
             src.len == P * Q * 2 && y.len == R * Q * 4;
    ok = ok && PIECES_OK(pieces);
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        FOR_PIECES(r0, r1, pieces, widen_t_loop(src.buf, y.buf, P, Q, p_lo, p_hi));
        Py_END_ALLOW_THREADS
    }
    Py_buffer *bufs[] = {&src, &y};
    return finish(bufs, 2, ok, "widen_t: inconsistent shapes or row range");
}

/* The codes of rotate_quantize_cols_cpu: rows [r0, r1) of float32 y (R, C), v = y / div[j]
 * (IEEE division), clamped to [-127, 127] when `clamp`, rounded half to even, as int8 into
 * out (R, C), or into out (C, R) when `transposed`. */
CLONES static void codes_loop(const float *y, const float *div, int clamp, int8_t *out,
                              int transposed, Py_ssize_t R, Py_ssize_t C, Py_ssize_t r0,
                              Py_ssize_t r1) {
    if (!transposed) {
        for (Py_ssize_t i = r0; i < r1; i++)
            for (Py_ssize_t j = 0; j < C; j++) {
                float v = y[i * C + j] / div[j];
                if (clamp) v = v < -127.0f ? -127.0f : (v > 127.0f ? 127.0f : v);
                out[i * C + j] = (int8_t)(int32_t)rintf(v);
            }
        return;
    }
    int8_t blk[64 * 64];                /* 64 x 64 blocks: codes by rows (vectorized), then
                                           one transposed store of the block */
    for (Py_ssize_t ib = r0; ib < r1; ib += 64)
        for (Py_ssize_t jb = 0; jb < C; jb += 64) {
            Py_ssize_t ie = ib + 64 < r1 ? ib + 64 : r1, je = jb + 64 < C ? jb + 64 : C;
            for (Py_ssize_t i = ib; i < ie; i++)
                for (Py_ssize_t j = jb; j < je; j++) {
                    float v = y[i * C + j] / div[j];
                    if (clamp) v = v < -127.0f ? -127.0f : (v > 127.0f ? 127.0f : v);
                    blk[(i - ib) * 64 + (j - jb)] = (int8_t)(int32_t)rintf(v);
                }
            for (Py_ssize_t j = jb; j < je; j++)
                for (Py_ssize_t i = ib; i < ie; i++) out[j * R + i] = blk[(i - ib) * 64 + (j - jb)];
        }
}

/* open1b_kernels.int8.quantize.quantize_cpu on rows [r0, r1) of (R, C), bf16 bits or float32:
 * v = x / div[row] (or div[0] for all rows), clamped to [-127, 127], rounded half to even,
 * as int8. */
CLONES static void quant_loop(const void *x, int x_bf16, const float *div, int per_row,
                              int8_t *out, Py_ssize_t C, Py_ssize_t r0, Py_ssize_t r1) {
    for (Py_ssize_t r = r0; r < r1; r++) {
        float d = div[per_row ? r : 0];
        int8_t *o = out + r * C;
        if (x_bf16) {
            const uint16_t *xr = (const uint16_t *)x + r * C;
            for (Py_ssize_t c = 0; c < C; c++) {
                float v = widen_bf16(xr[c]) / d;
                v = v < -127.0f ? -127.0f : (v > 127.0f ? 127.0f : v);
                o[c] = (int8_t)(int32_t)rintf(v);
            }
        } else {
            const float *xr = (const float *)x + r * C;
            for (Py_ssize_t c = 0; c < C; c++) {
                float v = xr[c] / d;
                v = v < -127.0f ? -127.0f : (v > 127.0f ? 127.0f : v);
                o[c] = (int8_t)(int32_t)rintf(v);
            }
        }
    }
}

static PyObject *py_quant(PyObject *self, PyObject *args) {
    (void)self;
    int pieces = 1;
    Py_buffer x, div, out;
    int x_bf16;
    Py_ssize_t R, C, r0, r1;
    if (!PyArg_ParseTuple(args, "y*py*w*nnnn|i", &x, &x_bf16, &div, &out, &R, &C, &r0, &r1,
                          &pieces))
        return NULL;
    int per_row = div.len == R * 4 && R != 1;
    int ok = R >= 0 && C >= 0 && 0 <= r0 && r0 <= r1 && r1 <= R &&
             x.len == R * C * (x_bf16 ? 2 : 4) && (div.len == 4 || div.len == R * 4) &&
             out.len == R * C;
    ok = ok && PIECES_OK(pieces);
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        FOR_PIECES(r0, r1, pieces, quant_loop(x.buf, x_bf16, div.buf, per_row, out.buf, C, p_lo,
                                              p_hi));
        Py_END_ALLOW_THREADS
    }
    Py_buffer *bufs[] = {&x, &div, &out};
    return finish(bufs, 3, ok, "quant: inconsistent shapes or row range");
}

/* open1b_kernels.int8.quantize.rotate_quantize_cols_cpu's steps from the rotation's column
 * extremes, the torch code's operations: step = fp32(|max(cmax, -cmin)| * INV_127) (the
 * maximum NaN-sticky; a zero's sign is lost to the abs), div = step, or 1 where step == 0
 * (safe_step); returns whether a step is subnormal (0 < step < FLT_MIN: the codes then
 * clamp). Work of a few thousand floats: no pieces. */
static PyObject *py_rot_steps(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer cmax, cmin, step, div;
    float inv127;
    if (!PyArg_ParseTuple(args, "y*y*w*w*f", &cmax, &cmin, &step, &div, &inv127)) return NULL;
    Py_ssize_t n = cmax.len / 4;
    int ok = cmax.len % 4 == 0 && cmin.len == cmax.len && step.len == cmax.len &&
             div.len == cmax.len;
    int sub = 0;
    if (ok) {
        const float *hi = cmax.buf, *lo = cmin.buf;
        float *st = step.buf, *dv = div.buf;
        for (Py_ssize_t j = 0; j < n; j++) {
            float a = hi[j], b = -lo[j];
            float m = (a != a || b != b) ? NAN : (b > a ? b : a);
            float s = fabsf(m) * inv127;
            st[j] = s;
            dv[j] = s == 0.0f ? 1.0f : s;
            sub |= s > 0.0f && s < FLT_MIN;
        }
    }
    Py_buffer *bufs[] = {&cmax, &cmin, &step, &div};
    PyObject *r = finish(bufs, 4, ok, "rot_steps: inconsistent sizes");
    if (r == NULL) return NULL;
    Py_DECREF(r);
    return PyBool_FromLong(sub);
}

static PyObject *py_codes(PyObject *self, PyObject *args) {
    (void)self;
    int pieces = 1;
    Py_buffer y, div, out;
    int clamp, transposed;
    Py_ssize_t R, C, r0, r1;
    if (!PyArg_ParseTuple(args, "y*y*pw*pnnnn|i", &y, &div, &clamp, &out, &transposed, &R, &C,
                          &r0, &r1, &pieces))
        return NULL;
    int ok = R >= 0 && C >= 0 && 0 <= r0 && r0 <= r1 && r1 <= R && y.len == R * C * 4 &&
             div.len == C * 4 && out.len == R * C;
    ok = ok && PIECES_OK(pieces);
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        FOR_PIECES(r0, r1, pieces, codes_loop(y.buf, div.buf, clamp, out.buf, transposed, R, C,
                                              p_lo, p_hi));
        Py_END_ALLOW_THREADS
    }
    Py_buffer *bufs[] = {&y, &div, &out};
    return finish(bufs, 3, ok, "codes: inconsistent shapes or row range");
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
    Py_buffer *bufs[] = {&src, &dst};
    return finish(bufs, 2, ok, "bf16_rne: need float32 src and bf16 dst of one length");
}

/* open1b_train.model.add_bf16 on elements [lo, hi): bf16((fp32(a) + fp32(b)) [+ fp32(c)]),
 * the exact widenings, the IEEE float32 adds in order and one rounding (bf16_rne1: torch's
 * conversion). c may be NULL (two operands). */
CLONES static void add_bf16_loop(const uint16_t *a, const uint16_t *b, const uint16_t *c,
                                 uint16_t *out, Py_ssize_t lo, Py_ssize_t hi) {
    if (c)
        for (Py_ssize_t i = lo; i < hi; i++)
            out[i] = bf16_rne1((widen_bf16(a[i]) + widen_bf16(b[i])) + widen_bf16(c[i]));
    else
        for (Py_ssize_t i = lo; i < hi; i++)
            out[i] = bf16_rne1(widen_bf16(a[i]) + widen_bf16(b[i]));
}

static PyObject *py_add_bf16(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer a, b, c, out;
    Py_ssize_t lo, hi;
    int pieces = 1;
    if (!PyArg_ParseTuple(args, "y*y*y*w*nn|i", &a, &b, &c, &out, &lo, &hi, &pieces))
        return NULL;
    Py_ssize_t n = a.len / 2;
    int ok = a.len % 2 == 0 && b.len == a.len && (c.len == 0 || c.len == a.len) &&
             out.len == a.len && 0 <= lo && lo <= hi && hi <= n;
    ok = ok && PIECES_OK(pieces);
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        FOR_PIECES(lo, hi, pieces, add_bf16_loop(a.buf, b.buf, c.len ? c.buf : NULL, out.buf,
                                                 p_lo, p_hi));
        Py_END_ALLOW_THREADS
    }
    Py_buffer *bufs[] = {&a, &b, &c, &out};
    return finish(bufs, 4, ok, "add_bf16: need bf16 operands and output of one length");
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
    Py_buffer *bufs[] = {&g, &x, &div, &dx, &term};
    return finish(bufs, 5, ok, "ste: inconsistent shapes or row range");
}

/* open1b_kernels.ops.adamw's CPU update (adamw_step_cpu_) on elements [lo, hi), in place: the
 * torch code's float32 operations in its order, each rounded once (no contraction) -
 * m = m * b1 + g * c1, v = v * b2 + (g * g) * c2, u = (m * a) / (sqrt_rn(v) * r2 + eps)
 * with sqrt_rn(v) = float(sqrt(double(v))) (correctly rounded, as open1b_kernels.core.rounding's),
 * p = p * decay - u, stored as bf16 (bf16_rne1: torch's conversion) or float32. k holds
 * (a, r2, decay, b1, b2, c1, c2, eps). NaN payloads are outside the contract: the trainer
 * refuses a non-finite gradient before its update. */
CLONES static void adamw_loop(void *param, int p_bf16, const float *g, float *m, float *v,
                              const float *k, Py_ssize_t lo, Py_ssize_t hi) {
    const float a = k[0], r2 = k[1], decay = k[2], b1 = k[3], b2 = k[4], c1 = k[5], c2 = k[6],
                eps = k[7];
    for (Py_ssize_t i = lo; i < hi; i++) {
        float p = p_bf16 ? widen_bf16(((uint16_t *)param)[i]) : ((float *)param)[i];
        float gi = g[i];
        float mi = m[i] * b1 + gi * c1;
        float vi = v[i] * b2 + (gi * gi) * c2;
        float den = (float)sqrt((double)vi) * r2 + eps;
        float u = (mi * a) / den;
        p = p * decay - u;
        m[i] = mi;
        v[i] = vi;
        if (p_bf16)
            ((uint16_t *)param)[i] = bf16_rne1(p);
        else
            ((float *)param)[i] = p;
    }
}

static PyObject *py_adamw(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer param, g, m, v;
    int p_bf16, pieces = 1;
    float k[8];
    Py_ssize_t n, lo, hi;
    if (!PyArg_ParseTuple(args, "w*py*w*w*ffffffffnnn|i", &param, &p_bf16, &g, &m, &v, &k[0],
                          &k[1], &k[2], &k[3], &k[4], &k[5], &k[6], &k[7], &n, &lo, &hi,
                          &pieces))
        return NULL;
    int ok = n >= 0 && 0 <= lo && lo <= hi && hi <= n && param.len == n * (p_bf16 ? 2 : 4) &&
             g.len == n * 4 && m.len == n * 4 && v.len == n * 4;
    ok = ok && PIECES_OK(pieces);
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        FOR_PIECES(lo, hi, pieces, adamw_loop(param.buf, p_bf16, g.buf, m.buf, v.buf, k, p_lo,
                                              p_hi));
        Py_END_ALLOW_THREADS
    }
    Py_buffer *bufs[] = {&param, &g, &m, &v};
    return finish(bufs, 4, ok, "adamw: inconsistent sizes or range");
}

/* open1b_kernels.core.reduce's pairwise tree along the last dim of a contiguous float32 (R, N)
 * matrix, rows [r0, r1) into out (R,): each row zero-padded to P = next_pow2(N) and summed
 * by tree_row - the definition's adds in its order (adjacent pairs, level by level). */
static PyObject *py_tree_rows(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer x, out;
    Py_ssize_t R, N, r0, r1;
    int pieces = 1;
    if (!PyArg_ParseTuple(args, "y*w*nnnn|i", &x, &out, &R, &N, &r0, &r1, &pieces))
        return NULL;
    Py_ssize_t P = pow2_ceil(N);
    int ok = R >= 0 && N >= 1 && N <= (1 << 24) && x.len == R * N * 4 && out.len == R * 4 &&
             0 <= r0 && r0 <= r1 && r1 <= R;
    ok = ok && PIECES_OK(pieces);
    float *scratch = NULL;
    if (ok && !(scratch = malloc(sizeof(float) * 2 * P * pieces))) ok = 0;
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        FOR_PIECES(r0, r1, pieces, {
            float *ta = scratch + 2 * P * piece, *tb = ta + P;
            for (Py_ssize_t r = p_lo; r < p_hi; r++) {
                memcpy(ta, (const float *)x.buf + r * N, sizeof(float) * N);
                ((float *)out.buf)[r] = tree_row(ta, tb, N, P);
            }
        });
        Py_END_ALLOW_THREADS
    }
    free(scratch);
    Py_buffer *bufs[] = {&x, &out};
    return finish(bufs, 2, ok, "tree_rows: inconsistent shapes or row range");
}

/* open1b_kernels.core.reduce's pairwise tree over one float32 vector x (n values), blocked: the
 * sums of the aligned blocks [lo, hi) of B values (a power of two; the last real block and
 * any block past n padded with +0.0, as the definition pads to P = next_pow2(n)) into
 * partials[b] - the tree's first log2(B) levels, the same adds in the same order
 * (tree_row). The caller then sums the P / B partials by the same tree. */
static PyObject *py_tree_blocks(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer x, partials;
    Py_ssize_t n, B, lo, hi;
    int pieces = 1;
    if (!PyArg_ParseTuple(args, "y*w*nnnn|i", &x, &partials, &n, &B, &lo, &hi, &pieces))
        return NULL;
    Py_ssize_t P = pow2_ceil(n);
    int ok = n > 0 && B >= 2 && B <= (1 << 20) && (B & (B - 1)) == 0 && B <= P &&
             x.len == n * 4 && partials.len == (P / B) * 4 && 0 <= lo && lo <= hi &&
             hi <= P / B;
    ok = ok && PIECES_OK(pieces);
    float *scratch = NULL;
    if (ok && !(scratch = malloc(sizeof(float) * 2 * B * pieces))) ok = 0;
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        FOR_PIECES(lo, hi, pieces, {
            float *ta = scratch + 2 * B * piece, *tb = ta + B;
            const float *xs = x.buf;
            for (Py_ssize_t b = p_lo; b < p_hi; b++) {
                Py_ssize_t a0 = b * B, m = a0 >= n ? 0 : (n - a0 < B ? n - a0 : B);
                if (m) memcpy(ta, xs + a0, sizeof(float) * m);
                ((float *)partials.buf)[b] = tree_row(ta, tb, m, B);
            }
        });
        Py_END_ALLOW_THREADS
    }
    free(scratch);
    Py_buffer *bufs[] = {&x, &partials};
    return finish(bufs, 2, ok, "tree_blocks: inconsistent sizes or block range");
}

static PyObject *py_openmp(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    return PyBool_FromLong(PIECES_OPENMP);
}

static PyMethodDef methods[] = {
    {"adamw", py_adamw, METH_VARARGS,
     "adamw(param, p_bf16, g, m, v, a, r2, decay, b1, b2, c1, c2, eps, n, lo, hi): "
     "open1b_kernels.ops.adamw's update, in place."},
    {"tree_blocks", py_tree_blocks, METH_VARARGS,
     "tree_blocks(x, partials, n, B, lo, hi): open1b_kernels.core.reduce's tree over blocks of B."},
    {"openmp", py_openmp, METH_NOARGS,
     "openmp(): whether the loops' pieces run at once on an OpenMP team (built with -fopenmp)."},
    {"philox_words", py_philox_words, METH_VARARGS,
     "philox_words(seed, stream, offset, out, lo, hi): Philox4x32-10 words into int64 out."},
    {"fwht_dim0", py_fwht_dim0, METH_VARARGS,
     "fwht_dim0(buf, R, C, r0, r1, B, c0, c1): Hadamard butterflies along dim 0, in place."},
    {"xent_grad", py_xent_grad, METH_VARARGS,
     "xent_grad(x, t, lse, g, out, R, V, r0, r1): open1b_kernels.ops.xent's backward, float32."},
    {"dequant", py_dequant, METH_VARARGS,
     "dequant(acc, rs, cs, out, out_bf16, rows, cols, R, C, r0, r1): open1b_kernels.int8.gemm's "
     "dequantization, with the guard's row and column sums when rows/cols are non-empty."},
    {"rms_fwd", py_rms_fwd, METH_VARARGS,
     "rms_fwd(x, gain, rd, eps, y, rstd, R, D, r0, r1): open1b_kernels.ops.rmsnorm's forward rows."},
    {"rms_bwd", py_rms_bwd, METH_VARARGS,
     "rms_bwd(dy, dy_bf16, x, gain, rstd, rd, dx, prod, R, D, r0, r1): its backward rows."},
    {"rope", py_rope, METH_VARARGS,
     "rope(x, cos, sin, sign, out, R, T, H, half, r0, r1[, pieces]): open1b_kernels.ops.rope's "
     "CPU rotation of bf16 rows."},
    {"swiglu", py_swiglu, METH_VARARGS,
     "swiglu(h, dy, out, R, F, r0, r1): open1b_kernels.ops.swiglu's rows (backward when dy is "
     "non-empty)."},
    {"xent_lse", py_xent_lse, METH_VARARGS,
     "xent_lse(x, lse, R, V, CH, r0, r1): open1b_kernels.ops.xent's row logsumexp (float32 rows)."},
    {"v4", py_v4, METH_VARARGS,
     "v4([on]): whether the x86-64-v4 copies run; on=0/1 switches them off/back on"},
    {"v3", py_v3, METH_VARARGS,
     "v3([on]): whether the x86-64-v3 copies run (where no x86-64-v4 copy does); on=0/1 "
     "switches them off/back on"},
    {"rotq", py_rotq, METH_VARARGS,
     "rotq(kind, src, rs, P, y, R, C, B, scale, cmax, cmin, tr, tc, c0, c1): open1b_kernels.int8."
     "quantize's fill, rotation, scale and column extremes of columns [c0, c1)."},
    {"widen_t", py_widen_t, METH_VARARGS,
     "widen_t(src, y, P, Q, R, r0, r1): a bf16 (Q, P) source into float32 y (R, Q), "
     "transposed, zero rows from P."},
    {"quant", py_quant, METH_VARARGS,
     "quant(x, x_bf16, div, out, R, C, r0, r1): open1b_kernels.int8.quantize.quantize_cpu's rows."},
    {"tree_rows", py_tree_rows, METH_VARARGS,
     "tree_rows(x, out, R, N, r0, r1): open1b_kernels.core.reduce's tree along each row"},
    {"rot_steps", py_rot_steps, METH_VARARGS,
     "rot_steps(cmax, cmin, step, div, inv127) -> subnormal: the rotation's steps, divisors"},
    {"codes", py_codes, METH_VARARGS,
     "codes(y, div, clamp, out, transposed, R, C, r0, r1): its int8 codes of rows [r0, r1)."},
    {"bf16_rne", py_bf16_rne, METH_VARARGS, "bf16_rne(src, dst): float32 -> bf16 bits (RNE)."},
    {"add_bf16", py_add_bf16, METH_VARARGS,
     "add_bf16(a, b, c, out, lo, hi): bf16((fp32(a) + fp32(b)) [+ fp32(c)]), bf16 bits"},
    {"ste", py_ste, METH_VARARGS,
     "ste(g, x, x_bf16, div, per_row, dx, term, R, C, r0, r1): the quantizer's STE."},
    {"mv_int8", py_mv_int8, METH_VARARGS,
     "mv_int8(a, v, out, R, K, transposed, r0, r1): exact int64 int8 matrix-vector product."},
    {"widen_sq", py_widen_sq, METH_VARARGS,
     "widen_sq(src, y, rows, cols, R, C, r0, r1): int8 -> float32 and exact sums of squares."},
    {"int_sums", py_int_sums, METH_VARARGS,
     "int_sums(src, is_int8, rows, cols, R, C, r0, r1): exact int64 row/column sums."},
    {"levels_round_weighted", py_levels_round, METH_VARARGS,
     "levels_round_weighted(accs, n, w, rowf, colf, out, rows, cols, base, R, C, stride, c0, "
     "r0, r1): open1b_kernels.ops.lmhead's level sum (plus an int64 base part), rounding and "
     "the check's sums of T for one output block."},
    {"float_sum", py_float_sum, METH_VARARGS,
     "float_sum(parts, n, w, t, from_t, rowf, colf, out, to_out, R, C, stride, c0, r0, r1): "
     "open1b_kernels.ops.float_products' weighted sum of float32 products into the float64 T "
     "of one output block, or its rounding into out."},
    {"slice_planes", py_slice_rows, METH_VARARGS,
     "slice_planes(src, is_bf16, R, K, S, by_cols, out, exps, lo, hi[, pieces, layout]): "
     "open1b_kernels.ops.lmhead's slicer (rows lo..hi with one exponent per row, or columns lo..hi "
     "with one per column; layout bit 0: rows interleaved, bit 1: slices reversed)."},
    {"exp", py_exp, METH_VARARGS, "exp(src, dst): mathfn.exp of float32 src into dst."},
    {"log", py_log, METH_VARARGS, "log(src, dst): mathfn.log of float32 src into dst."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_mathc",
                                    "Compiled CPU loops of open1b_kernels.core.mathfn (same bits).", -1,
                                    methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__mathc(void) {
    PyObject *m = PyModule_Create(&module);
#if HAVE_V4
    __builtin_cpu_init();
    v4_ok = __builtin_cpu_supports("x86-64-v4") != 0;
    v3_ok = __builtin_cpu_supports("x86-64-v3") != 0;
#endif
    /* slice_planes takes a layout (open1b_kernels.core.mathc.slice_store checks for this mark, so
       a stale build without it keeps the planes) */
    if (m && PyModule_AddIntConstant(m, "SLICE_LAYOUTS", 1) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
