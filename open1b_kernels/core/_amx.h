/* open1b_kernels/core/_amx.h: what the AMX tile loops share (the int8 GEMM,
 * open1b_kernels/int8/_amxmm.c; attention's exact tile products,
 * open1b_kernels/attention/_tileamx.c): whether this process may run AMX-INT8 tiles, and
 * their configuration.
 *
 * The CPU must have AMX-TILE and AMX-INT8 (CPUID leaf 7), the OS must enable the tile state
 * (XCR0 bits 17 and 18) and, on Linux, grant this process the tile data
 * (arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA): Linux 5.16 and later; without it the
 * first tile instruction raises SIGILL); palette 1 must offer 8 tiles of 16 rows x 64 bytes.
 * amx_ready() checks all of them once per process. A build without the AMX intrinsics (not
 * x86-64 Linux, or a compiler older than GCC 11 / Clang 12; or -DOPEN1B_NO_AMX, which the
 * tests compile every loop file with, so that such a build cannot rot unseen on x86-64) has
 * AMX_BUILD 0 and amx_ready() 0: the callers then take their other paths.
 *
 * TDPBSSD, the one product used: C[m][n] += sum over k < 64 of A[m][k] * B[k][n] for signed
 * int8 A and B, each group of four products added into a 32-bit sum and that into the int32
 * element of C with two's complement addition - no saturation (Intel SDM, TDPBSSD) - so C
 * holds the integer sum while it stays below 2^31. */
#ifndef OPEN1B_AMX_H
#define OPEN1B_AMX_H

#include <stdint.h>
#include <string.h>

#if !defined(OPEN1B_NO_AMX) && defined(__x86_64__) && defined(__linux__) &&                    \
    ((defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11) ||                          \
     (defined(__clang__) && __clang_major__ >= 12))
#define AMX_BUILD 1
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#define AMX_TARGET __attribute__((target("amx-tile,amx-int8")))
#define AMX_REQ_XCOMP_PERM 0x1023
#define AMX_XTILEDATA 18

static int amx_probe(void) {
#if defined(OPEN1B_CPU_CAP) && OPEN1B_CPU_CAP < 2
    return 0;    /* built to run as an AVX2 CPU (_ext.h) */
#endif
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !((c >> 27) & 1)) return 0;     /* OSXSAVE */
    if (__get_cpuid_max(0, NULL) < 0x1d) return 0;
    __cpuid_count(7, 0, a, b, c, d);
    if (!((d >> 24) & 1) || !((d >> 25) & 1)) return 0;                   /* AMX-TILE, -INT8 */
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    (void)hi;
    if ((lo & (3u << 17)) != (3u << 17)) return 0;                       /* tile state on */
    __cpuid_count(0x1d, 1, a, b, c, d);     /* palette 1: 64 bytes a row, 16 rows, 8 tiles */
    if ((b & 0xffff) < 64 || (c & 0xffff) < 16 || (b >> 16) < 8) return 0;
    return syscall(SYS_arch_prctl, AMX_REQ_XCOMP_PERM, AMX_XTILEDATA) == 0;
}

/* 1 when this process runs AMX-INT8 tiles (probed once; the probe is idempotent, so two
 * threads racing on the first call both store the same answer). */
static inline int amx_ready(void) {
    static int state = -1;
    if (state < 0) state = amx_probe();
    return state;
}

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_tile_config;

/* Eight tiles of 16 rows x 64 bytes. The configuration is per thread: every piece of work
 * loads it first and releases the tiles (_tile_release) at its end. (The empty asm with the
 * memory clobber: GCC 12 dropped the zeroing of the fields that ldtilecfg reads but the code
 * never names - a #GP - without it.) */
AMX_TARGET static inline void amx_tiles_on(void) {
    amx_tile_config cfg __attribute__((aligned(64)));
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int i = 0; i < 8; i++) {
        cfg.rows[i] = 16;
        cfg.colsb[i] = 64;
    }
    __asm__ volatile("" : : "r"(&cfg) : "memory");
    _tile_loadconfig(&cfg);
}

/* The tile orders from row-major bytes (SSE2, which every AMX CPU has). */
#include <emmintrin.h>

/* 16 x 16 bytes: dst row r (stride ds) = column r of src (rows at stride ss). The classic
 * four rounds of SSE2 unpacks (bytes, words, dwords, qwords). */
static inline void amx_transpose16(const int8_t *src, Py_ssize_t ss, int8_t *dst, Py_ssize_t ds) {
    __m128i r[16], t[16];
    for (int i = 0; i < 16; i++) r[i] = _mm_loadu_si128((const __m128i *)(src + i * ss));
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm_unpacklo_epi8(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm_unpackhi_epi8(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 2; j++) {
            r[4 * i + j] = _mm_unpacklo_epi16(t[4 * i + j], t[4 * i + j + 2]);
            r[4 * i + j + 2] = _mm_unpackhi_epi16(t[4 * i + j], t[4 * i + j + 2]);
        }
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 4; j++) {
            t[8 * i + j] = _mm_unpacklo_epi32(r[8 * i + j], r[8 * i + j + 4]);
            t[8 * i + j + 4] = _mm_unpackhi_epi32(r[8 * i + j], r[8 * i + j + 4]);
        }
    for (int j = 0; j < 8; j++) {
        r[j] = _mm_unpacklo_epi64(t[j], t[j + 8]);
        r[j + 8] = _mm_unpackhi_epi64(t[j], t[j + 8]);
    }
    /* after the rounds r[i] holds the source column whose index is i's four bits reversed */
    static const int col[16] = {0, 8, 4, 12, 2, 10, 6, 14, 1, 9, 5, 13, 3, 11, 7, 15};
    for (int i = 0; i < 16; i++) _mm_storeu_si128((__m128i *)(dst + col[i] * ds), r[i]);
}

/* Four rows of 16 bytes (k, k+1, k+2, k+3 of 16 lines) into the B order: 64 bytes, line c's
 * four bytes at 4c. */
static inline void amx_interleave4(const int8_t *src, Py_ssize_t ss, int8_t *dst) {
    __m128i r0 = _mm_loadu_si128((const __m128i *)src);
    __m128i r1 = _mm_loadu_si128((const __m128i *)(src + ss));
    __m128i r2 = _mm_loadu_si128((const __m128i *)(src + 2 * ss));
    __m128i r3 = _mm_loadu_si128((const __m128i *)(src + 3 * ss));
    __m128i a = _mm_unpacklo_epi8(r0, r1), b = _mm_unpackhi_epi8(r0, r1);
    __m128i c = _mm_unpacklo_epi8(r2, r3), d = _mm_unpackhi_epi8(r2, r3);
    _mm_storeu_si128((__m128i *)dst, _mm_unpacklo_epi16(a, c));
    _mm_storeu_si128((__m128i *)(dst + 16), _mm_unpackhi_epi16(a, c));
    _mm_storeu_si128((__m128i *)(dst + 32), _mm_unpacklo_epi16(b, d));
    _mm_storeu_si128((__m128i *)(dst + 48), _mm_unpackhi_epi16(b, d));
}

#else
#define AMX_BUILD 0
static inline int amx_ready(void) { return 0; }
#endif

#endif
