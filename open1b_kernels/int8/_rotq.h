/* What the int8 folder's rotate-then-quantize loops share (_quantize.c's columns and strips,
 * _rotrows.c's rows): NaN-sticky extremes, quantize's code of a value, a rotated line's
 * step, and which CPU level's copies run. */
#ifndef OPEN1B_ROTQ_H
#define OPEN1B_ROTQ_H

#include <math.h>
#include <stdint.h>

static inline float nan_max(float a, float b) { return (a != a || b != b) ? NAN : (b > a ? b : a); }
static inline float nan_min(float a, float b) { return (a != a || b != b) ? NAN : (b < a ? b : a); }
/* quantize's code of v = x / step: clamped to [-127, 127], rounded half to even, as int8. */
static inline int8_t code_of(float v) {
    v = v < -127.0f ? -127.0f : (v > 127.0f ? 127.0f : v);
    return (int8_t)(int32_t)rintf(v);
}
/* The step of a rotated row or column from its extremes (the torch code's operations):
 * fp32(|max(mx, -mn)| * inv127), the maximum NaN-sticky (a zero's sign is lost to the abs). */
static inline float rot_step(float mx, float mn, float inv127) {
    float a = mx, b = -mn;
    float m = (a != a || b != b) ? NAN : (b > a ? b : a);
    return fabsf(m) * inv127;
}
#define NAN_BITS 0x7fc00000  /* the float bits of NAN (GCC: __builtin_nanf(""), quiet, +) */
/* nan_max (OP >) or nan_min (OP <) of every lane of ACC and V into ACC: NaN's bits where
 * either is NaN, else V where V OP ACC, else ACC - the scalar functions lane by lane. */
#define VNAN_EXT_T(ACC, V, OP, VI, VF) {                                                  \
        VI bad_ = ((ACC) != (ACC)) | ((V) != (V)), take_ = (V) OP (ACC);                  \
        VI m_ = ((VI)(V) & take_) | ((VI)(ACC) & ~take_);                                 \
        (ACC) = (VF)((m_ & ~bad_) | (((VI){0} + NAN_BITS) & bad_)); }

/* bf16 lanes of a 16- and an 8-lane float vector (the loads' widening) */
typedef uint16_t v16u16 __attribute__((vector_size(32)));
typedef uint16_t v8u16 __attribute__((vector_size(16)));

/* Which copies the rotations run (_quantize.c keeps the switch that v4()/v3() move, so
 * that every file's loops follow it): 1 the x86-64-v4 ones, 2 the x86-64-v3 ones, 0 the
 * portable (target_clones) ones. */
int open1b_rotq_level(void);

#endif
