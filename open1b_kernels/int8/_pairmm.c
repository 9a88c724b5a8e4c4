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
 *
 * For the LM head the same block runs product64 (below): wide A operands (two int8 slices
 * of one element as one int16), several products summed into one int64 C, and optionally
 * C rounded to float32 as it is finished (round_rows' operations).
 */
#include "../core/_ext.h"

#include <string.h>

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

/* One element of a packed operand: x[o], or for a wide operand (gap > 0) the int16
 * 128 x[o] + x[o + gap] - two int8 slices of one element as one 14-bit number (see
 * product64). A wide operand's values must lie in [-127, 127] (every slice does); a -128
 * is counted into *bad and packed as it is, and the caller refuses the operand. */
static inline __attribute__((always_inline)) int16_t value(const int8_t *p, Py_ssize_t gap,
                                                           const int wide, int *bad) {
    if (!wide) return p[0];
    *bad |= (p[0] == -128) | (p[gap] == -128);
    return (int16_t)(p[0] * 128 + p[gap]);
}

static inline uint32_t pair(int16_t lo, int16_t hi) {
    return (uint32_t)(uint16_t)lo | ((uint32_t)(uint16_t)hi << 16);
}

/* Panels [p0, p1) of `width` lines (rows of A or columns of B) of x (int8, `lines` x K,
 * element (l, k) at x[l * sl + k * sk]; wide: its value() with the second slice `gap`
 * bytes on) as pair words: out[(panel * P + q) * width + i] = pair(x[l, 2q], x[l, 2q + 1]),
 * zero past the lines and past K. Returns nonzero where a wide operand held a -128. */
static inline __attribute__((always_inline)) int
pack_impl(const int8_t *x, Py_ssize_t sl, Py_ssize_t sk, Py_ssize_t lines, Py_ssize_t K,
          int width, uint32_t *out, Py_ssize_t p0, Py_ssize_t p1, Py_ssize_t gap,
          const int wide) {
    Py_ssize_t P = (K + 1) / 2;
    int bad = 0;
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
                        for (int i = 0; i < have; i++)
                            oq[i] = pair(value(r0 + i, gap, wide, &bad),
                                         value(r1 + i, gap, wide, &bad));
                    else
                        for (int i = 0; i < have; i++) oq[i] = pair(value(r0 + i, gap, wide, &bad), 0);
                    for (int i = have; i < width; i++) oq[i] = 0;
                }
            }
        }
        return bad;
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
                o[q * width + i] = pair(value(r + 2 * q * sk, gap, wide, &bad),
                                        value(r + (2 * q + 1) * sk, gap, wide, &bad));
            if (K & 1) o[(P - 1) * width + i] = pair(value(r + (K - 1) * sk, gap, wide, &bad), 0);
        }
    }
    return bad;
}

static int pack(const int8_t *x, Py_ssize_t sl, Py_ssize_t sk, Py_ssize_t lines, Py_ssize_t K,
                int width, uint32_t *out, Py_ssize_t p0, Py_ssize_t p1, Py_ssize_t gap) {
    if (gap) return pack_impl(x, sl, sk, lines, K, width, out, p0, p1, gap, 1);
    return pack_impl(x, sl, sk, lines, K, width, out, p0, p1, 0, 0);
}

typedef struct {
    const uint32_t *a, *b;
    int wide, shift;
} term_t;

#define MAX_TERMS 8

/* product64's fused rounding (round_rows' operations on the finished T, which is then not
 * stored): out, its row stride and first column, the row and column scales, T's row sums
 * (R) and this piece's column sums (N). */
typedef struct {
    const double *rowf, *colf;
    float *out;
    Py_ssize_t stride, c0;
    uint64_t *rows, *cols;
} fused_t;

/* One row's span of the LM head's rounding: out[c] = fp32((T[c] * rf) * colf[c]) - the
 * operations of the other routes' rounding loops on the same exact float64 value (T below
 * 2^53), so their bits - T's values added into cols (modulo 2^64), their sum returned. */
static uint64_t round_span(const int64_t *t, double rf, const double *colf, float *out,
                           uint64_t *cols, Py_ssize_t n) {
    uint64_t rs = 0;
    for (Py_ssize_t c = 0; c < n; c++) {
        out[c] = (float)(((double)t[c] * rf) * colf[c]);
        rs += (uint64_t)t[c];
        cols[c] += (uint64_t)t[c];
    }
    return rs;
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

/* C (int64, M x N) += sum over the terms t of 2^shift_t A_t . B_t^T (with `start`: C =, its
 * old contents never read - no pass to zero it first): the LM head's slice
 * products (open1b_kernels/ops/lmhead_pairs.py) for one output block in one pass, each
 * 6 x 16 block summed over all terms in registers and added to C once per K block.
 *
 * Exact: a term's K block of pairs sums in int32 below 2^31 - a plain term (int8 both
 * sides) over KC pairs as in product(); a wide term (A's values 128 a_i + a_(i+1), at most
 * 127 * 128 + 127 = 16,383 in magnitude, against int8 B: a pair at most 2 * 16,383 * 128 =
 * 4,194,048) over KC / 2 = 512 pairs, 2,147,352,576 < 2^31 - and is widened to int64 and
 * multiplied by its power of two there; integer sums, so any order. The caller keeps C's
 * total below 2^63 (the LM head's T is below 2^53). */
static void product64(const term_t *terms, int nt, int64_t *c, Py_ssize_t M, Py_ssize_t N,
                      Py_ssize_t P, int start, const fused_t *fuse, Py_ssize_t r0,
                      Py_ssize_t r1) {
    int32_t tile[MR * NR];
    int64_t acc[MR * NR];
    Py_ssize_t col_panels = (N + NR - 1) / NR;
    for (Py_ssize_t ic = r0; ic < r1; ic += MCP) {
        Py_ssize_t ic_end = ic + MCP < r1 ? ic + MCP : r1;
        for (Py_ssize_t pc = 0; pc < P; pc += KC) {
            Py_ssize_t kc = P - pc < KC ? P - pc : KC;
            for (Py_ssize_t jr = 0; jr < col_panels; jr++) {
                Py_ssize_t j0 = jr * NR, cols = N - j0 < NR ? N - j0 : NR;
                for (Py_ssize_t ir = ic; ir < ic_end; ir++) {
                    memset(acc, 0, sizeof acc);
                    for (int q = 0; q < nt; q++) {
                        const uint32_t *a = terms[q].a + (ir * P + pc) * MR;
                        const uint32_t *b = terms[q].b + (jr * P + pc) * NR;
                        Py_ssize_t step = terms[q].wide ? KC / 2 : KC;
                        int64_t w = (int64_t)1 << terms[q].shift;
                        for (Py_ssize_t s = 0; s < kc; s += step) {
                            pair_block(a + s * MR, b + s * NR, (long)(kc - s < step ? kc - s : step),
                                       tile);
                            for (int e = 0; e < MR * NR; e++) acc[e] += (int64_t)tile[e] * w;
                        }
                    }
                    Py_ssize_t i0 = ir * MR, rows = M - i0 < MR ? M - i0 : MR;
                    for (Py_ssize_t i = 0; i < rows; i++) {
                        int64_t *dst = c + (i0 + i) * N + j0;
                        int64_t *src = acc + i * NR;
                        if (fuse && pc + kc == P) {     /* the last K block: T is whole */
                            if (!(start && pc == 0))
                                for (Py_ssize_t j = 0; j < cols; j++) src[j] += dst[j];
                            fuse->rows[i0 + i] += round_span(
                                src, fuse->rowf[i0 + i], fuse->colf + j0,
                                fuse->out + (i0 + i) * fuse->stride + fuse->c0 + j0,
                                fuse->cols + j0, cols);
                        } else if (start && pc == 0)
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

/* The LM head's rounding of one output block on the pair route, rows [r0, r1): T (int64,
 * R x C, below 2^53 in magnitude, so exact in float64) into out[r, c0 + c] =
 * fp32((T * rowf[r]) * colf[c]) - the operations of the other routes' rounding loops on
 * the same exact float64 value, so their bits - and T's row sums into rows (R,) and column
 * sums into cols (C,) (the exactness check's), summed as unsigned 64-bit integers: modulo
 * 2^64, well defined whatever the size. */
static void round_rows(const int64_t *t, const double *rowf, const double *colf, float *out,
                       uint64_t *rows, uint64_t *cols, Py_ssize_t C, Py_ssize_t stride,
                       Py_ssize_t c0, Py_ssize_t r0, Py_ssize_t r1) {
    for (Py_ssize_t r = r0; r < r1; r++)
        rows[r] += round_span(t + r * C, rowf[r], colf, out + r * stride + c0, cols, C);
}

/* Python wrappers: buffers checked against the shapes before any access. */

static PyObject *py_pack(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer x, out;
    Py_ssize_t sl, sk, lines, K, u0, u1, gap = 0;
    int width, pieces = 1;
    if (!PyArg_ParseTuple(args, "y*w*nnnninn|in", &x, &out, &sl, &sk, &lines, &K, &width, &u0,
                          &u1, &pieces, &gap))
        return NULL;
    Py_ssize_t panels = (lines + width - 1) / width, P = (K + 1) / 2;
    /* the last element read: line lines - 1 at k = K - 1 (strides are non-negative), and
     * for a wide operand its second slice `gap` bytes on */
    Py_ssize_t last = lines && K ? (lines - 1) * sl + (K - 1) * sk + 1 + gap : 0;
    int ok = (width == MR || width == NR) && sl >= 0 && sk >= 1 && lines >= 0 && K >= 1 &&
             gap >= 0 && PIECES_OK(pieces) && holds(&x, last, "x") &&
             holds(&out, panels * P * width * 4, "out") && units_ok(u0, u1, panels);
    int bad = 0;
    if (ok) {
        char bads[PIECES_MAX] = {0};
        Py_BEGIN_ALLOW_THREADS
        FOR_PIECES(u0, u1, pieces,
                   bads[piece] = (char)pack(x.buf, sl, sk, lines, K, width, out.buf, p_lo, p_hi,
                                            gap));
        Py_END_ALLOW_THREADS
        for (int i = 0; i < pieces; i++) bad |= bads[i];
    }
    PyBuffer_Release(&x);
    PyBuffer_Release(&out);
    if (ok && bad) {
        PyErr_SetString(PyExc_ValueError, "pack: a wide operand holds -128 (its slices must lie "
                                          "in [-127, 127])");
        return NULL;
    }
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
    int ok = cpu_avx2() && M >= 0 && N >= 0 && K >= 1 && K <= 131071 && PIECES_OK(pieces) &&
             holds(&ap, rp * P * MR * 4, "ap") && holds(&bp, cp * P * NR * 4, "bp") &&
             holds(&c, M * N * 4, "c") && units_ok(u0, u1, rp);
#if PAIRMM_X86
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        FOR_PIECES(u0, u1, pieces, product(ap.buf, bp.buf, c.buf, M, N, P, p_lo, p_hi));
        Py_END_ALLOW_THREADS
    }
#endif
    return FINISH(ok, "product: needs x86-64 with AVX2, 1 <= K <= 131071", &ap, &bp, &c);
}

static PyObject *py_product64(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *seq;
    Py_buffer c, ab[MAX_TERMS], bb[MAX_TERMS];
    term_t terms[MAX_TERMS];
    (void)terms;  /* filled and read only on x86-64 with AVX2 */
    Py_ssize_t M, N, K, u0, u1;
    PyObject *rnd = Py_None;
    Py_buffer rb[5];
    int nrb = 0;
    Py_ssize_t stride = 0, c0 = 0;
    int start, pieces = 1, nt = 0;
    if (!PyArg_ParseTuple(args, "Ow*nnnpnn|iO", &seq, &c, &M, &N, &K, &start, &u0, &u1, &pieces,
                          &rnd))
        return NULL;
    Py_ssize_t P = (K + 1) / 2, rp = (M + MR - 1) / MR, cp = (N + NR - 1) / NR;
    int ok = cpu_avx2() && M >= 0 && N >= 0 && K >= 1 && PIECES_OK(pieces) &&
             holds(&c, M * N * 8, "c") && units_ok(u0, u1, rp);
    PyObject *fast = ok ? PySequence_Fast(seq, "product64: terms must be a sequence") : NULL;
    Py_ssize_t n = fast ? PySequence_Fast_GET_SIZE(fast) : 0;
    if (fast && (n < 1 || n > MAX_TERMS)) {
        PyErr_Format(PyExc_ValueError, "product64: %zd terms, needs 1 to %d", n, MAX_TERMS);
        ok = 0;
    }
    ok = ok && fast;
    for (Py_ssize_t i = 0; ok && i < n; i++) {
        int wide, shift;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(fast, i), "y*y*ii", &ab[nt], &bb[nt], &wide,
                              &shift)) {
            ok = 0;
            break;
        }
        nt++;
        terms[i] = (term_t){ab[i].buf, bb[i].buf, wide != 0, shift};
        ok = holds(&ab[i], rp * P * MR * 4, "ap") && holds(&bb[i], cp * P * NR * 4, "bp");
        if (ok && (shift < 0 || shift > 28)) {
            PyErr_Format(PyExc_ValueError, "product64: shift %d outside [0, 28]", shift);
            ok = 0;
        }
    }
    Py_XDECREF(fast);
    /* the fused rounding: (rowf, colf, out, rows, cols, stride, c0) with cols pieces x N */
    if (ok && rnd != Py_None) {
        ok = PyArg_ParseTuple(rnd, "y*y*w*w*w*nn", &rb[0], &rb[1], &rb[2], &rb[3], &rb[4],
                              &stride, &c0);
        nrb = ok ? 5 : 0;
        ok = ok && rb[0].len == M * 8 && rb[1].len == N * 8 && c0 >= 0 && c0 + N <= stride &&
             rb[2].len == M * stride * 4 && rb[3].len == M * 8 && rb[4].len == pieces * N * 8;
        if (nrb && !ok) PyErr_SetString(PyExc_ValueError, "product64: rounding buffers do not "
                                                          "fit the shapes");
    }
#if PAIRMM_X86
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        FOR_PIECES(u0, u1, pieces, {
            fused_t f = {nrb ? rb[0].buf : NULL, nrb ? rb[1].buf : NULL, nrb ? rb[2].buf : NULL,
                         stride, c0, nrb ? rb[3].buf : NULL,
                         nrb ? (uint64_t *)rb[4].buf + piece * N : NULL};
            product64(terms, nt, c.buf, M, N, P, start, nrb ? &f : NULL, p_lo, p_hi);
        });
        Py_END_ALLOW_THREADS
    }
#endif
    for (int i = 0; i < nrb; i++) PyBuffer_Release(&rb[i]);
    for (int i = 0; i < nt; i++) {
        PyBuffer_Release(&ab[i]);
        PyBuffer_Release(&bb[i]);
    }
    return FINISH(ok, "product64: needs x86-64 with AVX2 and K >= 1", &c);
}

static PyObject *py_round(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer t, rowf, colf, out, rows, cols;
    Py_ssize_t R, C, stride, c0, r0, r1;
    int pieces = 1;
    if (!PyArg_ParseTuple(args, "y*y*y*w*w*w*nnnnnn|i", &t, &rowf, &colf, &out, &rows, &cols, &R,
                          &C, &stride, &c0, &r0, &r1, &pieces))
        return NULL;
    int ok = R >= 0 && C >= 0 && c0 >= 0 && c0 + C <= stride && 0 <= r0 && r0 <= r1 &&
             r1 <= R && PIECES_OK(pieces) && t.len == R * C * 8 && rowf.len == R * 8 &&
             colf.len == C * 8 && out.len == R * stride * 4 && rows.len == R * 8 &&
             cols.len == pieces * C * 8;
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        FOR_PIECES(r0, r1, pieces, round_rows(t.buf, rowf.buf, colf.buf, out.buf, rows.buf,
                                              (uint64_t *)cols.buf + piece * C, C, stride, c0,
                                              p_lo, p_hi));
        Py_END_ALLOW_THREADS
    }
    return FINISH(ok, "round: inconsistent shapes or row range", &t, &rowf, &colf, &out, &rows,
                  &cols);
}

static PyObject *py_pair_cpu(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    return PyBool_FromLong(cpu_avx2());
}

EXT_METHODS(pairmm) = {
    {"pair_cpu", py_pair_cpu, METH_NOARGS,
     "available(): whether this CPU runs the pair product (x86-64 with AVX2)."},
    {"pack", py_pack, METH_VARARGS,
     "pack(x, out, sl, sk, lines, K, width, u0, u1[, pieces[, gap]]): panels [u0, u1) of "
     "`width` (6: A's rows, 16: B's columns) lines of int8 x as int16 pair words; gap > 0: "
     "wide, each value 128 x[o] + x[o + gap]."},
    {"product", py_product, METH_VARARGS,
     "product(ap, bp, c, M, N, K, u0, u1[, pieces]): C's row panels [u0, u1) of the exact "
     "int32 product of the packed A and B."},
    {"product64", py_product64, METH_VARARGS,
     "product64(terms, c, M, N, K, start, u0, u1[, pieces[, rounding]]): C's row panels [u0, "
     "u1) += (start: =) the sum over the terms (ap, bp, wide, shift) of 2^shift A . B^T, "
     "int64; with rounding (rowf, colf, out, rows, cols, stride, c0) the finished T rounded "
     "into out instead (round's operations and sums)."},
    {"round", py_round, METH_VARARGS,
     "round(t, rowf, colf, out, rows, cols, R, C, stride, c0, r0, r1[, pieces]): the LM "
     "head's rounding of int64 T into out[:, c0:c0 + C] with T's row and column sums."},
    {NULL, NULL, 0, NULL},
};
