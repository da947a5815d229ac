// AVX2 + FMA + F16C kernels (compiled with -mavx2 -mfma -mf16c -mbmi2, run only when the
// CPU has them; see dispatch.cpp). Scalar reference: quant/reference.cpp.
//
// What is bit-exact with the reference and what is not:
//  - dequantize_row and the activation quantizers (Q8_0, Q8_1) produce identical bits:
//    same IEEE operations in the same order, no fused multiply-add (contraction is off for
//    this file; FMA appears only where written as an intrinsic);
//  - vec_dot keeps exact integer sums per block but adds the per-block float terms in a
//    different order (8 lanes, two accumulators), so it agrees to rounding only.
// Everything here has internal linkage (anonymous namespace) so no inline function
// compiled with AVX2 flags can be picked by the linker for a scalar caller.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "quant/block32_dot_x86.hpp"
#include "quant/blocks.hpp"
#include "quant/dot_tiles.hpp"
#include "quant/float_act.hpp"
#include "quant/fp16.hpp"
#include "quant/group_prefetch.hpp"
#include "quant/reference.hpp"
#include "quant/row_groups.hpp"

namespace colibri {
namespace {

inline uint16_t load_u16(const void* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline int32_t load_i32(const void* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline float half_at(const void* p) { return _cvtsh_ss(load_u16(p)); }

inline float hsum_ps(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline int32_t hsum_epi32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
  return _mm_cvtsi128_si32(s);
}

// 16 bytes of packed nibbles -> 32 bytes 0..15: low nibbles first (elements 0..15), then
// high nibbles (elements 16..31), the GGUF element order.
inline __m256i unpack_nibbles(const uint8_t* qs) {
  const __m128i t = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m256i both = _mm256_inserti128_si256(_mm256_castsi128_si256(t), _mm_srli_epi16(t, 4), 1);
  return _mm256_and_si256(both, _mm256_set1_epi8(0x0f));
}

inline __m256i load256(const void* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

// Sum of u[i] * s[i] over each group of 4 bytes -> 8 int32 lanes. maddubs saturates int16,
// but u <= 15 (nibbles) or u <= 128 (|int8|) times |s| <= 127, twice, stays below 32767.
inline __m256i dot_u8_i8(__m256i u, __m256i s) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

// ---- activation quantizers (bit-identical to ref::quantize_row_q8_0 / q8_1) -----------

// roundf semantics (half away from zero) on v already in [-128, 127]; NaN -> 0.
inline __m256i round_to_epi32(__m256 v) {
  v = _mm256_and_ps(v, _mm256_cmp_ps(v, v, _CMP_ORD_Q));
  v = _mm256_min_ps(_mm256_max_ps(v, _mm256_set1_ps(-128.0f)), _mm256_set1_ps(127.0f));
  const __m256 sign = _mm256_and_ps(v, _mm256_set1_ps(-0.0f));
  const __m256 a = _mm256_xor_ps(v, sign);
  __m256 t = _mm256_round_ps(a, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  const __m256 up = _mm256_cmp_ps(_mm256_sub_ps(a, t), _mm256_set1_ps(0.5f), _CMP_GE_OQ);
  t = _mm256_add_ps(t, _mm256_and_ps(up, _mm256_set1_ps(1.0f)));
  return _mm256_cvtps_epi32(_mm256_or_ps(t, sign));
}

// Quantizes 32 floats with scale 1/d into qs; returns the sum of the quantized values.
inline int32_t quantize_block_q8(const float* x, int8_t* qs, float* d_out) {
  __m256 v[4];
  __m256 amax = _mm256_setzero_ps();
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  for (int k = 0; k < 4; ++k) {
    v[k] = _mm256_loadu_ps(x + 8 * k);
    amax = _mm256_max_ps(amax, _mm256_and_ps(v[k], abs_mask));
  }
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  const float d = _mm_cvtss_f32(m) / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  const __m256 vid = _mm256_set1_ps(id);
  __m256i q[4];
  for (int k = 0; k < 4; ++k) q[k] = round_to_epi32(_mm256_mul_ps(v[k], vid));
  const int32_t sum = hsum_epi32(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])));
  // packs interleave 128-bit lanes; the permute restores element order.
  const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(qs),
                      _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  *d_out = d;
  return sum;
}

void quantize_row_q8_0(const float* src, void* dst, int64_t n) {
  BlockQ8_0* b = static_cast<BlockQ8_0*>(dst);
  for (int64_t i = 0; i < n / kQK; ++i) {
    float d;
    quantize_block_q8(src + i * kQK, b[i].qs, &d);
    b[i].d = fp32_to_fp16(d);
  }
}

void quantize_row_q8_1(const float* src, void* dst, int64_t n) {
  BlockQ8_1* b = static_cast<BlockQ8_1*>(dst);
  for (int64_t i = 0; i < n / kQK; ++i) {
    float d;
    const int32_t sum = quantize_block_q8(src + i * kQK, b[i].qs, &d);
    b[i].d = fp32_to_fp16(d);
    b[i].s = fp32_to_fp16(static_cast<float>(sum) * d);
  }
}

// ---- dequantize (bit-identical to the reference) ---------------------------------------

void dequantize_row_f16(const void* src, float* dst, int64_t n) {
  const uint16_t* h = static_cast<const uint16_t*>(src);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i))));
  for (; i < n; ++i) dst[i] = fp16_to_fp32(h[i]);
}

inline __m256 bf16x8_to_ps(const uint16_t* p) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16));
}

void dequantize_row_bf16(const void* src, float* dst, int64_t n) {
  const uint16_t* h = static_cast<const uint16_t*>(src);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, bf16x8_to_ps(h + i));
  for (; i < n; ++i) dst[i] = bf16_to_fp32(h[i]);
}

// 32 int8 (in a ymm) times d -> 32 floats.
inline void store_scaled_i8(__m256i q, __m256 d, float* dst) {
  const __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
  const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
  for (int k = 0; k < 4; ++k)
    _mm256_storeu_ps(dst + 8 * k, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(parts[k])), d));
}

void dequantize_row_q4_0(const void* src, float* dst, int64_t n) {
  const BlockQ4_0* b = static_cast<const BlockQ4_0*>(src);
  for (int64_t i = 0; i < n / kQK; ++i) {
    const __m256i q = _mm256_sub_epi8(unpack_nibbles(b[i].qs), _mm256_set1_epi8(8));
    store_scaled_i8(q, _mm256_set1_ps(half_at(&b[i].d)), dst + i * kQK);
  }
}

void dequantize_row_q4_1(const void* src, float* dst, int64_t n) {
  const BlockQ4_1* b = static_cast<const BlockQ4_1*>(src);
  for (int64_t i = 0; i < n / kQK; ++i) {
    const __m256i q = unpack_nibbles(b[i].qs);
    const __m256 d = _mm256_set1_ps(half_at(&b[i].d)), m = _mm256_set1_ps(half_at(&b[i].m));
    const __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
    const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
    for (int k = 0; k < 4; ++k) {  // q * d + m, rounded twice like the reference
      const __m256 f = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(parts[k]));
      _mm256_storeu_ps(dst + i * kQK + 8 * k, _mm256_add_ps(_mm256_mul_ps(f, d), m));
    }
  }
}

void dequantize_row_q8_0(const void* src, float* dst, int64_t n) {
  const BlockQ8_0* b = static_cast<const BlockQ8_0*>(src);
  for (int64_t i = 0; i < n / kQK; ++i)
    store_scaled_i8(load256(b[i].qs), _mm256_set1_ps(half_at(&b[i].d)), dst + i * kQK);
}

void dequantize_row_q8_1(const void* src, float* dst, int64_t n) {
  const BlockQ8_1* b = static_cast<const BlockQ8_1*>(src);
  for (int64_t i = 0; i < n / kQK; ++i)
    store_scaled_i8(load256(b[i].qs), _mm256_set1_ps(half_at(&b[i].d)), dst + i * kQK);
}

// ---- float dot products (weights F32/F16/BF16, activation F32) --------------------------

// Four accumulators hide the FMA latency; the scalar tail is added last.
template <typename LoadVec, typename LoadOne>
inline float dot_float(int64_t n, const float* x, LoadVec load8, LoadOne load1) {
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  int64_t i = 0;
  for (; i + 32 <= n; i += 32)
    for (int k = 0; k < 4; ++k)
      acc[k] = _mm256_fmadd_ps(load8(i + 8 * k), _mm256_loadu_ps(x + i + 8 * k), acc[k]);
  for (; i + 8 <= n; i += 8) acc[0] = _mm256_fmadd_ps(load8(i), _mm256_loadu_ps(x + i), acc[0]);
  float sum = hsum_ps(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
  for (; i < n; ++i) sum += load1(i) * x[i];
  return sum;
}

float vec_dot_f32(int64_t n, const void* w, const void* x) {
  const float* a = static_cast<const float*>(w);
  return dot_float(
      n, static_cast<const float*>(x), [a](int64_t i) { return _mm256_loadu_ps(a + i); },
      [a](int64_t i) { return a[i]; });
}

// F32 prefill tile: one row x T tokens a pass, each (row, token) pair with dot_float's four
// accumulators, its 8-wide loop and its scalar tail, so a pair equals vec_dot_f32 bit for
// bit. 3 tokens hold 12 of the 16 registers and load 4 vectors per 3 FMAs (vec_dot: 2 per
// FMA), which is what the float-activation path (quant/float_act.cpp) spends a prefill on.
template <int T>
void f32_block(int64_t n, const float* w, const float* x, std::size_t xs, float* out, std::size_t os) {
  __m256 acc[T][4];
  for (int t = 0; t < T; ++t)
    for (int k = 0; k < 4; ++k) acc[t][k] = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32)
    for (int k = 0; k < 4; ++k) {
      const __m256 wv = _mm256_loadu_ps(w + i + 8 * k);
      for (int t = 0; t < T; ++t) acc[t][k] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + t * xs + i + 8 * k), acc[t][k]);
    }
  for (; i + 8 <= n; i += 8)
    for (int t = 0; t < T; ++t) acc[t][0] = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(x + t * xs + i), acc[t][0]);
  for (int t = 0; t < T; ++t) {
    const float* xt = x + t * xs;
    float sum = hsum_ps(_mm256_add_ps(_mm256_add_ps(acc[t][0], acc[t][1]), _mm256_add_ps(acc[t][2], acc[t][3])));
    for (int64_t j = i; j < n; ++j) sum += w[j] * xt[j];
    out[t * os] = sum;
  }
}

void f32_tile(int64_t n, const void* w, std::size_t w_stride, int64_t nrows, const void* act,
              std::size_t act_stride, int64_t ntok, float* out, std::size_t out_stride) {
  const auto* xf = static_cast<const float*>(act);
  const std::size_t xs = act_stride / sizeof(float);
  for (int64_t r = 0; r < nrows; ++r) {
    const float* wr = static_cast<const float*>(w) + r * (w_stride / sizeof(float));
    int64_t t = 0;
    for (; t + 3 <= ntok; t += 3) f32_block<3>(n, wr, xf + t * xs, xs, out + t * out_stride + r, out_stride);
    if (ntok - t == 2) f32_block<2>(n, wr, xf + t * xs, xs, out + t * out_stride + r, out_stride);
    if (ntok - t == 1) f32_block<1>(n, wr, xf + t * xs, xs, out + t * out_stride + r, out_stride);
  }
}

// ---- float-activation dots (quant/float_act.hpp) -----------------------------------------
// dot_float over weights dequantized 8 at a time in registers, with the operations of
// dequantize_row_* above, so each equals vec_dot_f32 of the dequantized row bit for bit.
// The 32-element types only (rows are whole blocks: no scalar tail).

// Elements [o, o + 8) of a Q4 block (o a multiple of 8): low nibbles below 16, high above.
inline __m128i q4_eight(const uint8_t* qs, int64_t o) {
  const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs + o % 16));
  return _mm_and_si128(o >= 16 ? _mm_srli_epi16(q, 4) : q, _mm_set1_epi8(0x0F));
}

inline float q4_one(const uint8_t* qs, int64_t o) { return static_cast<float>(o >= 16 ? qs[o - 16] >> 4 : qs[o] & 0x0F); }

float float_act_dot_q4_0(int64_t n, const void* w, const void* x) {
  const BlockQ4_0* b = static_cast<const BlockQ4_0*>(w);
  return dot_float(
      n, static_cast<const float*>(x),
      [b](int64_t i) {
        const BlockQ4_0& blk = b[i / kQK];
        const __m128i q = _mm_sub_epi8(q4_eight(blk.qs, i % kQK), _mm_set1_epi8(8));
        return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), _mm256_set1_ps(half_at(&blk.d)));
      },
      [b](int64_t i) { return (q4_one(b[i / kQK].qs, i % kQK) - 8.0f) * half_at(&b[i / kQK].d); });
}

float float_act_dot_q4_1(int64_t n, const void* w, const void* x) {
  const BlockQ4_1* b = static_cast<const BlockQ4_1*>(w);
  return dot_float(
      n, static_cast<const float*>(x),
      [b](int64_t i) {
        const BlockQ4_1& blk = b[i / kQK];
        const __m256 f = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(q4_eight(blk.qs, i % kQK)));
        return _mm256_add_ps(_mm256_mul_ps(f, _mm256_set1_ps(half_at(&blk.d))), _mm256_set1_ps(half_at(&blk.m)));
      },
      [b](int64_t i) { return q4_one(b[i / kQK].qs, i % kQK) * half_at(&b[i / kQK].d) + half_at(&b[i / kQK].m); });
}

float float_act_dot_q8_0(int64_t n, const void* w, const void* x) {
  const BlockQ8_0* b = static_cast<const BlockQ8_0*>(w);
  return dot_float(
      n, static_cast<const float*>(x),
      [b](int64_t i) {
        const BlockQ8_0& blk = b[i / kQK];
        const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk.qs + i % kQK));
        return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), _mm256_set1_ps(half_at(&blk.d)));
      },
      [b](int64_t i) { return static_cast<float>(b[i / kQK].qs[i % kQK]) * half_at(&b[i / kQK].d); });
}

const FloatActDot kFloatActDots[] = {
    {DType::Q4_0, vec_dot_f32, float_act_dot_q4_0},
    {DType::Q4_1, vec_dot_f32, float_act_dot_q4_1},
    {DType::Q8_0, vec_dot_f32, float_act_dot_q8_0},
    {DType::F32, nullptr, nullptr},
};

float vec_dot_f16(int64_t n, const void* w, const void* x) {
  const uint16_t* a = static_cast<const uint16_t*>(w);
  return dot_float(
      n, static_cast<const float*>(x),
      [a](int64_t i) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + i))); },
      [a](int64_t i) { return fp16_to_fp32(a[i]); });
}

float vec_dot_bf16(int64_t n, const void* w, const void* x) {
  const uint16_t* a = static_cast<const uint16_t*>(w);
  return dot_float(
      n, static_cast<const float*>(x), [a](int64_t i) { return bf16x8_to_ps(a + i); },
      [a](int64_t i) { return bf16_to_fp32(a[i]); });
}

// ---- block dot products -----------------------------------------------------------------
// Per block and row: exact int32 partial sums in 8 lanes, converted to float and accumulated
// with the block's scale d_w * d_a. K::rows<NR> runs NR weight rows against one activation,
// loading (and converting the scale of) each activation block once per NR rows. Each row has
// its own accumulator and the same operations in the same order for any NR, so
// vec_dot_rows is bit-identical to vec_dot; NR = 4 gives 4 independent FMA chains.

// Half-precision pair at p (lanes 0, 1) as floats; lanes 2, 3 are zero.
inline __m128 half2_at(const void* p) { return _mm_cvtph_ps(_mm_cvtsi32_si128(load_i32(p))); }

// Software prefetch of the rows that come next: GroupPrefetch (quant/group_prefetch.hpp).

// Q4_0 . Q8_0 (d (q - 8) a) and Q4_1 . Q8_1 (d q a + m s): the kernels of
// block32_dot_x86.hpp with the nibble unpack (Q5_0 / Q5_1 are the same with five bits).
// int16 range of Q4_0: |q a pair| <= 3810, |8 a pair| <= 2032.
template <class B>
struct UnpackNibbles : block32::PlainLanes {
  using Block = B;
  static __m256i quants(const Block& x) { return unpack_nibbles(x.qs); }
};
struct Maddubs {
  static __m256i dot_u8_i8(__m256i u, __m256i s) { return colibri::dot_u8_i8(u, s); }
};
using Q4_0 = block32::Symmetric<UnpackNibbles<BlockQ4_0>, 8>;
using Q4_1 = block32::WithMin<UnpackNibbles<BlockQ4_1>, Maddubs>;

// Q8_0 . Q8_0: signed x signed as |w| (unsigned) times a carrying w's sign.
struct Q8_0 {
  using Act = BlockQ8_0;
  template <int NR>
  static void rows(int64_t nb, const unsigned char* w, std::size_t stride, const Act* y, float* out) {
    __m256 acc[NR];
    for (int r = 0; r < NR; ++r) acc[r] = _mm256_setzero_ps();
    GroupPrefetch pf(w, stride, NR, nb);
    for (int64_t i = 0; i < nb; ++i) {
      pf.step();
      const __m256i a = load256(y[i].qs);
      const __m128 da = half2_at(&y[i].d);
      for (int r = 0; r < NR; ++r) {
        const BlockQ8_0* x = reinterpret_cast<const BlockQ8_0*>(w + r * stride) + i;
        const __m256i q = load256(x->qs);
        const __m256i p = dot_u8_i8(_mm256_sign_epi8(q, q), _mm256_sign_epi8(a, q));
        const __m256 d = _mm256_broadcastss_ps(_mm_mul_ps(half2_at(&x->d), da));
        acc[r] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc[r]);
      }
    }
    for (int r = 0; r < NR; ++r) out[r] = hsum_ps(acc[r]);
  }
  // R rows x T tokens (dot_tiles::tile_loop): |w| and d_w once per row and block.
  using Block = BlockQ8_0;
  struct Row {
    __m256i q, aq;
    __m128 d;
  };
  struct Token {
    __m256i a;
    __m128 d;
  };
  using Acc = __m256;
  static Row row(const Block& x) {
    const __m256i q = load256(x.qs);
    return {q, _mm256_sign_epi8(q, q), half2_at(&x.d)};
  }
  static Token token(const Act& y) { return {load256(y.qs), half2_at(&y.d)}; }
  static Acc zero() { return _mm256_setzero_ps(); }
  static void madd(const Row& x, const Token& y, Acc& acc) {
    const __m256i p = dot_u8_i8(x.aq, _mm256_sign_epi8(y.a, x.q));
    const __m256 d = _mm256_broadcastss_ps(_mm_mul_ps(x.d, y.d));
    acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc);
  }
  static float sum(const Acc& acc) { return hsum_ps(acc); }
  template <int R, int T>
  static void tile(int64_t nb, const unsigned char* w, std::size_t ws, const unsigned char* act, std::size_t as,
                   float* out, std::size_t os) {
    dot_tiles::tile_loop<Q8_0, R, T>(nb, w, ws, act, as, out, os);
  }
};

template <class K>
constexpr VecDotRowsFn vec_dot_rows = row_groups::vec_dot_rows<K, 4, kGroupPrefetchAhead>;
using row_groups::rows_each;
using row_groups::vec_dot;

const TypeKernels kAvx2[] = {
    {DType::F32, DType::F32, ref::dequantize_row_f32, ref::quantize_row_f32, vec_dot_f32, ref::quantize_row_f32,
     rows_each<vec_dot_f32>},
    {DType::F16, DType::F32, dequantize_row_f16, ref::quantize_row_f16, vec_dot_f16, ref::quantize_row_f32,
     rows_each<vec_dot_f16>},
    {DType::BF16, DType::F32, dequantize_row_bf16, ref::quantize_row_bf16, vec_dot_bf16, ref::quantize_row_f32,
     rows_each<vec_dot_bf16>},
    {DType::Q4_0, DType::Q8_0, dequantize_row_q4_0, ref::quantize_row_q4_0, vec_dot<Q4_0>, quantize_row_q8_0,
     vec_dot_rows<Q4_0>},
    {DType::Q4_1, DType::Q8_1, dequantize_row_q4_1, ref::quantize_row_q4_1, vec_dot<Q4_1>, quantize_row_q8_1,
     vec_dot_rows<Q4_1>},
    {DType::Q8_0, DType::Q8_0, dequantize_row_q8_0, quantize_row_q8_0, vec_dot<Q8_0>, quantize_row_q8_0,
     vec_dot_rows<Q8_0>},
    {DType::Q8_1, DType::Q8_1, dequantize_row_q8_1, quantize_row_q8_1, nullptr, quantize_row_q8_1, nullptr},
};

// Prefill tiles (dot_tiles.hpp), each reproducing its vec_dot above bit for bit: 2 rows x
// 4 tokens, as for Q5_0 / Q5_1 (8 accumulators; Q4_1's offsets add 8 xmm registers).
constexpr int kTileRows = 2, kTileTokens = 4;
const DotTile kTiles[] = {
    {vec_dot_f32, f32_tile},
    {vec_dot<Q4_0>, dot_tiles::run<Q4_0, kTileRows, kTileTokens, row_groups::kBlock>},
    {vec_dot<Q4_1>, dot_tiles::run<Q4_1, kTileRows, kTileTokens, row_groups::kBlock>},
    {vec_dot<Q8_0>, dot_tiles::run<Q8_0, kTileRows, kTileTokens, row_groups::kBlock>},
    {nullptr, nullptr},
};

}  // namespace

const DotTile* basic_avx2_tiles() { return kTiles; }

const FloatActDot* float_act_dots_avx2() { return kFloatActDots; }

const TypeKernels* avx2_kernels(DType type) {
  for (const TypeKernels& k : kAvx2)
    if (k.type == type) return &k;
  return nullptr;
}

}  // namespace colibri
