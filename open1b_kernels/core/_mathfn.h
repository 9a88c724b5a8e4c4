/* open1b_kernels/core/_mathfn.h: mathfn's exp, log and erfinv as single float32 operations, and the
 * exact bf16 <-> float32 conversions (shared by every float loop of the compiled extensions).
 *
 * The torch code of open1b_kernels/core/mathfn.py is the definition; these evaluate exactly its
 * float32 operations in the same order. Includers must compile with -ffp-contract=off and
 * without -ffast-math (setup.py), so every expression is one IEEE operation, round to
 * nearest even, never fused.
 */
#ifndef OPEN1B_MATHFN_H
#define OPEN1B_MATHFN_H
#include <stdint.h>
#include <math.h>
#include <string.h>

static const float RND = 12582912.0f;          /* 1.5 * 2^23 */
static const float LOG2E = 1.4426950216293335f;
static const float LN2_HI = 0.693359375f;
static const float LN2_LO = -0.00021219444170128554f;
static const float EXP_LO = -104.0f, EXP_HI = 89.0f;
static const float E2 = 0.5f, E3 = 0.1666666716337204f, E4 = 0.0416666679084301f,
                   E5 = 0.008333333767950535f, E6 = 0.0013888889225199819f,
                   E7 = 0.00019841270113829523f;
static const float TWO_M126 = 1.1754943508222875e-38f;
static const float TWO_P25 = 33554432.0f;
static const float L1 = 0.6666666865348816f, L2 = 0.4000000059604645f,
                   L3 = 0.2857142984867096f, L4 = 0.2222222238779068f,
                   L5 = 0.1818181872367859f;
static const uint32_t NAN_BITS = 0x7FC00000u;
/* Giles' single-precision erfinv (mathfn.EI_C, EI_T): the float32 values of its decimals */
static const float EI_C[9] = {2.810226362726098e-08f, 3.432739390518691e-07f,
                              -3.523387704262859e-06f, -4.391506536194356e-06f,
                              0.00021858086984138936f, -0.001253725029528141f,
                              -0.004177681636065245f, 0.24664072692394257f,
                              1.5014094114303589f};
static const float EI_T[9] = {-0.0002002142573473975f, 0.0001009505576803349f,
                              0.0013493432197719812f, -0.003673428436741233f,
                              0.005739507731050253f, -0.007622461300343275f,
                              0.00943887047469616f, 1.0016740560531616f,
                              2.832976818084717f};

static inline float from_bits(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t to_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

static inline float pow2i(int32_t k) {        /* 2^k, k in [-126, 127], exact */
    return from_bits((uint32_t)(k + 127) << 23);
}

static inline float exp1(float x) {
    float xs = (x != x) ? 0.0f : x;
    xs = xs < EXP_LO ? EXP_LO : xs;            /* clamp(lo, hi) = min(max(x, lo), hi) */
    xs = xs > EXP_HI ? EXP_HI : xs;
    float t = xs * LOG2E;
    float kf = (t + RND) - RND;
    float r = xs - kf * LN2_HI;
    r = r - kf * LN2_LO;
    float q = r * E7 + E6;
    q = q * r + E5;
    q = q * r + E4;
    q = q * r + E3;
    q = q * r + E2;
    float y = (r * r) * q + r;
    y = y + 1.0f;
    int32_t k = (int32_t)kf;
    int32_t k1 = k >> 1;                       /* arithmetic shift, as torch's int32 >> */
    y = (y * pow2i(k1)) * pow2i(k - k1);
    return (x != x) ? from_bits(NAN_BITS) : y;
}

static inline float log1(float x) {
    int ok = (x > 0.0f) && (x < INFINITY);
    float xs = ok ? x : 1.0f;
    int sub = xs < TWO_M126;
    xs = sub ? xs * TWO_P25 : xs;
    int32_t bits = (int32_t)to_bits(xs);
    int32_t e = (bits >> 23) - 127 - (sub ? 25 : 0);
    int32_t mbits = bits & 0x7FFFFF;
    int big = mbits > 0x3504F3;
    float m = from_bits((uint32_t)(mbits | (big ? (126 << 23) : (127 << 23))));
    e = e + big;
    float f = m - 1.0f;
    float s = f / (f + 2.0f);
    float z = s * s;
    float q = z * L5 + L4;
    q = q * z + L3;
    q = q * z + L2;
    q = q * z + L1;
    float big_r = q * z;
    float hfsq = (f * 0.5f) * f;
    float ef = (float)e;
    float y = s * (hfsq + big_r) + ef * LN2_LO;
    y = ef * LN2_HI - ((hfsq - y) - f);
    y = (x == 0.0f) ? -INFINITY : y;
    y = (x == INFINITY) ? INFINITY : y;
    return (x < 0.0f || x != x) ? from_bits(NAN_BITS) : y;
}

/* mathfn._erfinv: both branches evaluated, the sqrt correctly rounded as rounding.sqrt_rn
 * computes it (the float64 root of the float32 value, rounded once: the same float32 as a
 * correctly rounded float32 root, and the definition's operations). */
static inline float erfinv1(float x) {
    float w = -log1((1.0f - x) * (x + 1.0f));
    float wc = w - 2.5f;
    float p = EI_C[0];
    for (int i = 1; i < 9; i++) p = p * wc + EI_C[i];
    float wt = (float)sqrt((double)(w < 5.0f ? 5.0f : w)) - 3.0f;
    float pt = EI_T[0];
    for (int i = 1; i < 9; i++) pt = pt * wt + EI_T[i];
    float y = (w < 5.0f ? p : pt) * x;
    float ax = fabsf(x);
    y = ax == 1.0f ? x * INFINITY : y;
    y = ax > 1.0f ? from_bits(NAN_BITS) : y;
    return (x != x) ? from_bits(NAN_BITS) : y;
}

/* bf16 bits -> float32: exact (the top half of the float32 bits). */
static inline float widen_bf16(uint16_t v) { return from_bits((uint32_t)v << 16); }

/* float32 -> bf16 bits, round to nearest even (torch's conversion and
 * open1b_kernels.int8.gemm.bf16_rne); NaN -> 0x7FC0. */
static inline uint16_t bf16_rne1(float x) {
    uint32_t b = to_bits(x);
    uint16_t r = (uint16_t)((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16);
    return (x != x) ? (uint16_t)0x7FC0 : r;
}

#endif
