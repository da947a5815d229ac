// COLIBRI_UNROLL: before the fixed-count loops over a SIMD kernel's registers (rows, tokens,
// key columns, accumulator vectors). Unrolled this early, GCC keeps an array of vectors
// indexed by the loop counter in registers; left to -O3's own unrolling (GCC 12), it kept
// such arrays in memory, a stack store beside every FMA of the inner loops (the AVX-512
// attention kernels ran at ~0.2 FMA a cycle until session 28; the row-lane matmul kernels
// stored every token's accumulator once per block until session 29). The pragma does not
// change the arithmetic: the same operations in the same order, only named registers.
#pragma once

// (Clang reads the GCC spelling too.)
#define COLIBRI_UNROLL _Pragma("GCC unroll 16")

// COLIBRI_FORCE_INLINE: on the small helpers of a kernel's block loop (loads, transposes,
// the dot chains) whose register arrays only stay in registers once inlined. GCC's
// heuristics otherwise leave some out of line depending on how many instantiations a file
// has (the AVX-512 row-lane kernels' block_sums<4> and Rows loads went out of line, through
// memory, when a 17-token pass was added).
#if defined(__GNUC__)
#define COLIBRI_FORCE_INLINE inline __attribute__((always_inline))
#else
#define COLIBRI_FORCE_INLINE inline
#endif
