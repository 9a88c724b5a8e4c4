/* open1b_kernels.int8.quantize's CPU passes, compiled: the rotate-then-quantize of a column
 * block (rotq: fill, butterflies, scale, column extremes; widen_t: a transposed bf16
 * source), the rotation's steps (rot_steps) and codes (codes), the same in one pass per
 * strip of columns (rotq_codes; the rows' pass is _rotrows.c) and the per-row quantizer
 * (quant); its straight-through estimator is _ste.c's. Float work is the torch code's IEEE
 * float32 operations in its order (-ffp-contract=off); the rest are maxima, integer and bit
 * operations - the same bits, in any cut of the rows or columns. */
#include "../core/_ext.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../core/_mathfn.h"
#include "_hadamard.h"
#include "_rotq.h"

/* open1b_kernels.int8.quantize.rotate_quantize_cols_cpu: rotate the columns [c0, c1) of the
 * float32 (R, C) buffer y (R a multiple of B) after filling it from a source, in L2-sized
 * tiles (tr rows x tc columns, whole B-row blocks); per tile: fill, the butterfly stages
 * (hadamard_stages: the same operations as hadamard_dim0_cpu_), the exact power-of-two
 * scale, and the running column maximum and minimum (NaN-sticky, as torch's amax/amin and
 * maximum/minimum). Sources, rows >= P zero:
 *   kind 0 - bf16 (P, C) row-major: y[i, j] = s[i, j]
 *   kind 1 - y already holds the data (widen_t wrote a transposed bf16 source into it)
 *   kind 2 - int8 (P, C): y[i, j] = (float)s[i, j]
 *   kind 3 - int8 (P, C) times a row scale: y[i, j] = (float)s[i, j] * rs[i] (one rounding). */
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
 * vectors did not cover (the caller runs rotq_fill, hadamard_stages and rotq_finish on the
 * rest). */
typedef int8_t v16i8 __attribute__((vector_size(16)));


/* One vector of columns [c, c + W) of row i (rotq_fill's conversion per element), for
 * W = 16 (rotq_load16) and W = 8 (rotq_load8). */
#define ROTQ_LOAD(NAME, VF, VI, VU16, VI8)                                                    \
    static inline __attribute__((always_inline)) void NAME(int kind, const void *src,         \
                                                           const float *rs, Py_ssize_t P,     \
                                                           const float *y, Py_ssize_t C,      \
                                                           Py_ssize_t ys, Py_ssize_t yo,      \
                                                           Py_ssize_t i, Py_ssize_t c,        \
                                                           VF *out) {                         \
        VF f;                                                                                 \
        if (kind == 1) {                                                                      \
            memcpy(&f, y + i * ys + c - yo, sizeof f);                                        \
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
/* Pass 1 below reads a source row's W columns every C elements, a page or more apart at the
 * step's widths - no stride the hardware prefetchers follow -, so it asks for the next 16
 * rows' lines while the butterflies run on these: measured on the AMX Xeon VM (2 threads,
 * 4,096 rows) q_x's rotation 19.1-19.7 -> 14.6-15.0 ms at 5,632 columns, 6.3 -> 5.0 ms at
 * 2,048, the gradient's at 11,264 25.5-26.0 -> 23.5-24.1 ms (16 rows ahead; 32 the same). */
#define ROTQ_TILE(NAME, KIND, ATTR, VEXT, W)                                                  \
    ATTR static Py_ssize_t NAME(const void *src, const float *rs, Py_ssize_t P, float *y,     \
                                  Py_ssize_t C, Py_ssize_t ys, Py_ssize_t yo, Py_ssize_t r0,  \
                                  Py_ssize_t r1, Py_ssize_t c0, Py_ssize_t c1, float scale,   \
                                  float *cmax, float *cmin) {                                 \
        Py_ssize_t cv = c0 + (c1 - c0) / W * W;                                               \
        for (Py_ssize_t base = r0; base < r1; base += 256) {                                  \
            for (Py_ssize_t q = 0; q < 256; q += 16)                                          \
                for (Py_ssize_t c = c0; c < cv; c += W) {                                     \
                    VEC(W) v[16];                                                             \
                    for (int t = 0; t < 16; t++)                                              \
                        LOAD(W)(KIND, src, rs, P, y, C, ys, yo, base + q + t, c, &v[t]);      \
                    if (KIND != 1 && base + q + 32 <= P)    /* the next 16 rows' lines */     \
                        for (int t = 16; t < 32; t++)                                         \
                            __builtin_prefetch((const char *)src + ((base + q + t) * C + c)   \
                                               * (KIND == 0 ? 2 : 1), 0, 3);                  \
                    STAGES(W)(v);                                                             \
                    for (int t = 0; t < 16; t++)                                              \
                        memcpy(y + (base + q + t) * ys + c - yo, &v[t], 4 * W);               \
                }                                                                             \
            for (Py_ssize_t j = 0; j < 16; j++)                                               \
                for (Py_ssize_t c = c0; c < cv; c += W) {                                     \
                    VEC(W) v[16];                                                             \
                    for (int t = 0; t < 16; t++)                                              \
                        memcpy(&v[t], y + (base + j + 16 * t) * ys + c - yo, 4 * W);          \
                    STAGES(W)(v);                                                             \
                    for (int t = 0; t < 16; t++) {                                            \
                        v[t] = v[t] * scale;                                                  \
                        memcpy(y + (base + j + 16 * t) * ys + c - yo, &v[t], 4 * W);          \
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
                        const float *yr = y + (base + j + 16 * t) * ys + c - yo;              \
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
                                   Py_ssize_t, Py_ssize_t, float, float *, float *);
static const rotq_tile_fn rotq_tiles[][4] = {
    {rotq_tile_k0, rotq_tile_k1, rotq_tile_k2, rotq_tile_k3},
#if HAVE_V4
    {rotq_tile_v4_k0, rotq_tile_v4_k1, rotq_tile_v4_k2, rotq_tile_v4_k3},
    {rotq_tile_v3_k0, rotq_tile_v3_k1, rotq_tile_v3_k2, rotq_tile_v3_k3},
#endif
};

/* Whether the plain x86-64-v4 copies run, and the x86-64-v3 ones where those do not: from the
 * CPU on first use (-1: not yet), switched off and on by v4()/v3() for the tests. */
static int v4_ok = -1, v3_ok = -1;

static void copies_init(void) {
    if (v4_ok >= 0) return;
    int level = cpu_level();
    v4_ok = level >= 2;
    v3_ok = level >= 1;
}

/* y: element (i, c) at y[i * ys + c - yo] - the whole (R, C) buffer (ys = C, yo = 0) or one
 * strip's (rotq_codes: ys its width, yo its first column). */
int open1b_rotq_level(void) {
#if HAVE_V4
    copies_init();
    return v4_ok ? 1 : v3_ok ? 2 : 0;
#else
    return 0;
#endif
}

static Py_ssize_t rotq_tile256(int kind, const void *src, const float *rs, Py_ssize_t P,
                               float *y, Py_ssize_t C, Py_ssize_t ys, Py_ssize_t yo,
                               Py_ssize_t r0, Py_ssize_t r1, Py_ssize_t c0, Py_ssize_t c1,
                               float scale, float *cmax, float *cmin) {
    return rotq_tiles[open1b_rotq_level()][kind](src, rs, P, y, C, ys, yo, r0, r1, c0, c1, scale, cmax,
                                   cmin);
}

/* v4([on]) and v3([on]): whether the plain x86-64-v4 copies run, and the x86-64-v3 ones
 * where those do not (False where the CPU or the build has none); with an argument, switch
 * them off (0) or back on where available (1), so that a test on an AVX-512 machine also
 * runs the copies every other CPU takes. */
static PyObject *copy_switch(PyObject *args, int *flag, int need) {
    int on = -1;
    if (!PyArg_ParseTuple(args, "|i", &on)) return NULL;
    copies_init();
    if (on >= 0) *flag = on && cpu_level() >= need;
    return PyBool_FromLong(*flag > 0);
}

static PyObject *py_v4(PyObject *self, PyObject *args) {
    (void)self;
    return copy_switch(args, &v4_ok, 2);
}
static PyObject *py_v3(PyObject *self, PyObject *args) {
    (void)self;
    return copy_switch(args, &v3_ok, 1);
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
                                      C, 0, i0, i1, j0, j1, scale, cmax.buf, cmin.buf);
                if (jt < j1) {
                    rotq_fill(kind, src.buf, kind == 3 ? rs.buf : NULL, P, y.buf, C, i0, i1,
                              jt, j1);
                    hadamard_stages(y.buf, C, i0, i1, B, jt, j1);
                    rotq_finish(y.buf, C, i0, i1, jt, j1, scale, cmax.buf, cmin.buf);
                }
            }
        }
        });
        Py_END_ALLOW_THREADS
    }
    return FINISH(ok, "rotq: inconsistent shapes, kind or column range", &src, &rs, &y, &cmax, &cmin);
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
    return FINISH(ok, "widen_t: inconsistent shapes or row range", &src, &y);
}

/* A 16 x 16 block of bytes transposed: dst[j * ds + i] = src[i * ss + j]. Four rounds of
 * interleaving row i with row i + 8 (bytes, then pairs, quads, eights: each round doubles
 * the runs that are already in place) - 64 byte shuffles where the scalar copy moved 256
 * bytes one at a time with a 64-byte stride. Only moves bytes. */
typedef uint8_t v16u8 __attribute__((vector_size(16)));
static inline __attribute__((always_inline)) void transpose16(const int8_t *src, Py_ssize_t ss,
                                                              int8_t *dst, Py_ssize_t ds) {
    const v16u8 lo = {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23};
    const v16u8 hi = {8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
    v16u8 r[16], t[16];
    for (int i = 0; i < 16; i++) memcpy(&r[i], src + i * ss, 16);
    for (int round = 0; round < 4; round++) {
        for (int i = 0; i < 8; i++) {
            t[2 * i] = __builtin_shuffle(r[i], r[i + 8], lo);
            t[2 * i + 1] = __builtin_shuffle(r[i], r[i + 8], hi);
        }
        memcpy(r, t, sizeof r);
    }
    for (int j = 0; j < 16; j++) memcpy(dst + j * ds, &r[j], 16);
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
                out[i * C + j] = clamp ? code_of(v) : (int8_t)(int32_t)rintf(v);
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
                    blk[(i - ib) * 64 + (j - jb)] = clamp ? code_of(v) : (int8_t)(int32_t)rintf(v);
                }
            if (ie - ib == 64 && je - jb == 64) {
                for (int bi = 0; bi < 64; bi += 16)
                    for (int bj = 0; bj < 64; bj += 16)
                        transpose16(blk + bi * 64 + bj, 64, out + (jb + bj) * R + ib + bi, R);
                continue;
            }
            for (Py_ssize_t j = jb; j < je; j++)
                for (Py_ssize_t i = ib; i < ie; i++) out[j * R + i] = blk[(i - ib) * 64 + (j - jb)];
        }
}

/* The codes of one strip (rotq_codes_strips): y (R, S), div (S), into out's columns
 * [j0, j0 + S) - or its rows, transposed - 16 rows at a time. */
CLONES static void strip_codes(const float *restrict y, const float *restrict div,
                               Py_ssize_t S, Py_ssize_t R, Py_ssize_t C, Py_ssize_t j0,
                               int transposed, int8_t *restrict out) {
    int8_t blk[16 * 64];
    for (Py_ssize_t i0 = 0; i0 < R; i0 += 16) {
        for (Py_ssize_t t = 0; t < 16; t++) {
            const float *yr = y + (i0 + t) * S;
            int8_t *restrict o = transposed ? blk + t * S : out + (i0 + t) * C + j0;
            for (Py_ssize_t l = 0; l < S; l++) o[l] = code_of(yr[l] / div[l]);
        }
        if (transposed)
            for (Py_ssize_t bj = 0; bj < S; bj += 16)
                transpose16(blk + bj, S, out + (j0 + bj) * R + i0, R);
    }
}

/* open1b_kernels.int8.quantize.rotate_quantize_cols_cpu in one pass per strip of S columns,
 * for the strips [s0, s1): the strip's B = 256 row blocks through rotq's tile (fill, stages,
 * scale, extremes) into y, this piece's (R, S) strip buffer - L2-sized - instead of the
 * whole float32 (R, C) buffer; then the strip's steps (rot_step, as rot_steps) and its codes
 * (code_of: clamped always - codes_loop skips the clamp only where no step is subnormal,
 * where it changes nothing) into out (R, C), or (C, R) when `transposed`, through 16 x 16
 * byte transposes. Per column the same operations on the same operands as rotq, rot_steps
 * and codes, so the same bits; the float32 values never reach memory. R a multiple of 256,
 * S of 16 and at most 64, C of S; cmax, cmin: C floats of the piece's own. */
static void rotq_codes_strips(int kind, const void *src, const float *rs, Py_ssize_t P,
                              Py_ssize_t R, Py_ssize_t C, Py_ssize_t S, float scale,
                              float inv127, int transposed, int8_t *out, float *step,
                              float *y, float *cmax, float *cmin, Py_ssize_t s0,
                              Py_ssize_t s1) {
    float div[64];
    for (Py_ssize_t j0 = s0 * S; j0 < s1 * S; j0 += S) {
        for (Py_ssize_t l = 0; l < S; l++) {
            cmax[j0 + l] = -INFINITY;
            cmin[j0 + l] = INFINITY;
        }
        rotq_tile256(kind, src, rs, P, y, C, S, j0, 0, R, j0, j0 + S, scale, cmax, cmin);
        for (Py_ssize_t l = 0; l < S; l++) {
            float st = rot_step(cmax[j0 + l], cmin[j0 + l], inv127);
            step[j0 + l] = st;
            div[l] = st == 0.0f ? 1.0f : st;
        }
        strip_codes(y, div, S, R, C, j0, transposed, out);
    }
}

static PyObject *py_rotq_codes(PyObject *self, PyObject *args) {
    (void)self;
    int pieces = 1;
    Py_buffer src, rs, out, step;
    int kind, transposed;
    Py_ssize_t P, R, C, S, s0, s1;
    float scale, inv127;
    if (!PyArg_ParseTuple(args, "iy*y*nnnnffpw*w*nn|i", &kind, &src, &rs, &P, &R, &C, &S,
                          &scale, &inv127, &transposed, &out, &step, &s0, &s1, &pieces))
        return NULL;
    Py_ssize_t esize = kind == 0 ? 2 : 1;
    int ok = (kind == 0 || kind == 2 || kind == 3) && R > 0 && R % 256 == 0 && 0 <= P &&
             P <= R && S >= 16 && S <= 64 && S % 16 == 0 && C > 0 && C % S == 0 &&
             0 <= s0 && s0 <= s1 && s1 <= C / S && src.len == P * C * esize &&
             (kind != 3 || rs.len == P * 4) && out.len == R * C && step.len == C * 4;
    ok = ok && PIECES_OK(pieces);
    int nomem = 0;
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        FOR_PIECES(s0, s1, pieces, {
            /* this piece's strip buffer and column extremes */
            float *y = aligned_alloc(64, (size_t)(R * S + 2 * C) * sizeof(float));
            if (y == NULL) nomem = 1;
            else rotq_codes_strips(kind, src.buf, kind == 3 ? rs.buf : NULL, P, R, C, S,
                                   scale, inv127, transposed, out.buf, step.buf, y,
                                   y + R * S, y + R * S + C, p_lo, p_hi);
            free(y);
        });
        Py_END_ALLOW_THREADS
    }
    if (ok && nomem) {
        PyBuffer_Release(&src);
        PyBuffer_Release(&rs);
        PyBuffer_Release(&out);
        PyBuffer_Release(&step);
        return PyErr_NoMemory();
    }
    return FINISH(ok, "rotq_codes: inconsistent shapes, kind or strip range", &src, &rs, &out,
                  &step);
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
            for (Py_ssize_t c = 0; c < C; c++) o[c] = code_of(widen_bf16(xr[c]) / d);
        } else {
            const float *xr = (const float *)x + r * C;
            for (Py_ssize_t c = 0; c < C; c++) o[c] = code_of(xr[c] / d);
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
    return FINISH(ok, "quant: inconsistent shapes or row range", &x, &div, &out);
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
            float s = rot_step(hi[j], lo[j], inv127);
            st[j] = s;
            dv[j] = s == 0.0f ? 1.0f : s;
            sub |= s > 0.0f && s < FLT_MIN;
        }
    }
    PyObject *r = FINISH(ok, "rot_steps: inconsistent sizes", &cmax, &cmin, &step, &div);
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
    return FINISH(ok, "codes: inconsistent shapes or row range", &y, &div, &out);
}

EXT_METHODS(quantize) = {
    {"v4", py_v4, METH_VARARGS,
     "v4([on]): whether the x86-64-v4 copies run; on=0/1 switches them off/back on"},
    {"v3", py_v3, METH_VARARGS,
     "v3([on]): whether the x86-64-v3 copies run (where no x86-64-v4 copy does); on=0/1 "
     "switches them off/back on"},
    {"rotq", py_rotq, METH_VARARGS,
     "rotq(kind, src, rs, P, y, R, C, B, scale, cmax, cmin, tr, tc, c0, c1[, pieces]): "
     "open1b_kernels.int8.quantize's fill, rotation, scale and column extremes of columns "
     "[c0, c1)."},
    {"rotq_codes", py_rotq_codes, METH_VARARGS,
     "rotq_codes(kind, src, rs, P, R, C, S, scale, inv127, transposed, out, step, s0, s1"
     "[, pieces]): open1b_kernels.int8.quantize.rotate_quantize_cols_cpu's codes and steps of "
     "the strips [s0, s1) of S columns, each in one pass."},
    {"widen_t", py_widen_t, METH_VARARGS,
     "widen_t(src, y, P, Q, R, r0, r1[, pieces]): a bf16 (Q, P) source into float32 y (R, Q), "
     "transposed, zero rows from P."},
    {"quant", py_quant, METH_VARARGS,
     "quant(x, x_bf16, div, out, R, C, r0, r1[, pieces]): open1b_kernels.int8.quantize."
     "quantize_cpu's rows."},
    {"rot_steps", py_rot_steps, METH_VARARGS,
     "rot_steps(cmax, cmin, step, div, inv127) -> subnormal: the rotation's steps, divisors"},
    {"codes", py_codes, METH_VARARGS,
     "codes(y, div, clamp, out, transposed, R, C, r0, r1[, pieces]): its int8 codes of rows "
     "[r0, r1)."},
    {NULL, NULL, 0, NULL},
};
