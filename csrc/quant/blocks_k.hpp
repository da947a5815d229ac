// Block layouts of the K-quants (256-element super-blocks) and of Q5_0 / Q5_1, byte-identical
// to GGUF / ggml (little-endian). Scales are raw IEEE half bits (fp16_to_fp32 or F16C).
// The element order inside each block is spelled out here because every kernel depends on
// it; e is the element index in the super-block, g = e / 16, s = e / 32.
#pragma once
#include <cstdint>

#include "quant/q8_k.hpp"

namespace colibri {

// value[e] = d * (scales[g] & 15) * q[e] - dmin * (scales[g] >> 4), q in 0..3:
// q[e] = (qs[32 (e / 128) + e % 32] >> (2 ((e % 128) / 32))) & 3.
struct BlockQ2K {
  uint8_t scales[kQK_K / 16];
  uint8_t qs[kQK_K / 4];
  uint16_t d;
  uint16_t dmin;
};

// value[e] = d * (sc[g] - 32) * q[e], q in -4..3: low two bits as in Q2_K, minus 4 unless
// bit 4 (e / 128) + (e % 128) / 32 of hmask[e % 32] is set. The 16 6-bit scales are packed
// in 12 bytes (kquant_common.hpp, q3k_scales).
struct BlockQ3K {
  uint8_t hmask[kQK_K / 8];
  uint8_t qs[kQK_K / 4];
  uint8_t scales[12];
  uint16_t d;
};

// value[e] = d * sc[s] * q[e] - dmin * m[s], q in 0..15: the low nibble of
// qs[32 (e / 64) + e % 32] for e % 64 < 32, else its high nibble. sc, m: 6 bits each,
// packed in 12 bytes (kquant_common.hpp, scale_min_k4).
struct BlockQ4K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qs[kQK_K / 2];
};

// As Q4_K with q in 0..31: the nibble plus 16 times bit 2 (e / 64) + (e % 64) / 32 of
// qh[e % 32].
struct BlockQ5K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qh[kQK_K / 8];
  uint8_t qs[kQK_K / 2];
};

// value[e] = d * scales[g] * q[e], q in -32..31: with h = e / 128, r = e % 128, k = r / 32,
// l = r % 32: low nibble of ql[64 h + l + 32 (k & 1)] (k < 2) or its high nibble (k >= 2),
// plus 16 times bits 2k..2k+1 of qh[32 h + l], minus 32.
struct BlockQ6K {
  uint8_t ql[kQK_K / 2];
  uint8_t qh[kQK_K / 4];
  int8_t scales[kQK_K / 16];
  uint16_t d;
};

// value[j] = (q[j] - 16) * d, q = nibble (ordered as Q4_0) + 16 * bit j of qh (LE uint32).
struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];
  uint8_t qs[16];
};

// value[j] = q[j] * d + m, q as in Q5_0.
struct BlockQ5_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qh[4];
  uint8_t qs[16];
};

static_assert(sizeof(BlockQ2K) == 84, "GGUF Q2_K block is 84 bytes");
static_assert(sizeof(BlockQ3K) == 110, "GGUF Q3_K block is 110 bytes");
static_assert(sizeof(BlockQ4K) == 144, "GGUF Q4_K block is 144 bytes");
static_assert(sizeof(BlockQ5K) == 176, "GGUF Q5_K block is 176 bytes");
static_assert(sizeof(BlockQ6K) == 210, "GGUF Q6_K block is 210 bytes");
static_assert(sizeof(BlockQ5_0) == 22, "GGUF Q5_0 block is 22 bytes");
static_assert(sizeof(BlockQ5_1) == 24, "GGUF Q5_1 block is 24 bytes");

}  // namespace colibri
