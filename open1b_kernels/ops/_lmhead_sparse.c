/* One slice pair of the LM head whose one slice is sparse, as an int32 product:
 *
 *   out[s * os + d * od] = sum over the k with S[s, k] != 0 of S[s, k] * D[k, d]
 *
 * Why: at the head's lowest level (L = S + 1) the pairs a_1 b_S and a_S b_1 multiply a
 * dense slice with the slice that holds only the elements more than 2^-7 below their row's
 * largest (a_S of an element is nonzero only then, and its a_1 is zero then): 2-4% of a
 * Gaussian operand - the head's input and weight at initialization, measured. The dense
 * plan runs each such pair as a whole int8 GEMM; here it costs its nonzeros' columns, at
 * a rate a few times below the GEMM's (open1b_kernels.ops.lmhead_sparse says where it pays).
 *
 * S: int8 (n_s, K), the sparse slice; D: int8 (K, n_d), the dense one; out: int32 (n_s, n_d)
 * or its transpose; each given by its element strides, one of them 1 (the slices' stores
 * hold an operand either way: rows or a transposed view). Exact:
 * |S|, |D| <= 128 and K <= MAX_K keep every partial sum below 2^31 (the caller's level slot
 * adds it with its weight, as it adds a GEMM's int32 product); integer sums, so neither the
 * order, the cut between threads, nor the path (VNNI or the plain loop) changes a bit.
 *
 * The VNNI path (AVX-512 VNNI + BW): a row's nonzeros in quads of one sign, their |S| as the
 * unsigned bytes of vpdpbusd against four D rows interleaved byte by byte (unpacks), 256
 * columns in 16 accumulators; the positive quads first, then the accumulators negated, the
 * negative ones added, negated again: P - N. Quads are padded with zeros.
 * The AVX2 path (x86-64 with AVX2 and no VNNI: the pair route's CPUs) the same with the
 * quad's four products summed by vpmaddubsw (|S| unsigned against D signed: each pair sum
 * within [-2 * 128 * 128, 2 * 128 * 127] = [-32768, 32512], int16 without saturation) and
 * vpmaddwd by ones (the two pair sums into the int32 lane), on 32-column panels.
 * (open1b_kernels.ops.lmhead_sparse is its Python side.)
 */
#include "../core/_ext.h"

#include <stdlib.h>
#include <string.h>

#include "_lmhead_quads.h"

#define MAX_K 65536     /* K * 128 * 128 <= 2^30: the positive and the negative sums fit */
#define GROUP 16        /* sparse rows per tile: the output stored 16 rows at a time */
#define WIDTH 256       /* dense columns per tile: 16 int32 accumulators of 16 lanes */
/* sparse_mm's loop argument: the best this CPU runs, or one asked for by name */
enum { LOOP_AUTO, LOOP_PLAIN, LOOP_AVX2, LOOP_VNNI };

/* the loop `asked` resolves to on this CPU, or -1 where it cannot run here */
static int loop_for(int asked) {
    int vnni = cpu_vnni(), avx2 = HAVE_V4 && cpu_avx2();
    switch (asked) {
    case LOOP_AUTO: return vnni ? LOOP_VNNI : avx2 ? LOOP_AVX2 : LOOP_PLAIN;
    case LOOP_PLAIN: return LOOP_PLAIN;
    case LOOP_AVX2: return avx2 ? LOOP_AVX2 : -1;
    case LOOP_VNNI: return vnni ? LOOP_VNNI : -1;
    default: return -1;
    }
}

/* the plain loop: tile[g][j] = sum of row g's terms at dense columns d0 + j, j < w */
static void tile_plain(const Quads *q, Py_ssize_t row0, int rows, const int8_t *D, Py_ssize_t ldd,
                       Py_ssize_t d0, int w, int32_t tile[GROUP][WIDTH]) {
    for (int g = 0; g < rows; g++) {
        int32_t *t = tile[g];
        memset(t, 0, sizeof(int32_t) * WIDTH);
        Py_ssize_t r = row0 + g;
        for (Py_ssize_t i = q->start[r] * 4; i < q->start[r + 1] * 4; i++) {
            int32_t x = q->v[i];
            if (i >= (q->start[r] + q->pos[r]) * 4) x = -x;
            const int8_t *dr = D + (Py_ssize_t)q->k[i] * ldd + d0;
            for (int j = 0; j < w; j++) t[j] += x * dr[j];
        }
    }
}

#if HAVE_V4
#include <immintrin.h>
#define VNNI __attribute__((target("avx512f,avx512bw,avx512vnni")))
#define VNNI_INLINE VNNI __attribute__((always_inline)) static inline


/* acc[4p .. 4p + 3] += the quad (x: four |S| bytes, rows k) against D's 64-column panel p:
 * acc[4p + q] lane (L, i) holds column 64p + 16L + 4q + i (the unpacks' order) */
VNNI_INLINE void quad_panels(__m512i *acc, const int8_t *D, Py_ssize_t ldd, const int32_t *k,
                             const uint8_t *v, Py_ssize_t d0, int np, __mmask64 last) {
    int32_t xs;
    memcpy(&xs, v, 4);
    const __m512i x = _mm512_set1_epi32(xs);
    const int8_t *r0 = D + (Py_ssize_t)k[0] * ldd + d0, *r1 = D + (Py_ssize_t)k[1] * ldd + d0;
    const int8_t *r2 = D + (Py_ssize_t)k[2] * ldd + d0, *r3 = D + (Py_ssize_t)k[3] * ldd + d0;
    for (int p = 0; p < np; p++) {
        __mmask64 m = p == np - 1 ? last : ~(__mmask64)0;
        __m512i a = _mm512_maskz_loadu_epi8(m, r0 + 64 * p);
        __m512i b = _mm512_maskz_loadu_epi8(m, r1 + 64 * p);
        __m512i c = _mm512_maskz_loadu_epi8(m, r2 + 64 * p);
        __m512i d = _mm512_maskz_loadu_epi8(m, r3 + 64 * p);
        __m512i ab_lo = _mm512_unpacklo_epi8(a, b), ab_hi = _mm512_unpackhi_epi8(a, b);
        __m512i cd_lo = _mm512_unpacklo_epi8(c, d), cd_hi = _mm512_unpackhi_epi8(c, d);
        __m512i *at = acc + 4 * p;
        at[0] = _mm512_dpbusd_epi32(at[0], x, _mm512_unpacklo_epi16(ab_lo, cd_lo));
        at[1] = _mm512_dpbusd_epi32(at[1], x, _mm512_unpackhi_epi16(ab_lo, cd_lo));
        at[2] = _mm512_dpbusd_epi32(at[2], x, _mm512_unpacklo_epi16(ab_hi, cd_hi));
        at[3] = _mm512_dpbusd_epi32(at[3], x, _mm512_unpackhi_epi16(ab_hi, cd_hi));
    }
}

/* c[L] = lane L (128 bits) of a[0], a[1], a[2], a[3] side by side: a 4 x 4 transpose of
 * lanes (t0 = a0.L0 a0.L1 a1.L0 a1.L1, t2 = a2.L0 a2.L1 a3.L0 a3.L1; t1, t3 lanes 2, 3) */
VNNI_INLINE void lanes4(const __m512i a[4], __m512i c[4]) {
    __m512i t0 = _mm512_shuffle_i32x4(a[0], a[1], 0x44);
    __m512i t1 = _mm512_shuffle_i32x4(a[0], a[1], 0xEE);
    __m512i t2 = _mm512_shuffle_i32x4(a[2], a[3], 0x44);
    __m512i t3 = _mm512_shuffle_i32x4(a[2], a[3], 0xEE);
    c[0] = _mm512_shuffle_i32x4(t0, t2, 0x88);
    c[1] = _mm512_shuffle_i32x4(t0, t2, 0xDD);
    c[2] = _mm512_shuffle_i32x4(t1, t3, 0x88);
    c[3] = _mm512_shuffle_i32x4(t1, t3, 0xDD);
}

/* one row's terms over np panels (np a constant where inlined), into t in column order */
VNNI_INLINE void row_vnni(const Quads *q, Py_ssize_t r, const int8_t *D, Py_ssize_t ldd,
                          Py_ssize_t d0, int np, __mmask64 last, int32_t *t) {
    __m512i acc[16];
    for (int i = 0; i < 4 * np; i++) acc[i] = _mm512_setzero_si512();
    Py_ssize_t i = q->start[r], mid = q->start[r] + q->pos[r], end = q->start[r + 1];
    for (; i < mid; i++) quad_panels(acc, D, ldd, q->k + 4 * i, q->v + 4 * i, d0, np, last);
    for (int j = 0; j < 4 * np; j++) acc[j] = _mm512_sub_epi32(_mm512_setzero_si512(), acc[j]);
    for (; i < end; i++) quad_panels(acc, D, ldd, q->k + 4 * i, q->v + 4 * i, d0, np, last);
    for (int p = 0; p < np; p++) {
        /* lane L of acc[4p + q] is columns 16L + 4q .. + 3: c[L] is columns 16L .. 16L + 15 */
        __m512i c[4];
        lanes4(acc + 4 * p, c);
        for (int L = 0; L < 4; L++)
            _mm512_storeu_si512(t + 64 * p + 16 * L,
                                _mm512_sub_epi32(_mm512_setzero_si512(), c[L]));
    }
}

VNNI static void tile_vnni(const Quads *q, Py_ssize_t row0, int rows, const int8_t *D,
                           Py_ssize_t ldd, Py_ssize_t d0, int w, int32_t tile[GROUP][WIDTH]) {
    int np = (w + 63) / 64;
    __mmask64 last = w % 64 ? (((__mmask64)1 << (w % 64)) - 1) : ~(__mmask64)0;
    for (int g = 0; g < rows; g++) {
        switch (np) {   /* a constant panel count per copy: the accumulators stay in registers */
        case 4: row_vnni(q, row0 + g, D, ldd, d0, 4, last, tile[g]); break;
        case 3: row_vnni(q, row0 + g, D, ldd, d0, 3, last, tile[g]); break;
        case 2: row_vnni(q, row0 + g, D, ldd, d0, 2, last, tile[g]); break;
        default: row_vnni(q, row0 + g, D, ldd, d0, 1, last, tile[g]); break;
        }
    }
}

#define AVX2 __attribute__((target("avx2")))
#define AVX2_INLINE AVX2 __attribute__((always_inline)) static inline

/* acc[4p .. 4p + 3] += the quad (x: four |S| bytes, rows k) against D's 32-column panels p
 * < np at d0: lane (L, i) of acc[4p + q] holds column 32p + 16L + 4q + i (the unpacks work
 * within 128-bit lanes) */
AVX2_INLINE void quad_panels_avx2(__m256i *acc, const int8_t *D, Py_ssize_t ldd,
                                  const int32_t *k, const uint8_t *v, Py_ssize_t d0, int np) {
    int32_t xs;
    memcpy(&xs, v, 4);
    const __m256i x = _mm256_set1_epi32(xs), ones = _mm256_set1_epi16(1);
    const int8_t *r0 = D + (Py_ssize_t)k[0] * ldd + d0, *r1 = D + (Py_ssize_t)k[1] * ldd + d0;
    const int8_t *r2 = D + (Py_ssize_t)k[2] * ldd + d0, *r3 = D + (Py_ssize_t)k[3] * ldd + d0;
    for (int p = 0; p < np; p++) {
        __m256i a = _mm256_loadu_si256((const __m256i *)(r0 + 32 * p));
        __m256i b = _mm256_loadu_si256((const __m256i *)(r1 + 32 * p));
        __m256i c = _mm256_loadu_si256((const __m256i *)(r2 + 32 * p));
        __m256i d = _mm256_loadu_si256((const __m256i *)(r3 + 32 * p));
        __m256i ab_lo = _mm256_unpacklo_epi8(a, b), ab_hi = _mm256_unpackhi_epi8(a, b);
        __m256i cd_lo = _mm256_unpacklo_epi8(c, d), cd_hi = _mm256_unpackhi_epi8(c, d);
        __m256i q[4] = {_mm256_unpacklo_epi16(ab_lo, cd_lo), _mm256_unpackhi_epi16(ab_lo, cd_lo),
                        _mm256_unpacklo_epi16(ab_hi, cd_hi), _mm256_unpackhi_epi16(ab_hi, cd_hi)};
        for (int j = 0; j < 4; j++)
            acc[4 * p + j] = _mm256_add_epi32(
                acc[4 * p + j], _mm256_madd_epi16(_mm256_maddubs_epi16(x, q[j]), ones));
    }
}

/* one row's terms on the 32 np columns at d0, into t (column order) */
AVX2_INLINE void row_avx2(const Quads *q, Py_ssize_t r, const int8_t *D, Py_ssize_t ldd,
                          Py_ssize_t d0, int np, int32_t *t) {
    __m256i acc[8];
    for (int i = 0; i < 4 * np; i++) acc[i] = _mm256_setzero_si256();
    Py_ssize_t i = q->start[r], mid = q->start[r] + q->pos[r], end = q->start[r + 1];
    for (; i < mid; i++) quad_panels_avx2(acc, D, ldd, q->k + 4 * i, q->v + 4 * i, d0, np);
    for (int j = 0; j < 4 * np; j++) acc[j] = _mm256_sub_epi32(_mm256_setzero_si256(), acc[j]);
    for (; i < end; i++) quad_panels_avx2(acc, D, ldd, q->k + 4 * i, q->v + 4 * i, d0, np);
    for (int p = 0; p < np; p++) {
        /* lane L of acc[4p + j] is columns 16L + 4j .. + 3 of the panel */
        const __m256i *a = acc + 4 * p;
        __m256i c[4] = {_mm256_permute2x128_si256(a[0], a[1], 0x20),
                        _mm256_permute2x128_si256(a[2], a[3], 0x20),
                        _mm256_permute2x128_si256(a[0], a[1], 0x31),
                        _mm256_permute2x128_si256(a[2], a[3], 0x31)};
        for (int j = 0; j < 4; j++)
            _mm256_storeu_si256((__m256i *)(t + d0 + 32 * p + 8 * j),
                                _mm256_sub_epi32(_mm256_setzero_si256(), c[j]));
    }
}

/* the panel's columns in twos of 32 (eight accumulators), the row's quads read once per
 * two; columns past w are computed from the panel's zeroed tail and not stored */
AVX2 static void tile_avx2(const Quads *q, Py_ssize_t row0, int rows, const int8_t *D,
                           Py_ssize_t ldd, int w, int32_t tile[GROUP][WIDTH]) {
    int np = (w + 31) / 32;
    for (int g = 0; g < rows; g++)
        for (int p = 0; p < np; p += 2) {
            if (np - p >= 2)
                row_avx2(q, row0 + g, D, ldd, 32 * p, 2, tile[g]);
            else
                row_avx2(q, row0 + g, D, ldd, 32 * p, 1, tile[g]);
        }
}

/* store_columns for a whole tile of 16 rows: each 16 x 16 block of int32 turned in
 * registers (unpacks within 128-bit lanes, then a 4 x 4 transpose of the lanes) - the
 * byte-by-byte turn cost more than the products at 3% nonzeros */
VNNI static void store_columns_16(int32_t tile[GROUP][WIDTH], int w, int32_t *out,
                                  Py_ssize_t od, int add) {
    int j0 = 0;
    for (; j0 + 16 <= w; j0 += 16) {
        __m512i r[16], t[16], u[16];
        for (int g = 0; g < 16; g++) r[g] = _mm512_loadu_si512(tile[g] + j0);
        for (int i = 0; i < 8; i++) {      /* rows 2i, 2i + 1: columns (4L, 4L+1), (4L+2, 4L+3) */
            t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
            t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
        }
        for (int i = 0; i < 4; i++) {      /* u[4i + q] lane L: column 4L + q, rows 4i .. 4i + 3 */
            u[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
            u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
            u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
            u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
        }
        for (int q = 0; q < 4; q++) {      /* lane L of u[q], u[4 + q], u[8 + q], u[12 + q] */
            __m512i a[4] = {u[q], u[4 + q], u[8 + q], u[12 + q]}, c[4];
            lanes4(a, c);
            for (int L = 0; L < 4; L++) {  /* c[L]: column 4L + q, all 16 rows */
                int32_t *o = out + (j0 + 4 * L + q) * od;
                __m512i v = add ? _mm512_add_epi32(_mm512_loadu_si512(o), c[L]) : c[L];
                _mm512_storeu_si512(o, v);
            }
        }
    }
    for (int j = j0; j < w; j++) {         /* the last columns, one at a time */
        int32_t *o = out + j * od;
        for (int g = 0; g < GROUP; g++) o[g] = add ? o[g] + tile[g][j] : tile[g][j];
    }
}
#endif

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <emmintrin.h>
/* x[c] = column c of the 16 x 16 bytes x[0..15] (rows): four rounds of SSE2 unpacks (every
 * x86-64 has them), each doubling the run of one column's bytes in a register */
static inline void turn16(__m128i x[16]) {
    __m128i t[16];
    for (int i = 0; i < 8; i++) {          /* rows 2i, 2i + 1: columns 0..7, 8..15 */
        t[2 * i] = _mm_unpacklo_epi8(x[2 * i], x[2 * i + 1]);
        t[2 * i + 1] = _mm_unpackhi_epi8(x[2 * i], x[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) {          /* rows 4i .. 4i + 3: columns by fours */
        x[4 * i] = _mm_unpacklo_epi16(t[4 * i], t[4 * i + 2]);
        x[4 * i + 1] = _mm_unpackhi_epi16(t[4 * i], t[4 * i + 2]);
        x[4 * i + 2] = _mm_unpacklo_epi16(t[4 * i + 1], t[4 * i + 3]);
        x[4 * i + 3] = _mm_unpackhi_epi16(t[4 * i + 1], t[4 * i + 3]);
    }
    for (int i = 0; i < 2; i++)            /* rows 8i .. 8i + 7: columns by twos */
        for (int c = 0; c < 4; c++) {
            t[8 * i + 2 * c] = _mm_unpacklo_epi32(x[8 * i + c], x[8 * i + 4 + c]);
            t[8 * i + 2 * c + 1] = _mm_unpackhi_epi32(x[8 * i + c], x[8 * i + 4 + c]);
        }
    for (int m = 0; m < 8; m++) {          /* all 16 rows: one column each */
        x[2 * m] = _mm_unpacklo_epi64(t[m], t[8 + m]);
        x[2 * m + 1] = _mm_unpackhi_epi64(t[m], t[8 + m]);
    }
}
#define HAVE_TURN16 1
#else
#define HAVE_TURN16 0
#endif

/* panel[k][j] = D's element (k, d0 + j) for j < w - D's element (k, d) at D[k dk + d dd],
 * one of the strides 1 (dk == 1: D's columns are its storage's rows, turned 16 x 16 bytes
 * at a time; the byte loop alone cost more than the products at 3% nonzeros) */
static void pack(int8_t *restrict panel, const int8_t *restrict D, Py_ssize_t dk, Py_ssize_t dd,
                 Py_ssize_t K, Py_ssize_t d0, int w) {
    if (w % 32)      /* the AVX2 loop reads whole 32-column panels: their tail zeros */
        for (Py_ssize_t k = 0; k < K; k++)
            memset(panel + k * WIDTH + w, 0, (size_t)((w + 31) / 32 * 32 - w));
    if (dd == 1) {
        for (Py_ssize_t k = 0; k < K; k++) memcpy(panel + k * WIDTH, D + k * dk + d0, (size_t)w);
        return;
    }
    Py_ssize_t k16 = HAVE_TURN16 ? K / 16 * 16 : 0;
    int w16 = HAVE_TURN16 ? w / 16 * 16 : 0;
#if HAVE_TURN16
    for (int j0 = 0; j0 < w16; j0 += 16)
        for (Py_ssize_t k0 = 0; k0 < k16; k0 += 16) {
            __m128i x[16];
            for (int j = 0; j < 16; j++)
                x[j] = _mm_loadu_si128((const __m128i *)(D + (d0 + j0 + j) * dd + k0));
            turn16(x);
            for (int k = 0; k < 16; k++)
                _mm_storeu_si128((__m128i *)(panel + (k0 + k) * WIDTH + j0), x[k]);
        }
#endif
    for (int j = 0; j < w; j++) {          /* what the 16 x 16 blocks left: tails */
        const int8_t *src = D + (d0 + j) * dd;
        for (Py_ssize_t k = j < w16 ? k16 : 0; k < K; k++) panel[k * WIDTH + j] = src[k];
    }
}

/* out[j * od + g] (+)= tile[g][j] for g < rows, j < w: the tile turned in L1 (`flip`, GROUP
 * x WIDTH), then each output line's GROUP sums stored or added as one vector */
CLONES static void store_columns(int32_t tile[GROUP][WIDTH], int rows, int w, int32_t *out,
                                 Py_ssize_t od, int add, int32_t flip[WIDTH][GROUP]) {
    for (int g = 0; g < GROUP; g++)
        for (int j = 0; j < w; j++) flip[j][g] = g < rows ? tile[g][j] : 0;
    for (int j = 0; j < w; j++) {
        int32_t *o = out + j * od;
        if (rows == GROUP && add)
            for (int g = 0; g < GROUP; g++) o[g] += flip[j][g];
        else if (rows == GROUP)
            memcpy(o, flip[j], sizeof(int32_t) * GROUP);
        else
            for (int g = 0; g < rows; g++) o[g] = add ? o[g] + flip[j][g] : flip[j][g];
    }
}

/* the dense columns of the WIDTH-wide blocks [b0, b1) for every sparse row (quads `q`),
 * stored into out or (add) added to it; 0 when memory could not be had */
static int blocks_run(const Quads *q, Py_ssize_t n_s, Py_ssize_t K, const int8_t *D,
                      Py_ssize_t dk, Py_ssize_t dd, Py_ssize_t n_d, int32_t *out, Py_ssize_t os,
                      Py_ssize_t od, Py_ssize_t b0, Py_ssize_t b1, int add, int loop) {
    int32_t(*tile)[WIDTH] = malloc(sizeof(int32_t) * GROUP * WIDTH);
    int32_t(*flip)[GROUP] = malloc(sizeof(int32_t) * GROUP * WIDTH);
    int8_t *panel = tile && flip ? malloc((size_t)K * WIDTH) : NULL;
    if (!panel) {
        free(tile);
        free(flip);
        return 0;
    }
    for (Py_ssize_t d0 = b0 * WIDTH; d0 < n_d && d0 < b1 * WIDTH; d0 += WIDTH) {
        int w = (int)(n_d - d0 < WIDTH ? n_d - d0 : WIDTH);
        /* D's columns [d0, d0 + w) copied into rows of WIDTH bytes: read in place, rows a
         * power of two of bytes apart (the head's 1,024 or 4,096 columns) fell into a few
         * cache sets, and the loads went to memory (measured: ~2x slower) */
        pack(panel, D, dk, dd, K, d0, w);
        for (Py_ssize_t g0 = 0; g0 < n_s; g0 += GROUP) {
            int rows = (int)(n_s - g0 < GROUP ? n_s - g0 : GROUP);
#if HAVE_V4
            if (loop == LOOP_VNNI)
                tile_vnni(q, g0, rows, panel, WIDTH, 0, w, tile);
            else if (loop == LOOP_AVX2)
                tile_avx2(q, g0, rows, panel, WIDTH, w, tile);
            else
#endif
                tile_plain(q, g0, rows, panel, WIDTH, 0, w, tile);
            if (od == 1) {
                for (int g = 0; g < rows; g++) {
                    int32_t *o = out + (g0 + g) * os + d0;
                    if (add)
                        for (int j = 0; j < w; j++) o[j] += tile[g][j];
                    else
                        memcpy(o, tile[g], sizeof(int32_t) * (size_t)w);
                }
            } else {     /* the sparse side is the output's columns: 16 of them side by side */
#if HAVE_V4
                if (loop == LOOP_VNNI && rows == GROUP)
                    store_columns_16(tile, w, out + d0 * od + g0, od, add);
                else
#endif
                    store_columns(tile, rows, w, out + d0 * od + g0, od, add, flip);
            }
        }
    }
    (void)loop;
    free(panel);
    free(flip);
    free(tile);
    return 1;
}

static PyObject *py_sparse_quads(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer s;
    Py_ssize_t n_s, K, ss, sk;
    int pieces = 1;
    if (!PyArg_ParseTuple(args, "y*nnnn|i", &s, &n_s, &K, &ss, &sk, &pieces)) return NULL;
    int ok = n_s >= 0 && K >= 1 && K <= MAX_K && PIECES_OK(pieces) &&
             ((sk == 1 && ss >= K) || (ss == 1 && sk >= n_s));
    if (!ok) {
        PyBuffer_Release(&s);
        PyErr_Format(PyExc_ValueError, "sparse_quads: inconsistent shape or strides (K %zd, at "
                     "most %d; S needs a unit stride)", K, MAX_K);
        return NULL;
    }
    ok = holds(&s, n_s ? (n_s - 1) * ss + (K - 1) * sk + 1 : 0, "sparse_quads: S");
    Quads q = {0};
    int made = 0;
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        made = quads_make(&q, s.buf, ss, sk, K, n_s, pieces);
        Py_END_ALLOW_THREADS
    }
    PyObject *got = ok && made ? quads_bytes(&q, n_s) : NULL;
    if (ok && !made) PyErr_NoMemory();
    quads_free(&q);
    PyBuffer_Release(&s);
    return got;
}

static PyObject *py_sparse_mm(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer qb, d, o;
    Py_ssize_t n_s, K, n_d, dk, dd, os, od, b_lo, b_hi;
    int pieces = 1, add = 0, asked = LOOP_AUTO;
    if (!PyArg_ParseTuple(args, "y*nny*nnnw*nnnn|iii", &qb, &n_s, &K, &d, &n_d, &dk, &dd, &o,
                          &os, &od, &b_lo, &b_hi, &pieces, &add, &asked))
        return NULL;
    Py_ssize_t blocks = (n_d + WIDTH - 1) / WIDTH;
    /* each operand read along one unit stride; its lines at least a line's length apart */
    int ok = n_s >= 0 && K >= 1 && K <= MAX_K && n_d >= 0 && PIECES_OK(pieces) &&
             ((dd == 1 && dk >= n_d) || (dk == 1 && dd >= K)) &&
             ((od == 1 && os >= n_d) || (os == 1 && od >= n_s)) && 0 <= b_lo && b_lo <= b_hi &&
             b_hi <= blocks;
    int loop = loop_for(asked);
    if (ok && loop < 0) {
        PyBuffer_Release(&qb);
        PyBuffer_Release(&d);
        PyBuffer_Release(&o);
        PyErr_Format(PyExc_ValueError, "sparse_mm: loop %d does not run on this CPU (0 auto, 1 "
                     "plain, 2 AVX2, 3 AVX-512 VNNI)", asked);
        return NULL;
    }
    if (!ok) {
        PyBuffer_Release(&qb);
        PyBuffer_Release(&d);
        PyBuffer_Release(&o);
        PyErr_Format(PyExc_ValueError, "sparse_mm: inconsistent shapes, strides or block range "
                     "(K %zd, at most %d; each operand needs a unit stride)", K, MAX_K);
        return NULL;
    }
    Py_ssize_t span_o = n_s && n_d ? (n_s - 1) * os + (n_d - 1) * od + 1 : 0;
    Quads q;
    ok = quads_view(&q, &qb, n_s, K) &&
         holds(&d, n_d ? (K - 1) * dk + (n_d - 1) * dd + 1 : 0, "sparse_mm: D") &&
         holds(&o, span_o * 4, "sparse_mm: out");
    int good[PIECES_MAX];
    for (int i = 0; ok && i < pieces; i++) good[i] = 1;
    if (ok && n_s && n_d && b_lo < b_hi) {
        /* pieces of whole column blocks: each packs and writes its own */
        Py_BEGIN_ALLOW_THREADS
        FOR_PIECES(b_lo, b_hi, pieces,
                   good[piece] = blocks_run(&q, n_s, K, d.buf, dk, dd, n_d, o.buf, os, od, p_lo,
                                            p_hi, add, loop));
        Py_END_ALLOW_THREADS
    }
    for (int i = 0; ok && i < pieces; i++)
        if (!good[i]) {
            PyErr_NoMemory();
            ok = 0;
        }
    return FINISH(ok, "sparse_mm failed", &qb, &d, &o);
}

static PyObject *py_sparse_loop(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    return PyLong_FromLong(loop_for(LOOP_AUTO));
}

EXT_METHODS(lmhead_sparse) = {
    {"sparse_quads", py_sparse_quads, METH_VARARGS,
     "sparse_quads(S, n_s, K, ss, sk[, pieces]) -> bytes: the nonzeros of int8 S (n_s, K), its "
     "element (s, k) at S[s ss + k sk] with one stride 1, as quads of one sign per row (K <= "
     "65,536) - sparse_mm's sparse operand."},
    {"sparse_mm", py_sparse_mm, METH_VARARGS,
     "sparse_mm(quads, n_s, K, D, n_d, dk, dd, out, os, od, b_lo, b_hi[, pieces, add, loop]): for "
     "the columns d of D in the 256-wide blocks [b_lo, b_hi), out[s os + d od] = (add: +=) the "
     "sum over the nonzeros S[s, k] of S (sparse_quads) times D[k dk + d dd] (int8 D (K, n_d), "
     "int32 out, each with one unit stride); loop: 0 the best this CPU runs, 1 the plain loop, "
     "2 the AVX2 one, 3 the AVX-512 VNNI one (refused where the CPU has not its instructions)."},
    {"sparse_loop", py_sparse_loop, METH_NOARGS,
     "sparse_loop(): the loop sparse_mm runs by default on this CPU (1 plain, 2 AVX2, 3 AVX-512 "
     "VNNI)."},
    {NULL, NULL, 0, NULL},
};
