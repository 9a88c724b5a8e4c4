/* One core's AMX-INT8 rate (TDPBSSD, 16 x 64 by 64 x 16 int8 tiles: 16,384 multiply-adds)
 * where its operands come from: the tile registers alone (the instruction's own rate), and
 * a 2 x 2 register block (two A and two B tiles loaded a 64-wide chunk, four int32
 * accumulators; each chunk's four tiles loaded before its products, as the tile product ran
 * until 2026-12-07) over operands in L1, A in L1 with B from L2, both from L2, and beyond L2;
 * that block with its sums carried through tile loads and stores every 8 chunks; and the
 * product's pass itself (open1b_kernels/int8/_amxpass.h's pass_next, the loop _amxmm.c runs:
 * A in L1, B by TILELOADDT1, the next chunk's tiles loaded as the products free them, sums
 * carried every PASS chunks). The operands are pseudo-random bytes, as the GEMMs' codes are:
 * the rate depends on the values - the registers' and the pass's rates with zero operands
 * are printed beside them ("_zeros"): on the AMX Xeon VM the pass ran 1.24-1.37x faster on
 * zeros than on random bytes.
 * Run by benchmarks/kernels/tile_rate.py, which compiles it with
 * Python's headers on the include path (the extension's headers use Py_ssize_t; nothing of
 * Python is called); the tiles are granted and configured by open1b_kernels/core/_amx.h.
 * Prints one line per case: its name and the rate in T multiply-adds/s. */
#include <Python.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../../open1b_kernels/core/_amx.h"
#include "../../open1b_kernels/int8/_amxpass.h"

static int32_t sums[64 * 1024] __attribute__((aligned(64)));

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* Pseudo-random bytes (a multiplicative hash of the index), or zeros. */
static void fill(int8_t *x, long n, unsigned mul, int zeros) {
    for (long i = 0; i < n; i++) x[i] = zeros ? 0 : (int8_t)(((unsigned)i * mul) >> 13);
}

/* The instruction alone: four independent accumulators, operands in registers. */
AMX_TARGET __attribute__((noinline)) static double registers(long n, int zeros) {
    static int8_t x[2048] __attribute__((aligned(64)));
    fill(x, 2048, 2654435761u, zeros);
    _tile_loadd(4, x, 64);
    _tile_loadd(5, x + 1024, 64);
    _tile_loadd(6, x + 512, 64);
    _tile_loadd(7, x + 256, 64);
    sums_in(sums, 0);
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

/* The 2 x 2 block's chunk loop as the product ran it before its passes (each chunk's four
 * tiles loaded before its products) over `chunks` chunks of strips a0, a1, b0, b1 (1 KiB a
 * chunk); the sums from and to `carry` (32 x 32, row stride 32) where it is not NULL; `pass`:
 * the product's pass_next instead (a1 = a0 + PASS chunks, as its `keep` lies). */
AMX_TARGET static inline void block(const int8_t *a0, const int8_t *a1, const int8_t *b0,
                                    const int8_t *b1, long chunks, int32_t *carry, int pass) {
    int32_t *o = carry ? carry : sums;
    if (pass) {
        pass_next(a0, b0, b1, chunks, carry != NULL, o);
        return;
    }
    sums_in(o, carry != NULL);
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
    sums_out(o);
}

/* The 2 x 2 block over na A strip pairs x nb B strip pairs of `chunks` chunks each (every
 * A pair against every B pair, B inner: an A pair is reused across all of B), `reps` times;
 * carried: each (A, B) block's sums in its own 4 KB of `sums`. */
AMX_TARGET __attribute__((noinline)) static double blocks(long chunks, long na, long nb,
                                                          int carried, int pass, long reps,
                                                          int zeros) {
    long strip = chunks * 1024;
    int8_t *a = aligned_alloc(64, 2 * na * strip), *b = aligned_alloc(64, 2 * nb * strip);
    if (!a || !b) {
        fprintf(stderr, "tile_rate: no memory for the strips\n");
        exit(2);
    }
    fill(a, 2 * na * strip, 2654435761u, zeros);
    fill(b, 2 * nb * strip, 2246822519u, zeros);
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
    if (!amx_ready()) {
        fprintf(stderr, "tile_rate: no AMX-INT8 tiles here (CPU, build or the kernel's grant)\n");
        return 2;
    }
    amx_tiles_on();
    /* reps chosen for ~0.3 s a case at ~2 T/s */
    printf("registers %.3f\n", registers(10000000, 0));
    printf("l1 %.3f\n", blocks(8, 1, 1, 0, 0, 150000, 0));                  /* 16 + 16 KB */
    printf("a_l1_b_l2 %.3f\n", blocks(8, 1, 32, 0, 0, 4000, 0));             /* 16 KB, 512 KB */
    printf("a_l1_b_l2_carried %.3f\n", blocks(8, 1, 32, 1, 0, 4000, 0));     /* carried */
    printf("l2 %.3f\n", blocks(32, 8, 8, 0, 0, 300, 0));                     /* 512 + 512 KB */
    printf("beyond_l2 %.3f\n", blocks(176, 2, 4, 0, 0, 300, 0));             /* 704 KB + 1.4 MB */
    printf("pass %.3f\n", blocks(PASS, 1, 16, 1, 1, 4000, 0));               /* 32 KB, 512 KB */
    printf("registers_zeros %.3f\n", registers(10000000, 1));
    printf("pass_zeros %.3f\n", blocks(PASS, 1, 16, 1, 1, 4000, 1));
    _tile_release();
    return 0;
}
