/* The pair GEMM's register block (open1b_kernels/int8/_pairmm.c says what it computes and why
 * it is exact), in one place for the GEMM and for benchmarks/kernels/madd_rate.c, which
 * times it against a float32 FMA block. x86-64 with AVX2 only; include it where
 * __x86_64__ is defined. Written in inline assembly: GCC's version of the same intrinsics
 * hoisted the six broadcasts and spilled the accumulators to the stack (40 G multiply-adds
 * a second on one Zen 3 core instead of 80). */
#ifndef OPEN1B_PAIRBLOCK_H
#define OPEN1B_PAIRBLOCK_H

#include <stdint.h>

#define PAIRMM_ROW(i, lo, hi)                                  \
    "vpbroadcastd " #i "*4(%[a]), %%ymm2\n\t"                   \
    "vpmaddwd %%ymm0, %%ymm2, %%ymm3\n\t"                       \
    "vpaddd %%ymm3, %%" lo ", %%" lo "\n\t"                     \
    "vpmaddwd %%ymm1, %%ymm2, %%ymm3\n\t"                       \
    "vpaddd %%ymm3, %%" hi ", %%" hi "\n\t"

/* tile (6 x 16 int32, row-major) = sum over `pairs` pairs of A's panel words times B's. */
__attribute__((target("avx2")))
static void pair_block(const uint32_t *a, const uint32_t *b, long pairs, int32_t *tile) {
    __asm__ volatile(
        "vpxor %%ymm4, %%ymm4, %%ymm4\n\t vpxor %%ymm5, %%ymm5, %%ymm5\n\t"
        "vpxor %%ymm6, %%ymm6, %%ymm6\n\t vpxor %%ymm7, %%ymm7, %%ymm7\n\t"
        "vpxor %%ymm8, %%ymm8, %%ymm8\n\t vpxor %%ymm9, %%ymm9, %%ymm9\n\t"
        "vpxor %%ymm10, %%ymm10, %%ymm10\n\t vpxor %%ymm11, %%ymm11, %%ymm11\n\t"
        "vpxor %%ymm12, %%ymm12, %%ymm12\n\t vpxor %%ymm13, %%ymm13, %%ymm13\n\t"
        "vpxor %%ymm14, %%ymm14, %%ymm14\n\t vpxor %%ymm15, %%ymm15, %%ymm15\n\t"
        "test %[p], %[p]\n\t jz 2f\n\t"
        "1:\n\t"
        "vmovdqu (%[b]), %%ymm0\n\t vmovdqu 32(%[b]), %%ymm1\n\t"
        PAIRMM_ROW(0, "ymm4", "ymm5") PAIRMM_ROW(1, "ymm6", "ymm7")
        PAIRMM_ROW(2, "ymm8", "ymm9") PAIRMM_ROW(3, "ymm10", "ymm11")
        PAIRMM_ROW(4, "ymm12", "ymm13") PAIRMM_ROW(5, "ymm14", "ymm15")
        "add $24, %[a]\n\t add $64, %[b]\n\t dec %[p]\n\t jnz 1b\n\t"
        "2:\n\t"
        "vmovdqu %%ymm4, (%[t])\n\t vmovdqu %%ymm5, 32(%[t])\n\t"
        "vmovdqu %%ymm6, 64(%[t])\n\t vmovdqu %%ymm7, 96(%[t])\n\t"
        "vmovdqu %%ymm8, 128(%[t])\n\t vmovdqu %%ymm9, 160(%[t])\n\t"
        "vmovdqu %%ymm10, 192(%[t])\n\t vmovdqu %%ymm11, 224(%[t])\n\t"
        "vmovdqu %%ymm12, 256(%[t])\n\t vmovdqu %%ymm13, 288(%[t])\n\t"
        "vmovdqu %%ymm14, 320(%[t])\n\t vmovdqu %%ymm15, 352(%[t])\n\t"
        "vzeroupper\n\t"
        : [a] "+r"(a), [b] "+r"(b), [p] "+r"(pairs)
        : [t] "r"(tile)
        : "memory", "cc", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7",
          "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15");
}

#endif
