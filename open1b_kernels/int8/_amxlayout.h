/* The AMX tile GEMM's operand layout, shared by its packing (_amxpack.c) and its product
 * (_amxmm.c): both operands are packed once into panels of 16 lines (rows of A, columns of
 * B), each 64-wide chunk of the contraction one 1 KiB block that a tile loads in one go: A's
 * block [16 rows][64 k], B's [16 k-quads][16 columns][4 k] (the TDPBSSD "VNNI" order).
 * Zeros pad the lines to a multiple of 32 and K to a multiple of 64, so every block is
 * whole and a padded line or k adds zero. */
#ifndef OPEN1B_AMXLAYOUT_H
#define OPEN1B_AMXLAYOUT_H

#include <Python.h>

#define LINES 16        /* lines per panel: a tile's rows */
#define KCHUNK 64       /* contraction per block: a tile's 64 bytes a row */
#define BLOCK_BYTES (LINES * KCHUNK)

static inline Py_ssize_t round_up(Py_ssize_t x, Py_ssize_t m) { return (x + m - 1) / m * m; }

/* Packed size in bytes of `lines` x K: lines padded to 32, K to 64. */
static inline Py_ssize_t packed_bytes(Py_ssize_t lines, Py_ssize_t K) {
    return round_up(lines, 2 * LINES) * round_up(K, KCHUNK);
}

#endif
