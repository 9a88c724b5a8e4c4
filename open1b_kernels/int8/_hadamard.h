/* The Hadamard butterflies shared by open1b_kernels.int8.hadamard's loop (_hadamard.c) and the
 * rotate-then-quantize tiles of open1b_kernels.int8.quantize (_quantize.c). */
#ifndef OPEN1B_HADAMARD_H
#define OPEN1B_HADAMARD_H

#include "../core/_ext.h"

/* The butterfly stages of hadamard_dim0_cpu_ on rows [r0, r1) (whole blocks of B rows) and
 * columns [c0, c1) of a row-major float32 (R, C) buffer, in place (_hadamard.c). */
void hadamard_stages(float *y, Py_ssize_t C, Py_ssize_t r0, Py_ssize_t r1, Py_ssize_t B,
                     Py_ssize_t c0, Py_ssize_t c1);

/* Sixteen rows p, p + s, ..., p + 15 s of one vector of 16 columns: the butterfly stages
 * h = 1, 2, 4, 8 of fwht_rows (n = 16) with the rows held in registers - two loads and
 * stores per element instead of eight. GCC's vector extension: elementwise IEEE float32
 * adds and subtracts (one instruction per 16, 8 or 4 lanes by the clone), so every element
 * meets the same operands in the same stage order as the scalar loop: the same bits. 8
 * lanes: the x86-64-v3 copies of rotq's tile (16 rows of one 8-column vector fill AVX2's
 * 16 ymm registers; 16-lane vectors split into two ymm each spilled on every stage). */
#define BFLY(a, b) { __typeof__(v[0]) x_ = v[a], z_ = v[b]; v[a] = x_ + z_; v[b] = x_ - z_; }
#define STAGES16                                                                               \
    BFLY(0, 1) BFLY(2, 3) BFLY(4, 5) BFLY(6, 7) BFLY(8, 9) BFLY(10, 11) BFLY(12, 13) BFLY(14, 15) \
    BFLY(0, 2) BFLY(1, 3) BFLY(4, 6) BFLY(5, 7) BFLY(8, 10) BFLY(9, 11) BFLY(12, 14) BFLY(13, 15) \
    BFLY(0, 4) BFLY(1, 5) BFLY(2, 6) BFLY(3, 7) BFLY(8, 12) BFLY(9, 13) BFLY(10, 14) BFLY(11, 15) \
    BFLY(0, 8) BFLY(1, 9) BFLY(2, 10) BFLY(3, 11) BFLY(4, 12) BFLY(5, 13) BFLY(6, 14) BFLY(7, 15)
/* The butterfly stages h = 1, 2, 4, 8 of 16 rows held in registers (fwht_rows' order), on
 * vectors of 16 or 8 columns: the same operations per element either way. */
static inline __attribute__((always_inline)) void stages16(v16f *v) { STAGES16 }
static inline __attribute__((always_inline)) void stages16_8(v8f *v) { STAGES16 }
#undef STAGES16
#undef BFLY

#endif
