// Small helpers shared by the super-block (K-quant) kernels of every ISA: ggml's rounding
// trick and the 6-bit scale/min unpacking of Q4_K/Q5_K. `static inline` (internal linkage)
// because the header is included by translation units built with different ISA flags.
#pragma once
#include <cstdint>
#include <cstring>

namespace colibri::kq {

// ggml's nearest_int: round to nearest, ties to even, by adding 1.5 * 2^23 and reading the
// mantissa bits. Exact for |v| <= 2^22 - 1; for anything else (inf, NaN, huge) it still
// returns what ggml returns, so quantized bytes agree even on garbage input. The caller's
// translation unit must not contract the product feeding it into an FMA.
static inline int nearest_int(float v) {
  const float t = v + 12582912.0f;
  int32_t i;
  std::memcpy(&i, &t, sizeof i);
  return (i & 0x007fffff) - 0x00400000;
}

// Scale j (6 bits) and min j (6 bits) of a Q4_K / Q5_K super-block from its 12 packed
// bytes: sub-blocks 0..3 in the low 6 bits of bytes 0..3 (scales) and 4..7 (mins);
// sub-blocks 4..7 split into a nibble in bytes 8..11 and two high bits on top of bytes 0..7.
static inline void scale_min_k4(int j, const uint8_t* q, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = static_cast<uint8_t>((q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4));
    *m = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

// The 16 signed 6-bit scales of a Q3_K super-block (stored + 32) from its 12 packed bytes:
// the low nibbles of scale j are byte j (j < 8, low nibble) or byte j - 8 (high nibble),
// the two high bits are bits 2 (j / 4) of byte 8 + j % 4.
static inline void q3k_scales(const uint8_t* s, int8_t out[16]) {
  for (int j = 0; j < 16; ++j) {
    const int lo = j < 8 ? (s[j] & 0x0f) : (s[j - 8] >> 4);
    const int hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
    out[j] = static_cast<int8_t>((lo | (hi << 4)) - 32);
  }
}

}  // namespace colibri::kq
