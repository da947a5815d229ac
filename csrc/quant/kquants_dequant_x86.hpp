// Dequantization of the K-quants and Q5_0 / Q5_1 for x86 (AVX2 instructions), compiled
// into kquants_avx2.cpp and kquants_avx512.cpp like kquants_x86.hpp (include it only
// there; internal linkage). It feeds the float32-activation path (each weight row
// dequantized, then a float dot) and embedding lookups, so it must give the scalar
// reference's bits, which are gguf.quants.dequantize's: every value is the same IEEE
// expression in the same order (the quant converted to float exactly, then the one or
// two roundings of kquants_ref.cpp / q5_ref.cpp; contraction is off in the including files).
#pragma once
#include <immintrin.h>

#include <cstring>
#include <type_traits>

#include "quant/blocks_k.hpp"
#include "quant/kquant_common.hpp"
#include "quant/q8_k.hpp"

namespace colibri {
namespace {

enum class Combine { Mul, MulSub, MulAdd };

// 16 small integers (int8 lanes of q) -> 16 floats: q * a, q * a - b or q * a + b.
template <Combine C>
inline void emit16(__m128i q, float a, float b, float* dst) {
  const __m256 va = _mm256_set1_ps(a), vb = _mm256_set1_ps(b);
  const __m256 f[2] = {_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)),
                       _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q, 8)))};
  for (int k = 0; k < 2; ++k) {
    __m256 v = _mm256_mul_ps(va, f[k]);
    if constexpr (C == Combine::MulSub) v = _mm256_sub_ps(v, vb);
    if constexpr (C == Combine::MulAdd) v = _mm256_add_ps(v, vb);
    _mm256_storeu_ps(dst + 8 * k, v);
  }
}

inline __m128i lo128(__m256i v) { return _mm256_castsi256_si128(v); }
inline __m128i hi128(__m256i v) { return _mm256_extracti128_si256(v, 1); }
inline __m256i bytes8(int v) { return _mm256_set1_epi8(static_cast<char>(v)); }

void dequantize_row_q2_k_x86(const void* src, float* dst, int64_t n) {
  const BlockQ2K* b = static_cast<const BlockQ2K*>(src);
  for (int64_t i = 0; i < n / kQK_K; ++i, dst += kQK_K) {
    const float d = _cvtsh_ss(b[i].d), dmin = _cvtsh_ss(b[i].dmin);
    for (int h = 0; h < 2; ++h) {
      const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b[i].qs + 32 * h));
      for (int k = 0; k < 4; ++k) {
        const __m256i q = _mm256_and_si256(_mm256_srli_epi16(bits, 2 * k), bytes8(3));
        const int g = 8 * h + 2 * k;
        const uint8_t s0 = b[i].scales[g], s1 = b[i].scales[g + 1];
        float* out = dst + 128 * h + 32 * k;
        emit16<Combine::MulSub>(lo128(q), d * static_cast<float>(s0 & 0x0f), dmin * static_cast<float>(s0 >> 4), out);
        emit16<Combine::MulSub>(hi128(q), d * static_cast<float>(s1 & 0x0f), dmin * static_cast<float>(s1 >> 4),
                                out + 16);
      }
    }
  }
}

void dequantize_row_q3_k_x86(const void* src, float* dst, int64_t n) {
  const BlockQ3K* b = static_cast<const BlockQ3K*>(src);
  for (int64_t i = 0; i < n / kQK_K; ++i, dst += kQK_K) {
    const float d = _cvtsh_ss(b[i].d);
    int8_t sc[16];
    kq::q3k_scales(b[i].scales, sc);
    const __m256i hm = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b[i].hmask));
    for (int h = 0; h < 2; ++h) {
      const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b[i].qs + 32 * h));
      for (int k = 0; k < 4; ++k) {
        const __m256i lo = _mm256_and_si256(_mm256_srli_epi16(bits, 2 * k), bytes8(3));
        const __m256i hb = _mm256_and_si256(_mm256_srli_epi16(hm, 4 * h + k), bytes8(1));
        // q = low two bits - 4 unless the high bit is set: low - 4 + 4 * hbit, in -4..3
        const __m256i q = _mm256_sub_epi8(_mm256_or_si256(lo, _mm256_slli_epi16(hb, 2)), bytes8(4));
        const int g = 8 * h + 2 * k;
        float* out = dst + 128 * h + 32 * k;
        emit16<Combine::Mul>(lo128(q), d * static_cast<float>(sc[g]), 0.0f, out);
        emit16<Combine::Mul>(hi128(q), d * static_cast<float>(sc[g + 1]), 0.0f, out + 16);
      }
    }
  }
}

template <bool Five>
void dequantize_row_q45_k_x86(const void* src, float* dst, int64_t n) {
  using Block = std::conditional_t<Five, BlockQ5K, BlockQ4K>;
  const Block* b = static_cast<const Block*>(src);
  for (int64_t i = 0; i < n / kQK_K; ++i, dst += kQK_K) {
    const float d = _cvtsh_ss(b[i].d), dmin = _cvtsh_ss(b[i].dmin);
    __m256i hb = _mm256_setzero_si256();
    if constexpr (Five) hb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b[i].qh));
    for (int j = 0; j < 4; ++j) {
      const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b[i].qs + 32 * j));
      __m256i q[2] = {_mm256_and_si256(bits, bytes8(0x0f)), _mm256_and_si256(_mm256_srli_epi16(bits, 4), bytes8(0x0f))};
      for (int s = 0; s < 2; ++s) {  // sub-block 2j + s
        if constexpr (Five)
          q[s] = _mm256_or_si256(q[s], _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2 * j + s), bytes8(1)), 4));
        uint8_t sc, m;
        kq::scale_min_k4(2 * j + s, b[i].scales, &sc, &m);
        const float ds = d * static_cast<float>(sc), ms = dmin * static_cast<float>(m);
        float* out = dst + 64 * j + 32 * s;
        emit16<Combine::MulSub>(lo128(q[s]), ds, ms, out);
        emit16<Combine::MulSub>(hi128(q[s]), ds, ms, out + 16);
      }
    }
  }
}

void dequantize_row_q6_k_x86(const void* src, float* dst, int64_t n) {
  const BlockQ6K* b = static_cast<const BlockQ6K*>(src);
  for (int64_t i = 0; i < n / kQK_K; ++i, dst += kQK_K) {
    const float d = _cvtsh_ss(b[i].d);
    for (int h = 0; h < 2; ++h) {
      const __m256i A = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b[i].ql + 64 * h));
      const __m256i B = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b[i].ql + 64 * h + 32));
      const __m256i H = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b[i].qh + 32 * h));
      const __m256i nib[4] = {_mm256_and_si256(A, bytes8(0x0f)), _mm256_and_si256(B, bytes8(0x0f)),
                              _mm256_and_si256(_mm256_srli_epi16(A, 4), bytes8(0x0f)),
                              _mm256_and_si256(_mm256_srli_epi16(B, 4), bytes8(0x0f))};
      for (int k = 0; k < 4; ++k) {
        const __m256i hi = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(H, 2 * k), bytes8(3)), 4);
        const __m256i q = _mm256_sub_epi8(_mm256_or_si256(nib[k], hi), bytes8(32));
        const int g = 8 * h + 2 * k;
        float* out = dst + 128 * h + 32 * k;
        emit16<Combine::Mul>(lo128(q), d * static_cast<float>(b[i].scales[g]), 0.0f, out);
        emit16<Combine::Mul>(hi128(q), d * static_cast<float>(b[i].scales[g + 1]), 0.0f, out + 16);
      }
    }
  }
}

// Q5_0 / Q5_1: unpack5 (q5_x86.hpp) gives the 32 quants 0..31 in element order.
void dequantize_row_q5_0_x86(const void* src, float* dst, int64_t n) {
  const BlockQ5_0* b = static_cast<const BlockQ5_0*>(src);
  for (int64_t i = 0; i < n / 32; ++i) {
    const __m256i q = _mm256_sub_epi8(unpack5(b[i].qs, b[i].qh), bytes8(16));
    const float d = _cvtsh_ss(b[i].d);
    emit16<Combine::Mul>(lo128(q), d, 0.0f, dst + 32 * i);
    emit16<Combine::Mul>(hi128(q), d, 0.0f, dst + 32 * i + 16);
  }
}

void dequantize_row_q5_1_x86(const void* src, float* dst, int64_t n) {
  const BlockQ5_1* b = static_cast<const BlockQ5_1*>(src);
  for (int64_t i = 0; i < n / 32; ++i) {
    const __m256i q = unpack5(b[i].qs, b[i].qh);
    const float d = _cvtsh_ss(b[i].d), m = _cvtsh_ss(b[i].m);
    emit16<Combine::MulAdd>(lo128(q), d, m, dst + 32 * i);
    emit16<Combine::MulAdd>(hi128(q), d, m, dst + 32 * i + 16);
  }
}

}  // namespace
}  // namespace colibri
