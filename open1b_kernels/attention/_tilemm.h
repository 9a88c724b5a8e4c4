/* One copy of attention's fused tile products (dq_tiles, kv_tiles: _tilesc.c says what they
 * compute and why any order is exact), included once per CPU level with
 *   TM_SUFFIX  the copy's name suffix (dq_tiles_<suffix>, kv_tiles_<suffix>),
 *   TM_TARGET  its attributes (target ISA; fp-contract=fast, exact here),
 *   TM_LANES   doubles per vector register, TM_ROWS rows per register block.
 * A block is TM_ROWS rows x 2 vectors of columns: 2 * TM_ROWS accumulators, two loaded
 * operand vectors and one broadcast must fit the ISA's registers (v4: 16 + 3 of 32 zmm,
 * v3: 12 + 3 of 16 ymm, baseline: 8 + 3 of 16 xmm). Each element's sum is then rounded once
 * to float32 and added to its running sum in the caller's order, exactly as before. The
 * file has no include guard: it is meant to be included several times. */

#define TM_CAT2(a, b) a##_##b
#define TM_CAT(a, b) TM_CAT2(a, b)
#define TM_VEC TM_CAT(tm_vec, TM_SUFFIX)
#define TM_COLS (2 * TM_LANES)

typedef double TM_VEC __attribute__((vector_size(8 * TM_LANES)));

/* One register block: for rows i < `rows` (at most TM_ROWS) and the TM_COLS columns at b,
 * o[i * ostride + c] = o[...] + fp32(sum_k a[i * a_row + k * a_k] * b[k * b_k + c]) over
 * k < BLK. Rows past `rows` multiply zeros and are not stored. Always inlined, so the
 * strides its two callers pass are constants there. */
__attribute__((always_inline)) TM_TARGET
static inline void TM_CAT(block, TM_SUFFIX)(const double *a, Py_ssize_t a_row, Py_ssize_t a_k,
                                             const double *b, Py_ssize_t b_k, int rows,
                                             float *o, Py_ssize_t ostride) {
    TM_VEC acc[TM_ROWS][2];
    for (int i = 0; i < TM_ROWS; i++) acc[i][0] = acc[i][1] = (TM_VEC){0};
    for (int k = 0; k < BLK; k++) {
        TM_VEC b0, b1;
        memcpy(&b0, b + k * b_k, sizeof b0);
        memcpy(&b1, b + k * b_k + TM_LANES, sizeof b1);
        for (int i = 0; i < TM_ROWS; i++) {
            double x = i < rows ? a[i * a_row + k * a_k] : 0.0;
            acc[i][0] += x * b0;
            acc[i][1] += x * b1;
        }
    }
    for (int i = 0; i < rows; i++) {
        float *r = o + i * ostride;
        for (int l = 0; l < TM_LANES; l++) {
            r[l] = r[l] + (float)acc[i][0][l];
            r[TM_LANES + l] = r[TM_LANES + l] + (float)acc[i][1][l];
        }
    }
}

TM_TARGET
static void TM_CAT(dq_tiles, TM_SUFFIX)(const double *dsr, const double *kc, float *out,
                                        Py_ssize_t nk, Py_ssize_t D, Py_ssize_t kc_plane,
                                        Py_ssize_t first, Py_ssize_t u0, Py_ssize_t u1) {
    for (Py_ssize_t r = u0; r < u1; r++)
        for (Py_ssize_t c = 0; c < D; c++) out[r * D + c] = 0.0f;
    for (Py_ssize_t g0 = u0; g0 < u1;) {
        Py_ssize_t b = g0 / BLK, row_end = (b + 1) * BLK < u1 ? (b + 1) * BLK : u1;
        for (Py_ssize_t j = 0; j < nk; j++) {
            const double *kt = kc + b * kc_plane + (first + j) * BLK * D;
            const double *at = dsr + (b * nk + j) * BLK * BLK;
            for (Py_ssize_t r0 = g0; r0 < row_end; r0 += TM_ROWS) {
                int rows = row_end - r0 < TM_ROWS ? (int)(row_end - r0) : TM_ROWS;
                for (Py_ssize_t c0 = 0; c0 < D; c0 += TM_COLS)    /* dS rows x K's columns */
                    TM_CAT(block, TM_SUFFIX)(at + (r0 - b * BLK) * BLK, BLK, 1, kt + c0, D,
                                             rows, out + r0 * D + c0, D);
            }
        }
        g0 = row_end;
    }
}

TM_TARGET
static void TM_CAT(kv_tiles, TM_SUFFIX)(const double *lhs, const double *rhs, float *acc,
                                        Py_ssize_t D, Py_ssize_t L, Py_ssize_t stride,
                                        Py_ssize_t offset, Py_ssize_t u0, Py_ssize_t u1) {
    for (Py_ssize_t g0 = u0; g0 < u1;) {
        Py_ssize_t b = g0 / D, row_end = (b + 1) * D < u1 ? (b + 1) * D : u1;
        const double *lb = lhs + b * BLK * D, *rb = rhs + b * BLK * L;
        for (Py_ssize_t c0 = 0; c0 < L; c0 += TM_COLS)
            for (Py_ssize_t r0 = g0; r0 < row_end; r0 += TM_ROWS) {
                int rows = row_end - r0 < TM_ROWS ? (int)(row_end - r0) : TM_ROWS;
                /* lhs^T's rows are lhs's columns: row i, term k at lb[k * D + d0 + i] */
                TM_CAT(block, TM_SUFFIX)(lb + (r0 - b * D), 1, D, rb + c0, L, rows,
                                         acc + r0 * stride + offset + c0, stride);
            }
        g0 = row_end;
    }
}

#undef TM_VEC
#undef TM_COLS
#undef TM_CAT
#undef TM_CAT2
#undef TM_SUFFIX
#undef TM_TARGET
#undef TM_LANES
#undef TM_ROWS
