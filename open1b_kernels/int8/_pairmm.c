/* The exact int8 GEMM at the integer speed of a CPU without an int8 dot-product instruction:
 * C (int32, M x N) = A (int8, M x K) . B (int8, N x K)^T, summed in int32 pairs.
 *
 * Why: on x86-64 CPUs with AVX2 but no VNNI (AMD Zen 1-3, Intel before Ice Lake) the
 * library's integer GEMM (torch._int_mm) is 13-20x slower than float32 GEMMs of the same
 * integers, so the exact int8 GEMM ran as float32 GEMMs. AVX2's vpmaddwd multiplies 16 pairs
 * of int16 and adds each pair into an int32 lane: 16 multiply-adds per instruction, against
 * 8 for a float32 fused multiply-add. Measured on a Zen 3 (one core, 6 x 16 register block
 * in L1): 80 G multiply-adds/s, against a float32 FMA peak of 51.
 *
 * Exact by construction, in any order: int8 products are at most 128 * 128 = 2^14 in
 * magnitude, a pair at most 2^15 (no saturation: vpmaddwd's pair sum saturates only for
 * -32768 * -32768 twice, and widened int8 never reaches -32768), and the int32 lane sums at
 * most K products: below 2^31 while K <= 131,071 (the caller's MAX_K). Integer additions
 * are associative, so the blocking, the cut between threads and the pair grouping give the
 * integer product itself: the same bits as every other route.
 *
 * Layout: the operands are packed once into pair panels - A by 6 rows (each pair of k a
 * 32-bit word holding two int16), B by 16 columns (each pair of k 16 such words) - with
 * zeros past the edges (rows, columns, an odd K), then every 6 x 16 block of C is one
 * register block over a K block of KC pairs (_pairblock.h: inline assembly).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "../core/_pieces.h"

#define MR 6     /* rows per register block (12 accumulators + 2 B + 2 scratch = 16 ymm) */
#define NR 16    /* columns per register block: two ymm of 8 int32 */
/* K blocks of KC pairs, row blocks of MCP panels: C's blocks are stored or added once per K
 * block, and fewer, longer blocks measured faster than ones sized for L1 / L2 (the register
 * block streams B's panel at ~11 bytes a cycle, within L2's bandwidth): on the Zen 3 at
 * 4,096 x 2,048 x 5,632, 256 pairs x 16 panels 112, 1,024 x 32 153 G multiply-adds/s on
 * two cores (the two-core peak of the register block is ~160) */
#define KC 1024
#define MCP 32

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define PAIRMM_X86 1
#else
#define PAIRMM_X86 0
#endif

static int cpu_ok(void) {
#if PAIRMM_X86
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2");
#else
    return 0;
#endif
}

static inline uint32_t pair(int8_t lo, int8_t hi) {
    return (uint32_t)(uint16_t)(int16_t)lo | ((uint32_t)(uint16_t)(int16_t)hi << 16);
}

/* Panels [p0, p1) of `width` lines (rows of A or columns of B) of x (int8, `lines` x K,
 * element (l, k) at x[l * sl + k * sk]) as pair words: out[(panel * P + q) * width + i] =
 * pair(x[l, 2q], x[l, 2q + 1]), zero past the lines and past K. */
static void pack(const int8_t *x, Py_ssize_t sl, Py_ssize_t sk, Py_ssize_t lines, Py_ssize_t K,
                 int width, uint32_t *out, Py_ssize_t p0, Py_ssize_t p1) {
    Py_ssize_t P = (K + 1) / 2;
    if (sl == 1) {
        /* a transposed view: each k's lines are adjacent. Pairs in groups of 32, panel by
         * panel: the group's 64 k rows stay in L1 while each panel receives 32 pairs' words
         * in a row (panels are P pairs apart: a page or more) */
        for (Py_ssize_t q0 = 0; q0 < P; q0 += 32) {
            Py_ssize_t q1 = q0 + 32 < P ? q0 + 32 : P;
            for (Py_ssize_t panel = p0; panel < p1; panel++) {
                Py_ssize_t l0 = panel * width;
                int have = lines - l0 < width ? (int)(lines - l0) : width;
                for (Py_ssize_t q = q0; q < q1; q++) {
                    const int8_t *r0 = x + 2 * q * sk + l0, *r1 = r0 + sk;
                    uint32_t *oq = out + (panel * P + q) * width;
                    if (2 * q + 1 < K)
                        for (int i = 0; i < have; i++) oq[i] = pair(r0[i], r1[i]);
                    else
                        for (int i = 0; i < have; i++) oq[i] = pair(r0[i], 0);
                    for (int i = have; i < width; i++) oq[i] = 0;
                }
            }
        }
        return;
    }
    for (Py_ssize_t panel = p0; panel < p1; panel++) {
        uint32_t *o = out + panel * P * width;
        Py_ssize_t l0 = panel * width;
        int have = lines - l0 < width ? (int)(lines - l0) : width;
        for (int i = 0; i < width; i++) {
            if (i >= have) {
                for (Py_ssize_t q = 0; q < P; q++) o[q * width + i] = 0;
                continue;
            }
            const int8_t *r = x + (l0 + i) * sl;
            for (Py_ssize_t q = 0; q < K / 2; q++)
                o[q * width + i] = pair(r[2 * q * sk], r[(2 * q + 1) * sk]);
            if (K & 1) o[(P - 1) * width + i] = pair(r[(K - 1) * sk], 0);
        }
    }
}

#if PAIRMM_X86
#include "_pairblock.h"

/* C's row panels [r0, r1) (6 rows each): every 6 x 16 block summed over K blocks of KC
 * pairs, the first one stored, the others added (integer sums: any order is exact). */
static void product(const uint32_t *ap, const uint32_t *bp, int32_t *c, Py_ssize_t M,
                    Py_ssize_t N, Py_ssize_t P, Py_ssize_t r0, Py_ssize_t r1) {
    int32_t tile[MR * NR];
    Py_ssize_t col_panels = (N + NR - 1) / NR;
    for (Py_ssize_t ic = r0; ic < r1; ic += MCP) {
        Py_ssize_t ic_end = ic + MCP < r1 ? ic + MCP : r1;
        for (Py_ssize_t pc = 0; pc < P; pc += KC) {
            Py_ssize_t kc = P - pc < KC ? P - pc : KC;
            for (Py_ssize_t jr = 0; jr < col_panels; jr++) {
                const uint32_t *bpanel = bp + (jr * P + pc) * NR;
                Py_ssize_t j0 = jr * NR, cols = N - j0 < NR ? N - j0 : NR;
                for (Py_ssize_t ir = ic; ir < ic_end; ir++) {
                    pair_block(ap + (ir * P + pc) * MR, bpanel, (long)kc, tile);
                    Py_ssize_t i0 = ir * MR, rows = M - i0 < MR ? M - i0 : MR;
                    for (Py_ssize_t i = 0; i < rows; i++) {
                        int32_t *dst = c + (i0 + i) * N + j0;
                        const int32_t *src = tile + i * NR;
                        if (pc == 0)
                            for (Py_ssize_t j = 0; j < cols; j++) dst[j] = src[j];
                        else
                            for (Py_ssize_t j = 0; j < cols; j++) dst[j] += src[j];
                    }
                }
            }
        }
    }
}
#endif

/* Python wrappers: buffers checked against the shapes before any access. */

static int sized(Py_buffer *b, Py_ssize_t need, const char *name) {
    if (b->len >= need) return 1;
    PyErr_Format(PyExc_ValueError, "%s: buffer of %zd bytes, needs %zd", name, b->len, need);
    return 0;
}

static int range_ok(Py_ssize_t u0, Py_ssize_t u1, Py_ssize_t n) {
    if (0 <= u0 && u0 <= u1 && u1 <= n) return 1;
    PyErr_Format(PyExc_ValueError, "panel range [%zd, %zd) outside [0, %zd)", u0, u1, n);
    return 0;
}

static PyObject *py_pack(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer x, out;
    Py_ssize_t sl, sk, lines, K, u0, u1;
    int width, pieces = 1;
    if (!PyArg_ParseTuple(args, "y*w*nnnninn|i", &x, &out, &sl, &sk, &lines, &K, &width, &u0,
                          &u1, &pieces))
        return NULL;
    Py_ssize_t panels = (lines + width - 1) / width, P = (K + 1) / 2;
    /* the last element read: line lines - 1 at k = K - 1 (strides are non-negative) */
    Py_ssize_t last = lines && K ? (lines - 1) * sl + (K - 1) * sk + 1 : 0;
    int ok = (width == MR || width == NR) && sl >= 0 && sk >= 1 && lines >= 0 && K >= 1 &&
             PIECES_OK(pieces) && sized(&x, last, "x") &&
             sized(&out, panels * P * width * 4, "out") && range_ok(u0, u1, panels);
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        FOR_PIECES(u0, u1, pieces, pack(x.buf, sl, sk, lines, K, width, out.buf, p_lo, p_hi));
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&x);
    PyBuffer_Release(&out);
    if (!ok && !PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "pack: bad arguments");
    return ok ? Py_NewRef(Py_None) : NULL;
}

static PyObject *py_product(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer ap, bp, c;
    Py_ssize_t M, N, K, u0, u1;
    int pieces = 1;
    if (!PyArg_ParseTuple(args, "y*y*w*nnnnn|i", &ap, &bp, &c, &M, &N, &K, &u0, &u1, &pieces))
        return NULL;
    Py_ssize_t P = (K + 1) / 2, rp = (M + MR - 1) / MR, cp = (N + NR - 1) / NR;
    int ok = cpu_ok() && M >= 0 && N >= 0 && K >= 1 && K <= 131071 && PIECES_OK(pieces) &&
             sized(&ap, rp * P * MR * 4, "ap") && sized(&bp, cp * P * NR * 4, "bp") &&
             sized(&c, M * N * 4, "c") && range_ok(u0, u1, rp);
#if PAIRMM_X86
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        FOR_PIECES(u0, u1, pieces, product(ap.buf, bp.buf, c.buf, M, N, P, p_lo, p_hi));
        Py_END_ALLOW_THREADS
    }
#endif
    PyBuffer_Release(&ap);
    PyBuffer_Release(&bp);
    PyBuffer_Release(&c);
    if (!ok && !PyErr_Occurred())
        PyErr_SetString(PyExc_ValueError, "product: needs x86-64 with AVX2, 1 <= K <= 131071");
    return ok ? Py_NewRef(Py_None) : NULL;
}

static PyObject *py_available(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    return PyBool_FromLong(cpu_ok());
}

static PyMethodDef methods[] = {
    {"available", py_available, METH_NOARGS,
     "available(): whether this CPU runs the pair product (x86-64 with AVX2)."},
    {"pack", py_pack, METH_VARARGS,
     "pack(x, out, sl, sk, lines, K, width, u0, u1[, pieces]): panels [u0, u1) of `width` "
     "(6: A's rows, 16: B's columns) lines of int8 x as int16 pair words."},
    {"product", py_product, METH_VARARGS,
     "product(ap, bp, c, M, N, K, u0, u1[, pieces]): C's row panels [u0, u1) of the exact "
     "int32 product of the packed A and B."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_pairmm",
                                    "The exact int8 GEMM in int16 pairs (AVX2 vpmaddwd).", -1,
                                    methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__pairmm(void) { return PyModule_Create(&module); }
