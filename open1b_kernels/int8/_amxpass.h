/* One pass of the AMX tile product (_amxmm.c's `product`) over a 32 x 32 block of C: PASS
 * 64-wide chunks of the contraction, the block's int32 sums carried in and out, A's two
 * tiles from where they lie (the pass's first block, which stores them into `keep`) or from
 * `keep` in L1 (its other blocks), B's by TILELOADDT1. Its own header so that the rate
 * benchmark (benchmarks/kernels/tile_rate.c) times these very loops, not a copy. */
#ifndef OPEN1B_AMXPASS_H
#define OPEN1B_AMXPASS_H

#include "../core/_amx.h"
#include "_amxlayout.h"

#define PASS 16        /* chunks a pass (1,024 bytes a line): why, _amxmm.c */

#if AMX_BUILD
/* The 32 x 32 sums of one block over one pass into the tiles 0-3: loaded from `sums` (row
 * stride 32) when `carried`, else zero. */
AMX_TARGET static inline void sums_in(const int32_t *sums, int carried) {
    if (carried) {
        _tile_loadd(0, sums, 128);
        _tile_loadd(1, sums + 16, 128);
        _tile_loadd(2, sums + 512, 128);
        _tile_loadd(3, sums + 528, 128);
    } else {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
    }
}

AMX_TARGET static inline void sums_out(int32_t *sums) {
    _tile_stored(0, sums, 128);
    _tile_stored(1, sums + 16, 128);
    _tile_stored(2, sums + 512, 128);
    _tile_stored(3, sums + 528, 128);
}

/* A pass's first block: `n` chunks of the A rows' two tiles (a0, a1: step and stride per
 * chunk as a_tiles gives them) against B's panels b0, b1, each A tile stored as it is used
 * into `keep` (two panels of PASS chunks: the rows packed, for the pass's other blocks). */
AMX_TARGET static inline void pass_first(const int8_t *a0, const int8_t *a1,
                                         Py_ssize_t step, Py_ssize_t stride, const int8_t *b0,
                                         const int8_t *b1, Py_ssize_t n, int carried,
                                         int32_t *sums, int8_t *keep) {
    sums_in(sums, carried);
    for (Py_ssize_t c = 0; c < n; c++) {
        _tile_loadd(4, a0 + c * step, stride);
        _tile_stored(4, keep + c * BLOCK_BYTES, KCHUNK);
        _tile_stream_loadd(6, b0 + c * BLOCK_BYTES, KCHUNK);
        _tile_dpbssd(0, 4, 6);
        _tile_stream_loadd(7, b1 + c * BLOCK_BYTES, KCHUNK);
        _tile_dpbssd(1, 4, 7);
        _tile_loadd(5, a1 + c * step, stride);
        _tile_stored(5, keep + (PASS + c) * BLOCK_BYTES, KCHUNK);
        _tile_dpbssd(2, 5, 6);
        _tile_dpbssd(3, 5, 7);
    }
    sums_out(sums);
}

/* The pass's other blocks: A from `keep` (in L1), each chunk's tiles loaded while the
 * previous chunk's last products run (a tile is reloaded as soon as its products have read
 * it: measured 2.9-3.1 T multiply-adds/s against 2.6-2.85 with each chunk's four tiles loaded
 * before its products, 2 threads, the step's shapes; in pass_first, which loads A where it
 * lies, the same order measured no faster). */
AMX_TARGET static inline void pass_next(const int8_t *keep, const int8_t *b0,
                                        const int8_t *b1, Py_ssize_t n, int carried,
                                        int32_t *sums) {
    const int8_t *a0 = keep, *a1 = keep + PASS * BLOCK_BYTES;
    sums_in(sums, carried);
    _tile_loadd(4, a0, KCHUNK);
    _tile_stream_loadd(6, b0, KCHUNK);
    _tile_stream_loadd(7, b1, KCHUNK);
    _tile_loadd(5, a1, KCHUNK);
    for (Py_ssize_t c = 1; c < n; c++) {
        const Py_ssize_t o = c * BLOCK_BYTES;
        _tile_dpbssd(0, 4, 6);
        _tile_dpbssd(1, 4, 7);
        _tile_loadd(4, a0 + o, KCHUNK);
        _tile_dpbssd(2, 5, 6);
        _tile_stream_loadd(6, b0 + o, KCHUNK);
        _tile_dpbssd(3, 5, 7);
        _tile_stream_loadd(7, b1 + o, KCHUNK);
        _tile_loadd(5, a1 + o, KCHUNK);
    }
    _tile_dpbssd(0, 4, 6);
    _tile_dpbssd(1, 4, 7);
    _tile_dpbssd(2, 5, 6);
    _tile_dpbssd(3, 5, 7);
    sums_out(sums);
}

#endif

#endif
