/* One core's multiply-add rate in a GEMM register block (6 x 16 outputs, operands in L1):
 * float32 FMA (vfmadd231ps, 8 lanes) against the exact integer alternative a CPU without
 * VNNI has, int16 pairs (vpmaddwd + vpaddd: 16 multiply-adds per instruction pair, exact
 * int32 sums) - written with intrinsics, and as the pair GEMM ships it (the inline assembly
 * of open1b_kernels/int8/_pairblock.h; the compiler's intrinsics version spills). Run by
 * benchmarks/kernels/madd_rate.py; x86-64 with AVX2 and FMA only. */
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../../open1b_kernels/int8/_pairblock.h"

#define KC 256
static float af[6 * KC], bf[16 * KC];
static int16_t ai[6 * KC], bi[16 * KC];
static uint32_t ap[3 * KC], bp[8 * KC];   /* the same values as pair words (KC / 2 pairs) */

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

__attribute__((noinline)) static void block_f32(float *c_out) {
    __m256 c[12];
    for (int i = 0; i < 12; i++) c[i] = _mm256_setzero_ps();
    const float *a = af, *b = bf;
    for (int k = 0; k < KC; k++, a += 6, b += 16) {
        __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8);
        for (int r = 0; r < 6; r++) {
            __m256 av = _mm256_broadcast_ss(a + r);
            c[2 * r] = _mm256_fmadd_ps(av, b0, c[2 * r]);
            c[2 * r + 1] = _mm256_fmadd_ps(av, b1, c[2 * r + 1]);
        }
    }
    for (int i = 0; i < 12; i++)
        _mm256_storeu_ps(c_out + 8 * i, _mm256_add_ps(c[i], _mm256_loadu_ps(c_out + 8 * i)));
}

__attribute__((noinline)) static void block_i16(int32_t *c_out) {
    __m256i c[12];
    for (int i = 0; i < 12; i++) c[i] = _mm256_setzero_si256();
    const int16_t *a = ai, *b = bi;
    for (int k = 0; k < KC; k += 2, a += 12, b += 32) {   /* pairs of k per instruction */
        __m256i b0 = _mm256_loadu_si256((const __m256i *)b);
        __m256i b1 = _mm256_loadu_si256((const __m256i *)(b + 16));
        for (int r = 0; r < 6; r++) {
            int32_t pair;
            __builtin_memcpy(&pair, a + 2 * r, 4);
            __m256i av = _mm256_set1_epi32(pair);
            c[2 * r] = _mm256_add_epi32(c[2 * r], _mm256_madd_epi16(av, b0));
            c[2 * r + 1] = _mm256_add_epi32(c[2 * r + 1], _mm256_madd_epi16(av, b1));
        }
    }
    for (int i = 0; i < 12; i++)
        _mm256_storeu_si256((__m256i *)(c_out + 8 * i),
                            _mm256_add_epi32(c[i], _mm256_loadu_si256((const __m256i *)(c_out + 8 * i))));
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 2000000;
    static float cf[96];
    static int32_t ci[96];
    for (int i = 0; i < 6 * KC; i++) af[i] = ai[i] = (int16_t)(i % 7);
    for (int i = 0; i < 16 * KC; i++) bf[i] = bi[i] = (int16_t)(i % 5);
    memcpy(ap, ai, sizeof ap);
    memcpy(bp, bi, sizeof bp);
    double t = now();
    for (long i = 0; i < n; i++) block_f32(cf);
    double tf = now() - t;
    t = now();
    for (long i = 0; i < n; i++) block_i16(ci);
    double ti = now() - t;
    static int32_t tile[96];
    t = now();
    for (long i = 0; i < n; i++) {
        pair_block(ap, bp, KC / 2, tile);
        for (int j = 0; j < 96; j++) ci[j] += tile[j];  /* what the GEMM does with a tile */
    }
    double ta = now() - t;
    double macs = (double)n * 6 * 16 * KC;
    printf("%.3f %.3f %.3f %g %d\n", macs / tf / 1e9, macs / ti / 1e9, macs / ta / 1e9, cf[5],
           ci[7]);
    return 0;
}
