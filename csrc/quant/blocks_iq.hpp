// Block layouts of the i-quants and MXFP4, byte-identical to GGUF / ggml (little-endian).
// Private to csrc/quant. Scales are raw IEEE half bits except MXFP4's e (E8M0) and
// IQ1_M's (a half split over the top nibbles of its four 16-bit scale words).
#pragma once
#include <cstdint>

namespace colibri {

constexpr int64_t kQKK = 256;  // elements per super-block (QK_K)

// value[j] = kvalues_iq4nl[nibble j] * d; nibble order as Q4_0 (low nibbles = 0..15).
struct BlockIQ4_NL {
  uint16_t d;
  uint8_t qs[16];
};
// 8 sub-blocks of 32 with 6-bit scales ls (low 4 bits in scales_l, high 2 in scales_h):
// value = d * (ls - 32) * kvalues_iq4nl[nibble]; each sub-block's nibbles as IQ4_NL's.
struct BlockIQ4_XS {
  uint16_t d;
  uint16_t scales_h;
  uint8_t scales_l[kQKK / 64];
  uint8_t qs[kQKK / 2];
};
// Per 32 elements two uint32 words: four 8-bit grid indices, then 4 x 7 sign bits and a
// 4-bit scale in the top bits. value = d * (0.5 + s) * 0.25 * grid * sign.
struct BlockIQ2_XXS {
  uint16_t d;
  uint16_t qs[kQKK / 8];
};
// qs[k]: 9-bit grid index | 7 sign bits << 9, per 8 elements; a 4-bit scale per 16.
struct BlockIQ2_XS {
  uint16_t d;
  uint16_t qs[kQKK / 8];
  uint8_t scales[kQKK / 32];
};
// 10-bit grid index (qs low 8 + 2 bits of qh) per 8 elements, explicit sign bytes
// (qs[32..63]), a 4-bit scale per 16.
struct BlockIQ2_S {
  uint16_t d;
  uint8_t qs[kQKK / 4];
  uint8_t qh[kQKK / 32];
  uint8_t scales[kQKK / 32];
};
// qs[0..63]: 8-bit grid indices (4 elements each); qs[64..95]: per 32 elements a uint32 of
// 4 x 7 sign bits and a 4-bit scale. value = d * (0.5 + s) * 0.5 * grid * sign.
struct BlockIQ3_XXS {
  uint16_t d;
  uint8_t qs[3 * kQKK / 8];
};
// 9-bit grid index (qs + one qh bit) per 4 elements, explicit sign bits, 4-bit scales per 32.
struct BlockIQ3_S {
  uint16_t d;
  uint8_t qs[kQKK / 4];
  uint8_t qh[kQKK / 32];
  uint8_t signs[kQKK / 8];
  uint8_t scales[kQKK / 64];
};
// 11-bit grid index (qs + 3 qh bits) per 8 elements; qh[k] bits 12..14: scale, bit 15:
// the sign of the delta for its 32 elements. value = d * (2s + 1) * (grid +- 1/8).
struct BlockIQ1_S {
  uint16_t d;
  uint8_t qs[kQKK / 8];
  uint16_t qh[kQKK / 32];
};
// As IQ1_S with a 3-bit scale per 16 and a delta sign per 8; the half d is the top
// nibbles of the four 16-bit words of `scales`.
struct BlockIQ1_M {
  uint8_t qs[kQKK / 8];
  uint8_t qh[kQKK / 16];
  uint8_t scales[kQKK / 32];
};
// value[j] = kvalues_mxfp4[nibble j] * 2^(e - 128) (the table holds e2m1 values doubled).
struct BlockMXFP4 {
  uint8_t e;
  uint8_t qs[16];
};

static_assert(sizeof(BlockIQ4_NL) == 18, "GGUF IQ4_NL block is 18 bytes");
static_assert(sizeof(BlockIQ4_XS) == 136, "GGUF IQ4_XS block is 136 bytes");
static_assert(sizeof(BlockIQ2_XXS) == 66, "GGUF IQ2_XXS block is 66 bytes");
static_assert(sizeof(BlockIQ2_XS) == 74, "GGUF IQ2_XS block is 74 bytes");
static_assert(sizeof(BlockIQ2_S) == 82, "GGUF IQ2_S block is 82 bytes");
static_assert(sizeof(BlockIQ3_XXS) == 98, "GGUF IQ3_XXS block is 98 bytes");
static_assert(sizeof(BlockIQ3_S) == 110, "GGUF IQ3_S block is 110 bytes");
static_assert(sizeof(BlockIQ1_S) == 50, "GGUF IQ1_S block is 50 bytes");
static_assert(sizeof(BlockIQ1_M) == 56, "GGUF IQ1_M block is 56 bytes");
static_assert(sizeof(BlockMXFP4) == 17, "GGUF MXFP4 block is 17 bytes");

// E8M0 exponent to float, halved (the e2m1 table is doubled): 2^(e - 128), with e < 2 as
// float subnormals. Same bits as ggml's GGML_E8M0_TO_FP32_HALF and gguf's NumPy version.
static inline float e8m0_to_fp32_half(uint8_t e) {
  const uint32_t bits = e < 2 ? (0x00200000u << e) : (static_cast<uint32_t>(e - 1) << 23);
  float f;
  __builtin_memcpy(&f, &bits, sizeof f);
  return f;
}

}  // namespace colibri
