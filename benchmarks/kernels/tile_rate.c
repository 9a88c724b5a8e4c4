/* One core's AMX-INT8 rate (TDPBSSD, 16 x 64 by 64 x 16 int8 tiles: 16,384 multiply-adds)
 * where its operands come from: the tile registers alone (the instruction's own rate), and
 * a 2 x 2 register block (two A and two B tiles loaded a 64-wide chunk, four int32
 * accumulators; each chunk's four tiles loaded before its products, as the tile product ran
 * until 2026-12-07) over operands in L1, A in L1 with B from L2, both from L2, and beyond L2;
 * that block with its sums carried through tile loads and stores every 8 chunks; and the
 * product's pass (open1b_kernels/int8/_amxmm.c's pass_next: A in L1, B by TILELOADDT1, the
 * next chunk's tiles loaded as the products free them, sums carried every 16 chunks). Run by
 * benchmarks/kernels/tile_rate.py; x86-64 with AMX-INT8 and a Linux kernel that grants the
 * tile data (arch_prctl). Prints one line per case: its name and the rate in T
 * multiply-adds/s. */
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

typedef struct {
    uint8_t palette, start, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

static int32_t sums[64 * 1024] __attribute__((aligned(64)));

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* The instruction alone: four independent accumulators, operands in registers. */
__attribute__((noinline)) static double registers(long n) {
    static int8_t x[1024] __attribute__((aligned(64)));
    memset(x, 1, sizeof x);
    _tile_loadd(4, x, 64);
    _tile_loadd(5, x, 64);
    _tile_loadd(6, x, 64);
    _tile_loadd(7, x, 64);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    double t0 = now();
    for (long i = 0; i < n; i++) {
        _tile_dpbssd(0, 4, 6);
        _tile_dpbssd(1, 4, 7);
        _tile_dpbssd(2, 5, 6);
        _tile_dpbssd(3, 5, 7);
    }
    double s = now() - t0;
    _tile_stored(0, sums, 64);
    return 4.0 * n * 16384 / s / 1e12;
}

/* The chunk loop over `chunks` chunks of strips a0, a1, b0, b1 (1 KiB a chunk); the sums
 * from and to `carry` (32 x 32, row stride 32) where it is not NULL; `pass`: pass_next's
 * order and loads instead of each chunk's four plain loads before its products. */
static inline void block(const int8_t *a0, const int8_t *a1, const int8_t *b0, const int8_t *b1,
                         long chunks, int32_t *carry, int pass) {
    if (carry) {
        _tile_loadd(0, carry, 128);
        _tile_loadd(1, carry + 16, 128);
        _tile_loadd(2, carry + 512, 128);
        _tile_loadd(3, carry + 528, 128);
    } else {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
    }
    if (pass) {
        _tile_loadd(4, a0, 64);
        _tile_stream_loadd(6, b0, 64);
        _tile_stream_loadd(7, b1, 64);
        _tile_loadd(5, a1, 64);
        for (long c = 1; c < chunks; c++) {
            _tile_dpbssd(0, 4, 6);
            _tile_dpbssd(1, 4, 7);
            _tile_loadd(4, a0 + c * 1024, 64);
            _tile_dpbssd(2, 5, 6);
            _tile_stream_loadd(6, b0 + c * 1024, 64);
            _tile_dpbssd(3, 5, 7);
            _tile_stream_loadd(7, b1 + c * 1024, 64);
            _tile_loadd(5, a1 + c * 1024, 64);
        }
        _tile_dpbssd(0, 4, 6);
        _tile_dpbssd(1, 4, 7);
        _tile_dpbssd(2, 5, 6);
        _tile_dpbssd(3, 5, 7);
    } else
    for (long c = 0; c < chunks; c++) {
        _tile_loadd(4, a0 + c * 1024, 64);
        _tile_loadd(6, b0 + c * 1024, 64);
        _tile_dpbssd(0, 4, 6);
        _tile_loadd(7, b1 + c * 1024, 64);
        _tile_dpbssd(1, 4, 7);
        _tile_loadd(5, a1 + c * 1024, 64);
        _tile_dpbssd(2, 5, 6);
        _tile_dpbssd(3, 5, 7);
    }
    int32_t *o = carry ? carry : sums;
    _tile_stored(0, o, 128);
    _tile_stored(1, o + 16, 128);
    _tile_stored(2, o + 512, 128);
    _tile_stored(3, o + 528, 128);
}

/* The 2 x 2 block over na A strip pairs x nb B strip pairs of `chunks` chunks each (every
 * A pair against every B pair, B inner: an A pair is reused across all of B), `reps` times;
 * carried: each (A, B) block's sums in its own 4 KB of `sums`. */
__attribute__((noinline)) static double blocks(long chunks, long na, long nb, int carried,
                                               int pass, long reps) {
    long strip = chunks * 1024;
    int8_t *a = aligned_alloc(64, 2 * na * strip), *b = aligned_alloc(64, 2 * nb * strip);
    if (!a || !b) {
        fprintf(stderr, "tile_rate: no memory for the strips\n");
        exit(2);
    }
    for (long i = 0; i < 2 * na * strip; i++) a[i] = (int8_t)(i * 7 + 3);
    for (long i = 0; i < 2 * nb * strip; i++) b[i] = (int8_t)(i * 5 + 1);
    long tdp = 0;
    double t0 = now();
    for (long r = 0; r < reps; r++)
        for (long i = 0; i < na; i++)
            for (long j = 0; j < nb; j++) {
                block(a + 2 * i * strip, a + (2 * i + 1) * strip, b + 2 * j * strip,
                      b + (2 * j + 1) * strip, chunks, carried ? sums + (j % 64) * 1024 : NULL,
                      pass);
                tdp += 4 * chunks;
            }
    double s = now() - t0;
    free(a);
    free(b);
    return tdp * 16384.0 / s / 1e12;
}

int main(void) {
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)) {
        fprintf(stderr, "tile_rate: the kernel does not grant the AMX tile data\n");
        return 2;
    }
    tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int i = 0; i < 8; i++) {
        cfg.rows[i] = 16;
        cfg.colsb[i] = 64;
    }
    _tile_loadconfig(&cfg);
    /* reps chosen for ~0.3 s a case at ~2 T/s */
    printf("registers %.3f\n", registers(10000000));
    printf("l1 %.3f\n", blocks(8, 1, 1, 0, 0, 150000));                  /* 16 + 16 KB */
    printf("a_l1_b_l2 %.3f\n", blocks(8, 1, 32, 0, 0, 4000));             /* 16 KB, 512 KB */
    printf("a_l1_b_l2_carried %.3f\n", blocks(8, 1, 32, 1, 0, 4000));     /* the same, carried */
    printf("l2 %.3f\n", blocks(32, 8, 8, 0, 0, 300));                     /* 512 KB + 512 KB */
    printf("beyond_l2 %.3f\n", blocks(176, 2, 4, 0, 0, 300));             /* 704 KB + 1,408 KB */
    printf("pass %.3f\n", blocks(16, 1, 16, 1, 1, 4000));                 /* 32 KB, 512 KB */
    _tile_release();
    return 0;
}
