/* What every compiled loop of open1b_kernels shares. Each folder (core, ops, int8, attention)
 * is one optional extension built from the folder's _*.c files (setup.py), one C file beside
 * the Python op it serves; this header holds what they would otherwise each repeat:
 *
 * - CPU-level copies. CLONES: GCC's target_clones for x86-64 - an AVX2 and an x86-64-v4
 *   (AVX-512 F, BW, DQ, VL, CD) copy of a loop besides the baseline, picked at load time:
 *   the same IEEE operations on wider registers (-ffp-contract=off stays, so no FMA), so the
 *   same bits. x86-64-v4 rather than AVX-512F alone: without BW the int8/int16 lanes and
 *   without DQ/VL the compare masks fell back to 256-bit or scalar code (measured, Zen 4:
 *   the level pass 0.47x, the codes 0.47x, the slicer 0.76-0.81x the time of an AVX-512F
 *   clone); a CPU with AVX-512F but not the rest takes the AVX2 copy. V4 / V3: a plain
 *   target() copy, for loops GCC cannot clone well (it lowers comparisons of whole vectors
 *   of its vector extension before target_clones copies a function, so a clone compares
 *   lane by lane), picked at run time by the caller from cpu_level().
 * - cpu_level(), cpu_avx2() and cpu_vnni(): the run-time CPU probes. A build with
 *   -DOPEN1B_CPU_CAP=1 (docs/PORTABILITY.md, "An AVX2 CPU on an AVX-512 one") runs no copy
 *   above x86-64-v3 and no VNNI or AMX loop on any CPU - what a CPU with AVX2 and nothing
 *   newer runs - so an AVX-512 machine tests and times those copies; cpu_cap() says which.
 * - The wrappers' argument checks (holds, sized, units_ok) and ends (finish, FINISH).
 * - EXT_MODULE: a folder's module init - its files' method tables, plus openmp() and
 *   cpu_cap().
 * - GCC vector-extension types (v16f ...) and FOR_PIECES (_pieces.h).
 */
#ifndef OPEN1B_EXT_H
#define OPEN1B_EXT_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#include "_pieces.h"

#ifndef OPEN1B_CPU_CAP
#define OPEN1B_CPU_CAP 2   /* the highest level a copy may run: 2 x86-64-v4, 1 x86-64-v3 */
#endif

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#if OPEN1B_CPU_CAP >= 2
#define CLONES __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#else
#define CLONES __attribute__((target_clones("avx2", "default")))
#endif
#define HAVE_V4 1
#define V4 __attribute__((target("arch=x86-64-v4")))
#define V3 __attribute__((target("arch=x86-64-v3")))
#else
#define CLONES
#define HAVE_V4 0
#endif

/* The build's cap (OPEN1B_CPU_CAP): 2 unless built to run as an AVX2 CPU. */
static inline int cpu_cap(void) { return OPEN1B_CPU_CAP; }

/* 2 where the CPU runs x86-64-v4 code, 1 where x86-64-v3, else 0 (and 0 in a build without
 * the plain copies), at most the build's cap. */
static inline int cpu_level(void) {
#if HAVE_V4
    __builtin_cpu_init();
    int level = __builtin_cpu_supports("x86-64-v4") ? 2
                : __builtin_cpu_supports("x86-64-v3") ? 1 : 0;
    return level < OPEN1B_CPU_CAP ? level : OPEN1B_CPU_CAP;
#else
    return 0;
#endif
}

/* Whether the CPU runs AVX-512 VNNI with BW (VPDPBUSD on zmm: the LM head's sparse pairs,
 * attention's row products), in a build that has those loops (HAVE_V4). */
static inline int cpu_vnni(void) {
#if HAVE_V4
    if (OPEN1B_CPU_CAP < 2) return 0;
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw");
#else
    return 0;
#endif
}

/* Whether the CPU is x86-64 with AVX2 (the pair GEMM's instructions). */
static inline int cpu_avx2(void) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") != 0;
#else
    return 0;
#endif
}

typedef float v16f __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));
typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));

/* The wrappers' checks, each 1, or 0 with a ValueError naming the value: `buf` holds at
 * least `need` bytes (holds) or exactly n items of `item` bytes (sized); [u0, u1) lies in
 * [0, n) (units_ok). */
static inline int holds(const Py_buffer *buf, Py_ssize_t need, const char *name) {
    if (buf->len >= need) return 1;
    PyErr_Format(PyExc_ValueError, "%s: buffer of %zd bytes, needs %zd", name, buf->len, need);
    return 0;
}

static inline int sized(const Py_buffer *buf, Py_ssize_t n, Py_ssize_t item, const char *name) {
    if (buf->len == n * item) return 1;
    PyErr_Format(PyExc_ValueError, "%s: buffer of %zd bytes, expected %zd", name, buf->len,
                 n * item);
    return 0;
}

static inline int units_ok(Py_ssize_t u0, Py_ssize_t u1, Py_ssize_t n) {
    if (0 <= u0 && u0 <= u1 && u1 <= n) return 1;
    PyErr_Format(PyExc_ValueError, "unit range [%zd, %zd) outside [0, %zd)", u0, u1, n);
    return 0;
}

/* The end of a wrapper: release its buffers - the n of the array `bufs` (finish) or the
 * ones listed (FINISH(ok, msg, &a, &b, ...)) - then None, or NULL with the error a check
 * set or else `msg` as a ValueError when the arguments were inconsistent (nothing was
 * computed then). */
static inline PyObject *finish_done(int ok, const char *msg) {
    if (ok) Py_RETURN_NONE;
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, msg);
    return NULL;
}

static inline PyObject *finish(Py_buffer *bufs, int n, int ok, const char *msg) {
    for (int i = 0; i < n; i++) PyBuffer_Release(&bufs[i]);
    return finish_done(ok, msg);
}

static inline PyObject *finish_list(Py_buffer *const *bufs, int n, int ok, const char *msg) {
    for (int i = 0; i < n; i++) PyBuffer_Release(bufs[i]);
    return finish_done(ok, msg);
}

#define FINISH(OK, MSG, ...)                                                                 \
    finish_list((Py_buffer *const[]){__VA_ARGS__},                                           \
                (int)(sizeof((Py_buffer *const[]){__VA_ARGS__}) / sizeof(Py_buffer *)), (OK), \
                (MSG))

/* A C file's method table, named after the file: EXT_METHODS(rmsnorm) = {...}; */
#define EXT_METHODS(NAME) PyMethodDef open1b_##NAME##_methods[]
#define EXT_TABLE(NAME) extern PyMethodDef open1b_##NAME##_methods[]

static inline PyObject *ext_openmp(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    return PyBool_FromLong(PIECES_OPENMP);
}

static inline PyObject *ext_cpu_cap(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    return PyLong_FromLong(cpu_cap());
}

/* PyInit_NAME: the module NAME with openmp(), cpu_cap() and every table in TABLES (a brace
 * list of open1b_<file>_methods; EXT_TABLE declares them). */
#define EXT_MODULE(NAME, DOC, ...)                                                           \
    static PyMethodDef ext_common_[] = {                                                     \
        {"openmp", ext_openmp, METH_NOARGS,                                                  \
         "openmp(): whether the loops' pieces run at once on an OpenMP team (-fopenmp)."},   \
        {"cpu_cap", ext_cpu_cap, METH_NOARGS,                                                \
         "cpu_cap(): 2, or 1 where built to run as an AVX2 CPU (-DOPEN1B_CPU_CAP=1)."},      \
        {NULL, NULL, 0, NULL}};                                                              \
    static struct PyModuleDef ext_module_ = {PyModuleDef_HEAD_INIT, #NAME, DOC, -1,          \
                                             ext_common_, NULL, NULL, NULL, NULL};           \
    PyMODINIT_FUNC PyInit_##NAME(void) {                                                     \
        PyMethodDef *tables_[] = __VA_ARGS__;                                                \
        PyObject *m = PyModule_Create(&ext_module_);                                         \
        for (size_t i = 0; m && i < sizeof tables_ / sizeof tables_[0]; i++)                 \
            if (PyModule_AddFunctions(m, tables_[i]) < 0) Py_CLEAR(m);                       \
        return m;                                                                            \
    }

#endif
