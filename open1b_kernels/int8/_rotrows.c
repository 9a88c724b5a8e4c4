/* open1b_kernels.int8.quantize.rotate_quantize_rows_cpu's loop (rotq_rows): the linear's dX
 * rotation of its gradient's rows, each row in one pass through cache. Float work is the
 * torch code's IEEE float32 operations in its order (-ffp-contract=off). */
#include "../core/_ext.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../core/_mathfn.h"
#include "_rotq.h"

/* The butterfly stage h (< W) inside the W-lane vector V, in place: lane i pairs with lane
 * i ^ h; the lower lane of a pair becomes a + b, the upper a - b (a the lower's value) -
 * fwht_rows' two operations, with the same operands. */
#define BFLY_LANES(V, H, VI, LANE) {                                                      \
        __typeof__(V) p_ = __builtin_shuffle((V), (LANE) ^ (H));                          \
        VI lower_ = ((LANE) & (H)) == 0;                                                  \
        (V) = (__typeof__(V))(((VI)((V) + p_) & lower_) | ((VI)(p_ - (V)) & ~lower_)); }

/* open1b_kernels.int8.quantize.rotate_quantize_rows_cpu: rotate_quantize of rows [r0, r1) of
 * a bf16 (R, P) row-major matrix x, each row in one pass in cache - the rotation the dX
 * product of the linear's backward takes (its gradient's rows, rotated along the outputs),
 * which rotq reaches only through a float32 transposed copy of the whole gradient (widen_t),
 * its rotation in place and a third sweep for the codes. Per row: widened and zero-padded
 * to C (a multiple of 256) in the row buffer y (C floats, the caller's per piece); each
 * 256-block's butterfly stages h = 1, 2, ..., 128 in that order (hadamard_stages' order:
 * every element meets the same operands in the same order whatever the layout - stages
 * h < W pair lanes inside a W-lane vector, 16 or 8 by the copy, h = W..128 whole vectors);
 * the exact power-of-two scale; the row's NaN-sticky maximum and minimum; the step and its
 * divisor (rot_step, as rot_steps); and the codes (code_of: quantize's definition, clamped
 * always - codes_loop skips the clamp where no step is subnormal, where it changes
 * nothing) into out (R, C), the step into step[r]. */

/* One copy of rotq_rows for W-lane vectors VF (VI its int32 lanes, VU16 its bf16 lanes):
 * per 256-block, the stages h < W inside each vector as it is widened, the stages
 * h = W..128 on whole vectors of the block in L1 (b: 256 floats), then the scale, the
 * store and the lanes' running extremes; the row's extremes from its lanes (NaN-sticky
 * maxima are order-free but for a zero's sign, which the step's abs drops), its step and
 * its codes. */
#define ROTQ_ROWS(NAME, ATTR, VF, VI, VU16, W, ...)                                           \
    ATTR static void NAME(const uint16_t *x, Py_ssize_t P, Py_ssize_t C, float scale,         \
                          float inv127, int8_t *out, float *step, float *y, Py_ssize_t r0,    \
                          Py_ssize_t r1) {                                                    \
        const VI lane = {__VA_ARGS__};                                                        \
        float b[256] __attribute__((aligned(64)));                                            \
        for (Py_ssize_t r = r0; r < r1; r++) {                                                \
            const uint16_t *xr = x + r * P;                                                   \
            VF vmx = (VF){0} - INFINITY, vmn = (VF){0} + INFINITY;                            \
            for (Py_ssize_t k = 0; k < C; k += 256) {                                         \
                for (int t = 0; t < 256; t += W) {                                            \
                    VF v;                                                                     \
                    if (k + t + W <= P) {                                                     \
                        VU16 h;                                                               \
                        memcpy(&h, xr + k + t, sizeof h);                                     \
                        v = (VF)(__builtin_convertvector(h, VI) << 16);    /* widen_bf16 */   \
                    } else {                                                                  \
                        float f[W];                                                           \
                        for (int l = 0; l < W; l++)                                           \
                            f[l] = k + t + l < P ? widen_bf16(xr[k + t + l]) : 0.0f;          \
                        memcpy(&v, f, sizeof f);                                              \
                    }                                                                         \
                    for (int h = 1; h < W; h *= 2) BFLY_LANES(v, h, VI, lane)                 \
                    memcpy(b + t, &v, sizeof v);                                              \
                }                                                                             \
                for (int h = W; h < 256; h *= 2)                                              \
                    for (int g = 0; g < 256; g += 2 * h)                                      \
                        for (int i = g; i < g + h; i += W) {                                  \
                            VF a, z, sum, dif;                                                \
                            memcpy(&a, b + i, sizeof a);                                      \
                            memcpy(&z, b + i + h, sizeof z);                                  \
                            sum = a + z;                                                      \
                            dif = a - z;                                                      \
                            memcpy(b + i, &sum, sizeof sum);                                  \
                            memcpy(b + i + h, &dif, sizeof dif);                              \
                        }                                                                     \
                for (int t = 0; t < 256; t += W) {                                            \
                    VF v;                                                                     \
                    memcpy(&v, b + t, sizeof v);                                              \
                    v = v * scale;                                                            \
                    memcpy(y + k + t, &v, sizeof v);                                          \
                    VNAN_EXT_T(vmx, v, >, VI, VF);                                            \
                    VNAN_EXT_T(vmn, v, <, VI, VF);                                            \
                }                                                                             \
            }                                                                                 \
            float mx = -INFINITY, mn = INFINITY;                                              \
            for (int l = 0; l < W; l++) {                                                     \
                mx = nan_max(mx, vmx[l]);                                                     \
                mn = nan_min(mn, vmn[l]);                                                     \
            }                                                                                 \
            float s = rot_step(mx, mn, inv127), div = s == 0.0f ? 1.0f : s;                   \
            step[r] = s;                                                                      \
            int8_t *o = out + r * C;                                                          \
            for (Py_ssize_t c = 0; c < C; c++) o[c] = code_of(y[c] / div);                    \
        }                                                                                     \
    }
ROTQ_ROWS(rotq_rows_base, CLONES, v8f, v8i, v8u16, 8, 0, 1, 2, 3, 4, 5, 6, 7)
#if HAVE_V4
ROTQ_ROWS(rotq_rows_v4, V4, v16f, v16i, v16u16, 16, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,
          13, 14, 15)
ROTQ_ROWS(rotq_rows_v3, V3, v8f, v8i, v8u16, 8, 0, 1, 2, 3, 4, 5, 6, 7)
#endif

/* The copy the rotations run (open1b_rotq_level: the CPU's, or the one v4()/v3() left on). */
static void rotq_rows(const uint16_t *x, Py_ssize_t P, Py_ssize_t C, float scale, float inv127,
                      int8_t *out, float *step, float *y, Py_ssize_t r0, Py_ssize_t r1) {
#if HAVE_V4
    int level = open1b_rotq_level();
    if (level == 1) {
        rotq_rows_v4(x, P, C, scale, inv127, out, step, y, r0, r1);
        return;
    }
    if (level == 2) {
        rotq_rows_v3(x, P, C, scale, inv127, out, step, y, r0, r1);
        return;
    }
#endif
    rotq_rows_base(x, P, C, scale, inv127, out, step, y, r0, r1);
}

static PyObject *py_rotq_rows(PyObject *self, PyObject *args) {
    (void)self;
    int pieces = 1;
    Py_buffer x, out, step;
    Py_ssize_t R, P, C, r0, r1;
    float scale, inv127;
    if (!PyArg_ParseTuple(args, "y*nnnffw*w*nn|i", &x, &R, &P, &C, &scale, &inv127, &out,
                          &step, &r0, &r1, &pieces))
        return NULL;
    int ok = R >= 0 && P >= 1 && C % 256 == 0 && P <= C && 0 <= r0 && r0 <= r1 && r1 <= R &&
             x.len == R * P * 2 && out.len == R * C && step.len == R * 4;
    ok = ok && PIECES_OK(pieces);
    int nomem = 0;
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        FOR_PIECES(r0, r1, pieces, {
            float *y = malloc(sizeof(float) * C);       /* this piece's row buffer */
            if (y == NULL) nomem = 1;
            else rotq_rows(x.buf, P, C, scale, inv127, out.buf, step.buf, y, p_lo, p_hi);
            free(y);
        });
        Py_END_ALLOW_THREADS
    }
    if (ok && nomem) {
        PyBuffer_Release(&x);
        PyBuffer_Release(&out);
        PyBuffer_Release(&step);
        return PyErr_NoMemory();
    }
    return FINISH(ok, "rotq_rows: inconsistent shapes or row range", &x, &out, &step);
}

EXT_METHODS(rotrows) = {
    {"rotq_rows", py_rotq_rows, METH_VARARGS,
     "rotq_rows(x, R, P, C, scale, inv127, out, step, r0, r1[, pieces]): open1b_kernels.int8."
     "quantize.rotate_quantize_rows_cpu's rows [r0, r1)."},
    {NULL, NULL, 0, NULL},
};
