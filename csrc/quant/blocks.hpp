// Block layouts, byte-identical to GGUF / ggml (little-endian). Private to csrc/quant and
// csrc/model/matmul.cpp. Scales are raw IEEE half bits (read them with fp16_to_fp32 or F16C).
#pragma once
#include <cstdint>

namespace colibri {

constexpr int64_t kQK = 32;  // elements per block for every 4/8-bit format here

// value[j] = (nibble[j] - 8) * d; nibble j < 16 is qs[j] & 15, j >= 16 is qs[j-16] >> 4.
struct BlockQ4_0 {
  uint16_t d;
  uint8_t qs[kQK / 2];
};
// value[j] = nibble[j] * d + m (nibbles ordered as in Q4_0).
struct BlockQ4_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qs[kQK / 2];
};
// value[j] = qs[j] * d.
struct BlockQ8_0 {
  uint16_t d;
  int8_t qs[kQK];
};
// Activation format for Q4_1: value[j] = qs[j] * d; s = d * sum(qs) (rounded to half).
struct BlockQ8_1 {
  uint16_t d;
  uint16_t s;
  int8_t qs[kQK];
};

static_assert(sizeof(BlockQ4_0) == 18, "GGUF Q4_0 block is 18 bytes");
static_assert(sizeof(BlockQ4_1) == 20, "GGUF Q4_1 block is 20 bytes");
static_assert(sizeof(BlockQ8_0) == 34, "GGUF Q8_0 block is 34 bytes");
static_assert(sizeof(BlockQ8_1) == 36, "GGUF Q8_1 block is 36 bytes");

}  // namespace colibri
