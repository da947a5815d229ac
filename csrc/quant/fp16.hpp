// Scalar half-precision conversions, bit-exact with ggml / NumPy:
//   fp32 -> fp16: IEEE round-to-nearest-even, overflow to inf, subnormals kept
//                 (what F16C's vcvtps2ph and numpy's astype(float16) do);
//   fp32 -> bf16: ggml_compute_fp32_to_bf16 (round-to-nearest-even, NaN forced quiet);
//   fp16/bf16 -> fp32: exact (a NaN comes back quiet, as from F16C's vcvtph2ps).
// Integer-only so the result never depends on the FPU mode (FTZ/DAZ) or the compiler.
//
// The functions are `static inline` on purpose: this header is included by translation
// units compiled with different ISA flags (AVX2, AVX-512); internal linkage keeps the
// linker from picking an AVX-512 copy of an inline function for scalar callers.
#pragma once
#include <cstdint>
#include <cstring>

namespace colibri {

static inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

static inline float f32_from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

static inline float fp16_to_fp32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) {  // inf, or NaN made quiet with its payload kept (what F16C does)
    return f32_from_bits(sign | 0x7f800000u | (mant ? 0x400000u : 0u) | (mant << 13));
  }
  if (exp != 0) return f32_from_bits(sign | ((exp + 112u) << 23) | (mant << 13));
  if (mant == 0) return f32_from_bits(sign);  // +-0
  // Subnormal half: normalize the mantissa into a normal float.
  uint32_t e = 113;  // exponent of 2^-14 (the subnormal scale) in float bias
  while ((mant & 0x400u) == 0) {
    mant <<= 1;
    --e;
  }
  return f32_from_bits(sign | (e << 23) | ((mant & 0x3ffu) << 13));
}

static inline uint16_t fp32_to_fp16(float f) {
  const uint32_t x = f32_bits(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) {  // NaN: quiet it and keep the top payload bits (like F16C)
    return static_cast<uint16_t>(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
  }
  if (ax >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520 -> inf
  if (ax >= 0x38800000u) {  // normal half (|f| >= 2^-14)
    ax -= 0x38000000u;      // rebias the exponent from 127 to 15
    ax += 0x0fffu + ((ax >> 13) & 1u);  // round to nearest, ties to even (carry is fine)
    return static_cast<uint16_t>(sign | (ax >> 13));
  }
  const uint32_t e = ax >> 23;
  if (e < 102) return sign;  // |f| < 2^-25 rounds to zero
  // Subnormal half: units of 2^-24. value = m * 2^(e-150), so shift right by 126 - e.
  const uint32_t m = (ax & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126 - e;  // 14..24
  uint32_t h = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1);
  const uint32_t half = 1u << (shift - 1);
  if (rem > half || (rem == half && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

static inline float bf16_to_fp32(uint16_t h) { return f32_from_bits(static_cast<uint32_t>(h) << 16); }

static inline uint16_t fp32_to_bf16(float f) {
  const uint32_t x = f32_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 64u);  // quiet NaN
  return static_cast<uint16_t>((x + (0x7fffu + ((x >> 16) & 1u))) >> 16);
}

}  // namespace colibri
