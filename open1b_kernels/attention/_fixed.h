/* fixed.py's fixed point in C, for attention's tile loops (_tilesc.c, _tileamx.c, _tilevnni.c):
 * a bf16 value of a group whose largest effective exponent is E is the integer N times
 * 2^(E - 147) (open1b_kernels/attention/fixed.py says why). Integer and bit operations only,
 * so every loop that includes this forms the same N. */
#ifndef OPEN1B_ATTENTION_FIXED_H
#define OPEN1B_ATTENTION_FIXED_H

#include <stdint.h>
#include <string.h>

static inline int32_t bf16_expo(uint16_t bits) {  /* max(biased exponent, 1): fixed.py's e_eff */
    int32_t e = (bits >> 7) & 0xFF;
    return e > 1 ? e : 1;
}

/* fixed.py's integer N of a bf16 value in a group of exponent E (_magnitudes). */
static inline int32_t fixed_int(uint16_t bits, int32_t E) {
    int32_t ex = (bits >> 7) & 0xFF;
    int32_t m = ex > 0 ? ((bits & 0x7F) | 0x80) : (bits & 0x7F);
    int32_t shift = bf16_expo(bits) - E + 13;
    int32_t mag = shift >= 0 ? m << shift : m >> (-shift > 15 ? 15 : -shift);
    return (bits >> 15) ? -mag : mag;
}

static inline double pow2d(int32_t e) {  /* 2^e, e in [-1022, 1023], exact */
    uint64_t u = (uint64_t)(e + 1023) << 52;
    double d;
    memcpy(&d, &u, 8);
    return d;
}

#endif
