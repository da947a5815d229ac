// AVX-512 (F/BW/VL/DQ) + VNNI kernels, run only where dispatch.cpp found those features.
// Scalar reference: quant/reference.cpp; same exactness rules as kernels_avx2.cpp:
// dequantize_row and the activation quantizers are bit-identical to the reference, vec_dot
// agrees to rounding (exact integer block sums, float accumulation in another order), except
// Q4_1 and Q8_0, whose row-lane kernels (lanes::) repeat the reference's float operations
// and are bit-identical to it.
//
// Block dots use 256-bit VNNI (vpdpbusd on ymm, from AVX512-VL): one instruction replaces
// AVX2's maddubs + madd pair. Float kernels use full 512-bit vectors.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstring>
#include <utility>
#include <vector>

#include "common/unroll.hpp"
#include "quant/blocks.hpp"
#include "quant/dot_tiles.hpp"
#include "quant/float_act.hpp"
#include "quant/fp16.hpp"
#include "quant/group_prefetch.hpp"
#include "quant/lane_pack.hpp"
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

inline float hsum512(__m512 v) {
  return hsum_ps(_mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1)));
}

inline __m256i load256(const void* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

// 16 bytes of packed nibbles -> 32 bytes in GGUF element order (low nibbles, then high).
inline __m256i unpack_nibbles(const uint8_t* qs) {
  const __m128i t = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m256i both = _mm256_inserti128_si256(_mm256_castsi128_si256(t), _mm_srli_epi16(t, 4), 1);
  return _mm256_and_si256(both, _mm256_set1_epi8(0x0f));
}

// u8 x s8 products summed per 4 bytes into 8 int32 lanes (no saturation in VNNI).
inline __m256i dot_u8_i8(__m256i u, __m256i s) { return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s); }

// ---- activation quantizers (bit-identical to ref::quantize_row_q8_0 / q8_1) -----------

// roundf semantics (half away from zero), NaN -> 0, saturated to [-128, 127].
inline __m512i round_to_epi32(__m512 v) {
  v = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(v, v, _CMP_ORD_Q), v);
  v = _mm512_min_ps(_mm512_max_ps(v, _mm512_set1_ps(-128.0f)), _mm512_set1_ps(127.0f));
  const __m512 a = _mm512_abs_ps(v);
  __m512 t = _mm512_roundscale_ps(a, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  const __mmask16 up = _mm512_cmp_ps_mask(_mm512_sub_ps(a, t), _mm512_set1_ps(0.5f), _CMP_GE_OQ);
  t = _mm512_mask_add_ps(t, up, t, _mm512_set1_ps(1.0f));
  const __m512i sign = _mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(INT32_MIN));
  return _mm512_cvtps_epi32(_mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(t), sign)));
}

// Quantizes 32 floats into qs; returns the sum of the quantized values, d via d_out.
inline int32_t quantize_block_q8(const float* x, int8_t* qs, float* d_out) {
  const __m512 v0 = _mm512_loadu_ps(x), v1 = _mm512_loadu_ps(x + 16);
  const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  const __m512 vid = _mm512_set1_ps(id);
  const __m512i q0 = round_to_epi32(_mm512_mul_ps(v0, vid));
  const __m512i q1 = round_to_epi32(_mm512_mul_ps(v1, vid));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(qs), _mm512_cvtsepi32_epi8(q0));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(qs + 16), _mm512_cvtsepi32_epi8(q1));
  *d_out = d;
  return _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
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
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(load256(h + i)));
  for (; i < n; ++i) dst[i] = fp16_to_fp32(h[i]);
}

inline __m512 bf16x16_to_ps(const uint16_t* p) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(load256(p)), 16));
}

void dequantize_row_bf16(const void* src, float* dst, int64_t n) {
  const uint16_t* h = static_cast<const uint16_t*>(src);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, bf16x16_to_ps(h + i));
  for (; i < n; ++i) dst[i] = bf16_to_fp32(h[i]);
}

// 32 signed bytes times d -> 32 floats.
inline void store_scaled_i8(__m256i q, __m512 d, float* dst) {
  _mm512_storeu_ps(dst, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(q))), d));
  _mm512_storeu_ps(dst + 16,
                   _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(q, 1))), d));
}

void dequantize_row_q4_0(const void* src, float* dst, int64_t n) {
  const BlockQ4_0* b = static_cast<const BlockQ4_0*>(src);
  for (int64_t i = 0; i < n / kQK; ++i) {
    const __m256i q = _mm256_sub_epi8(unpack_nibbles(b[i].qs), _mm256_set1_epi8(8));
    store_scaled_i8(q, _mm512_set1_ps(half_at(&b[i].d)), dst + i * kQK);
  }
}

void dequantize_row_q4_1(const void* src, float* dst, int64_t n) {
  const BlockQ4_1* b = static_cast<const BlockQ4_1*>(src);
  for (int64_t i = 0; i < n / kQK; ++i) {
    const __m256i q = unpack_nibbles(b[i].qs);
    const __m512 d = _mm512_set1_ps(half_at(&b[i].d)), m = _mm512_set1_ps(half_at(&b[i].m));
    const __m128i halves[2] = {_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1)};
    for (int k = 0; k < 2; ++k) {  // q * d + m, rounded twice like the reference
      const __m512 f = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(halves[k]));
      _mm512_storeu_ps(dst + i * kQK + 16 * k, _mm512_add_ps(_mm512_mul_ps(f, d), m));
    }
  }
}

void dequantize_row_q8_0(const void* src, float* dst, int64_t n) {
  const BlockQ8_0* b = static_cast<const BlockQ8_0*>(src);
  for (int64_t i = 0; i < n / kQK; ++i)
    store_scaled_i8(load256(b[i].qs), _mm512_set1_ps(half_at(&b[i].d)), dst + i * kQK);
}

void dequantize_row_q8_1(const void* src, float* dst, int64_t n) {
  const BlockQ8_1* b = static_cast<const BlockQ8_1*>(src);
  for (int64_t i = 0; i < n / kQK; ++i)
    store_scaled_i8(load256(b[i].qs), _mm512_set1_ps(half_at(&b[i].d)), dst + i * kQK);
}

// ---- float dot products (weights F32/F16/BF16, activation F32) --------------------------

// Four 16-wide accumulators; the ragged end is a masked load (zeros add nothing).
template <typename Load16>
inline float dot_float(int64_t n, const float* x, Load16 load) {
  __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  int64_t i = 0;
  for (; i + 64 <= n; i += 64)
    for (int k = 0; k < 4; ++k)
      acc[k] = _mm512_fmadd_ps(load(i + 16 * k, 0xffff), _mm512_loadu_ps(x + i + 16 * k), acc[k]);
  for (; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? 0xffff : static_cast<__mmask16>((1u << (n - i)) - 1);
    acc[0] = _mm512_fmadd_ps(load(i, m), _mm512_maskz_loadu_ps(m, x + i), acc[0]);
  }
  return hsum512(_mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])));
}

float vec_dot_f32(int64_t n, const void* w, const void* x) {
  const float* a = static_cast<const float*>(w);
  return dot_float(n, static_cast<const float*>(x),
                   [a](int64_t i, __mmask16 m) { return _mm512_maskz_loadu_ps(m, a + i); });
}

// F32 prefill tile: R rows x T tokens a pass, each (row, token) pair with dot_float's four
// accumulators and its order of operations, so a pair equals vec_dot_f32 bit for bit. 2 x 3
// pairs hold 24 of the 32 registers and load 5 vectors per 6 FMAs (vec_dot: 2 per FMA),
// which is what the float-activation path (quant/float_act.cpp) spends a prefill on.
template <int R, int T>
void f32_block(int64_t n, const float* w, std::size_t ws, const float* x, std::size_t xs, float* out,
               std::size_t os) {
  __m512 acc[R][T][4];
  for (auto& row : acc)
    for (auto& pair : row)
      for (__m512& a : pair) a = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 64 <= n; i += 64)
    COLIBRI_UNROLL
    for (int k = 0; k < 4; ++k) {
      __m512 wv[R], xv[T];
      COLIBRI_UNROLL
      for (int r = 0; r < R; ++r) wv[r] = _mm512_loadu_ps(w + r * ws + i + 16 * k);
      COLIBRI_UNROLL
      for (int t = 0; t < T; ++t) xv[t] = _mm512_loadu_ps(x + t * xs + i + 16 * k);
      COLIBRI_UNROLL
      for (int r = 0; r < R; ++r)
        COLIBRI_UNROLL
        for (int t = 0; t < T; ++t) acc[r][t][k] = _mm512_fmadd_ps(wv[r], xv[t], acc[r][t][k]);
    }
  for (; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? 0xffff : static_cast<__mmask16>((1u << (n - i)) - 1);
    for (int r = 0; r < R; ++r)
      for (int t = 0; t < T; ++t)
        acc[r][t][0] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, w + r * ws + i),
                                       _mm512_maskz_loadu_ps(m, x + t * xs + i), acc[r][t][0]);
  }
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t)
      out[t * os + r] = hsum512(_mm512_add_ps(_mm512_add_ps(acc[r][t][0], acc[r][t][1]),
                                              _mm512_add_ps(acc[r][t][2], acc[r][t][3])));
}

template <int R>
void f32_row_block(int64_t n, const float* w, std::size_t ws, const float* x, std::size_t xs, int64_t ntok,
                   float* out, std::size_t os) {
  int64_t t = 0;
  for (; t + 3 <= ntok; t += 3) f32_block<R, 3>(n, w, ws, x + t * xs, xs, out + t * os, os);
  if (ntok - t == 2) f32_block<R, 2>(n, w, ws, x + t * xs, xs, out + t * os, os);
  if (ntok - t == 1) f32_block<R, 1>(n, w, ws, x + t * xs, xs, out + t * os, os);
}

void f32_tile(int64_t n, const void* w, std::size_t w_stride, int64_t nrows, const void* act,
              std::size_t act_stride, int64_t ntok, float* out, std::size_t out_stride) {
  const auto* wf = static_cast<const float*>(w);
  const auto* xf = static_cast<const float*>(act);
  const std::size_t ws = w_stride / sizeof(float), xs = act_stride / sizeof(float);
  int64_t r = 0;
  for (; r + 2 <= nrows; r += 2) f32_row_block<2>(n, wf + r * ws, ws, xf, xs, ntok, out + r, out_stride);
  if (r < nrows) f32_row_block<1>(n, wf + r * ws, ws, xf, xs, ntok, out + r, out_stride);
}

// ---- float-activation dots (quant/float_act.hpp) -----------------------------------------
// dot_float over weights dequantized 16 at a time in registers, with the operations of
// dequantize_row_* above, so each equals vec_dot_f32 of the dequantized row bit for bit.
// The 32-element types only (rows are whole blocks, so every load is a full 16).

// Elements [16h, 16h + 16) of a Q4 block: the low nibbles of qs for h = 0, the high for 1.
inline __m128i q4_half(const uint8_t* qs, int64_t h) {
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  return _mm_and_si128(h ? _mm_srli_epi16(q, 4) : q, _mm_set1_epi8(0x0F));
}

float float_act_dot_q4_0(int64_t n, const void* w, const void* x) {
  const BlockQ4_0* b = static_cast<const BlockQ4_0*>(w);
  return dot_float(n, static_cast<const float*>(x), [b](int64_t i, __mmask16) {
    const BlockQ4_0& blk = b[i / kQK];
    const __m128i q = _mm_sub_epi8(q4_half(blk.qs, (i % kQK) / 16), _mm_set1_epi8(8));
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)), _mm512_set1_ps(half_at(&blk.d)));
  });
}

float float_act_dot_q4_1(int64_t n, const void* w, const void* x) {
  const BlockQ4_1* b = static_cast<const BlockQ4_1*>(w);
  return dot_float(n, static_cast<const float*>(x), [b](int64_t i, __mmask16) {
    const BlockQ4_1& blk = b[i / kQK];
    const __m512 f = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(q4_half(blk.qs, (i % kQK) / 16)));
    return _mm512_add_ps(_mm512_mul_ps(f, _mm512_set1_ps(half_at(&blk.d))), _mm512_set1_ps(half_at(&blk.m)));
  });
}

float float_act_dot_q8_0(int64_t n, const void* w, const void* x) {
  const BlockQ8_0* b = static_cast<const BlockQ8_0*>(w);
  return dot_float(n, static_cast<const float*>(x), [b](int64_t i, __mmask16) {
    const BlockQ8_0& blk = b[i / kQK];
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk.qs + i % kQK));
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)), _mm512_set1_ps(half_at(&blk.d)));
  });
}

const FloatActDot kFloatActDots[] = {
    {DType::Q4_0, vec_dot_f32, float_act_dot_q4_0},
    {DType::Q4_1, vec_dot_f32, float_act_dot_q4_1},
    {DType::Q8_0, vec_dot_f32, float_act_dot_q8_0},
    {DType::F32, nullptr, nullptr},
};

float vec_dot_f16(int64_t n, const void* w, const void* x) {
  const uint16_t* a = static_cast<const uint16_t*>(w);
  return dot_float(n, static_cast<const float*>(x), [a](int64_t i, __mmask16 m) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, a + i));
  });
}

float vec_dot_bf16(int64_t n, const void* w, const void* x) {
  const uint16_t* a = static_cast<const uint16_t*>(w);
  return dot_float(n, static_cast<const float*>(x), [a](int64_t i, __mmask16 m) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, a + i)), 16));
  });
}

// ---- block dot products -----------------------------------------------------------------
// Per block and row: exact int32 partial sums in 8 lanes, converted to float and accumulated
// with the block's scale d_w * d_a. The templates run NR weight rows against one activation
// so each activation block is loaded (and its scale converted) once per NR rows; every row
// has its own accumulator and sees the same operations in the same order for any NR, so
// vec_dot_rows is bit-identical to vec_dot. NR = 4 gives 4 independent FMA chains.

// Half-precision pair at p (lanes 0, 1) as floats; lanes 2, 3 are zero.
inline __m128 half2_at(const void* p) { return _mm_cvtph_ps(_mm_cvtsi32_si128(load_i32(p))); }

// Nibble blocks in one AND: the 16 packed bytes are broadcast to both halves of a ymm and
// masked to [low nibbles | high nibbles * 16]. VNNI products do not saturate, so the upper
// 4 int32 lanes just carry a factor 16 (exact: |16 * sum| < 2^24 converts to float exactly,
// and scaling by a power of two commutes with every later rounding); it is removed once at
// the end. This saves the shift and the lane insert of a full unpack.
inline __m256i nibbles_lo_hi16(const uint8_t* qs) {
  const __m256i q = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)));
  return _mm256_and_si256(q, _mm256_setr_epi64x(0x0f0f0f0f0f0f0f0f, 0x0f0f0f0f0f0f0f0f,
                                                static_cast<int64_t>(0xf0f0f0f0f0f0f0f0ull),
                                                static_cast<int64_t>(0xf0f0f0f0f0f0f0f0ull)));
}

// Horizontal sum of an accumulator whose lanes 4..7 carry the factor 16.
inline float hsum_lo_hi16(__m256 acc) {
  return hsum_ps(_mm256_mul_ps(acc, _mm256_setr_ps(1, 1, 1, 1, 0.0625f, 0.0625f, 0.0625f, 0.0625f)));
}

// Software prefetch of the rows that come next: GroupPrefetch (quant/group_prefetch.hpp).
// Measured on Zen 4 (16 KiB ahead, into L2): cold Q4_1/Q8_0 matvec 10-12 -> 20-29 GB/s
// per core.

// Q4_0 . Q8_0: sum (q - 8) a = sum q a - sum 8 a. The second term depends on the
// activation only: computed once per block (times 16 in the upper lanes, to match the
// nibbles) and used as the starting value of every row's VNNI accumulation.
struct Q4_0 {
  using Act = BlockQ8_0;
  template <int NR>
  static void rows(int64_t nb, const unsigned char* w, std::size_t stride, const Act* y, float* out) {
    __m256 acc[NR];
    COLIBRI_UNROLL
    for (int r = 0; r < NR; ++r) acc[r] = _mm256_setzero_ps();
    const __m256i eights = _mm256_setr_epi64x(0x0808080808080808, 0x0808080808080808,
                                              static_cast<int64_t>(0x8080808080808080ull),
                                              static_cast<int64_t>(0x8080808080808080ull));
    GroupPrefetch pf(w, stride, NR, nb);
    for (int64_t i = 0; i < nb; ++i) {
      pf.step();
      const __m256i a = load256(y[i].qs);
      const __m256i neg8a = _mm256_sub_epi32(_mm256_setzero_si256(), dot_u8_i8(eights, a));
      const __m128 da = half2_at(&y[i].d);  // lane 0 (lane 1 is the first quants: unused)
      COLIBRI_UNROLL
      for (int r = 0; r < NR; ++r) {
        const BlockQ4_0* x = reinterpret_cast<const BlockQ4_0*>(w + r * stride) + i;
        const __m256i p = _mm256_dpbusd_epi32(neg8a, nibbles_lo_hi16(x->qs), a);
        const __m256 d = _mm256_broadcastss_ps(_mm_mul_ps(half2_at(&x->d), da));
        acc[r] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc[r]);
      }
    }
    COLIBRI_UNROLL
    for (int r = 0; r < NR; ++r) out[r] = hsum_lo_hi16(acc[r]);
  }
  // R rows x T tokens (dot_tiles::tile_loop): each row's nibbles and each token's -8 a term
  // once per block for the whole tile. The scale d_w d_a is the product of the two broadcast
  // floats: lane for lane the float product rows<> broadcasts, so the bits are equal.
  using Block = BlockQ4_0;
  struct Row {
    __m256i q;
    __m256 d;
  };
  struct Token {
    __m256i a, neg8a;
    __m256 d;
  };
  using Acc = __m256;
  static Row row(const Block& x) { return {nibbles_lo_hi16(x.qs), _mm256_broadcastss_ps(half2_at(&x.d))}; }
  static Token token(const Act& y) {
    const __m256i eights = _mm256_setr_epi64x(0x0808080808080808, 0x0808080808080808,
                                              static_cast<int64_t>(0x8080808080808080ull),
                                              static_cast<int64_t>(0x8080808080808080ull));
    const __m256i a = load256(y.qs);
    return {a, _mm256_sub_epi32(_mm256_setzero_si256(), dot_u8_i8(eights, a)),
            _mm256_broadcastss_ps(half2_at(&y.d))};
  }
  static Acc zero() { return _mm256_setzero_ps(); }
  static void madd(const Row& x, const Token& y, Acc& acc) {
    const __m256i p = _mm256_dpbusd_epi32(y.neg8a, x.q, y.a);
    acc = _mm256_fmadd_ps(_mm256_mul_ps(x.d, y.d), _mm256_cvtepi32_ps(p), acc);
  }
  static float sum(const Acc& acc) { return hsum_lo_hi16(acc); }
  template <int R, int T>
  static void tile(int64_t nb, const unsigned char* w, std::size_t ws, const unsigned char* act, std::size_t as,
                   float* out, std::size_t os) {
    dot_tiles::tile_loop<Q4_0, R, T>(nb, w, ws, act, as, out, os);
  }
};

// ---- row-lane kernels: Q4_1 . Q8_1 and Q8_0 . Q8_0 ---------------------------------------
// Eight weight rows in the 8 int32 lanes of a ymm. Per block the 8 rows' quants are
// transposed (4 x 4 dword transposes in the two 128-bit halves), so that vector k holds in
// lane r row r's elements 4k .. 4k + 3; one VNNI dot against token t's activation bytes
// 4k .. 4k + 3, broadcast, adds those 4 products to every row's lane. Eight dots leave the
// 8 rows' exact integer block sums in one vector: no horizontal reduction, and the float
// work (convert, scale products, accumulate) is one op per 8 (row, token) pairs where the
// block-per-lane kernels spent a convert, a broadcast and an FMA per pair.
//
// Per lane the float operations are the scalar reference's (reference.cpp), in its order,
// every product and sum rounded where the reference rounds, the block terms summed in double
// (the 8 rows' sums in a zmm; ~15 % slower in isolation than a float running sum, which
// lost accuracy: docs/benchmarks-log.md, session 27) and rounded to float once:
//   Q4_1: sum = sum + double(fma(d_w d_a, isum, m s))   Q8_0: sum = sum + double((d_w d_a) isum)
// so vec_dot, vec_dot_rows and the prefill tiles are bit-identical to reference.cpp, hence
// to each other for any row grouping or batch (a short last group repeats its last row in
// the unused lanes and stores only its own). The transposition is per (8 rows, block) and
// shared by the tokens of a pass: ~35 + 15 T vector ops per 8 row-blocks for T tokens
// (the 2 x 8 Q4_1 tiles this replaces: ~40 T). Token scales (d_a, and s or Q8_0's offset
// term) are converted once per pass into a small array the loop reads as broadcasts.
namespace lanes {

// Rows r and r + 4 (r < 4) of a group, 16 bytes at byte offset off, in the two halves.
COLIBRI_FORCE_INLINE __m256i rows_pair(const unsigned char* const* rp, int r, std::size_t off) {
  return _mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(rp[r + 4] + off),
                             reinterpret_cast<const __m128i*>(rp[r] + off));
}

// 8 rows x 4 dwords at byte offset off -> out[k]: dword k of row r in lane r.
COLIBRI_FORCE_INLINE void transpose8x4(const unsigned char* const* rp, std::size_t off, __m256i* out) {
  const __m256i q0 = rows_pair(rp, 0, off), q1 = rows_pair(rp, 1, off);
  const __m256i q2 = rows_pair(rp, 2, off), q3 = rows_pair(rp, 3, off);
  const __m256i t0 = _mm256_unpacklo_epi32(q0, q1), t1 = _mm256_unpackhi_epi32(q0, q1);
  const __m256i t2 = _mm256_unpacklo_epi32(q2, q3), t3 = _mm256_unpackhi_epi32(q2, q3);
  out[0] = _mm256_unpacklo_epi64(t0, t2);
  out[1] = _mm256_unpackhi_epi64(t0, t2);
  out[2] = _mm256_unpacklo_epi64(t1, t3);
  out[3] = _mm256_unpackhi_epi64(t1, t3);
}

// The dword at byte offset off of each of the 8 rows (lane r).
COLIBRI_FORCE_INLINE __m256i first_dwords(const unsigned char* const* rp, std::size_t off) {
  const __m256i q0 = rows_pair(rp, 0, off), q1 = rows_pair(rp, 1, off);
  const __m256i q2 = rows_pair(rp, 2, off), q3 = rows_pair(rp, 3, off);
  return _mm256_unpacklo_epi64(_mm256_unpacklo_epi32(q0, q1), _mm256_unpacklo_epi32(q2, q3));
}

// A row-lane block's scale field at byte offset off (8 rows' halves) as floats.
COLIBRI_FORCE_INLINE __m256 lane_halves(const unsigned char* g, std::size_t off) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(g + off)));
}

// Halves in the low / high 16 bits of each lane as floats.
inline __m256 halves_lo(__m256i v) { return _mm256_cvtph_ps(_mm256_cvtepi32_epi16(v)); }
inline __m256 halves_hi(__m256i v) { return _mm256_cvtph_ps(_mm256_cvtepi32_epi16(_mm256_srli_epi32(v, 16))); }

// p + u . (the 4 bytes at a, broadcast): VNNI with an embedded-broadcast memory operand,
// written out because GCC 12 does not fold the broadcast into the instruction (it issues a
// separate vpbroadcastd per dot, which on Zen 4 competes with the dots for the vector pipes).
COLIBRI_FORCE_INLINE __m256i dot_bcast(__m256i p, __m256i u, const int8_t* a) {
#if defined(__GNUC__)
  using Dword = int32_t __attribute__((may_alias, aligned(1)));
  asm("vpdpbusd %2%{1to8%}, %1, %0" : "+v"(p) : "v"(u), "m"(*reinterpret_cast<const Dword*>(a)));
  return p;
#else
  return _mm256_dpbusd_epi32(p, u, _mm256_set1_epi32(load_i32(a)));
#endif
}

// The 8 lanes' block sums of C tokens at once: dots of the transposed quants q[0..7] with
// each token's 32 activation bytes a[c], starting from init[c]. The token loop is the inner
// one so that consecutive VNNI ops are independent (two chains of four per token up to 4
// tokens, else one of eight: the dots' latency, not their throughput, bounds a lone
// token's block).
template <int C>
COLIBRI_FORCE_INLINE void block_sums(const __m256i* q, const int8_t* const* a, __m256i* p) {
  constexpr int kChains = C <= 4 ? 2 : 1;
  if constexpr (kChains == 2) {
    __m256i h[C];
    COLIBRI_UNROLL
    for (int c = 0; c < C; ++c) h[c] = _mm256_setzero_si256();
    COLIBRI_UNROLL
    for (int k = 0; k < 4; ++k)
      COLIBRI_UNROLL
      for (int c = 0; c < C; ++c) {
        p[c] = dot_bcast(p[c], q[k], a[c] + 4 * k);
        h[c] = dot_bcast(h[c], q[k + 4], a[c] + 16 + 4 * k);
      }
    COLIBRI_UNROLL
    for (int c = 0; c < C; ++c) p[c] = _mm256_add_epi32(p[c], h[c]);
  } else {
    COLIBRI_UNROLL
    for (int k = 0; k < 8; ++k)
      COLIBRI_UNROLL
      for (int c = 0; c < C; ++c) p[c] = dot_bcast(p[c], q[k], a[c] + 4 * k);
  }
}

// Q4_1 . Q8_1. The nibbles as bytes 0..15 (unsigned, VNNI's first operand): q[k] for
// k < 4 the low nibbles of qs bytes 4k .. 4k + 3 (elements 4k ..), q[4 + k] their high
// nibbles (elements 16 + 4k ..). Token scales: {d_a, s}.
struct Q4_1 {
  using Block = BlockQ4_1;
  using Act = BlockQ8_1;
  struct Rows {
    __m256i q[8];
    __m256 d, m;
  };
  // The same from a row-lane (group, block) (quant/lane_pack.hpp): the transposed dwords as
  // stored, then d and m of the 8 rows.
  static constexpr std::size_t kQuants = kLaneRows * sizeof(BlockQ4_1::qs);  // then d, m
  COLIBRI_FORCE_INLINE static void load_packed(const unsigned char* g, Rows& R) {
    const __m256i lo = _mm256_set1_epi8(0x0f);
    COLIBRI_UNROLL
    for (int k = 0; k < 4; ++k) {
      const __m256i raw = load256(g + 32 * k);
      R.q[k] = _mm256_and_si256(raw, lo);
      R.q[k + 4] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), lo);
    }
    R.d = lane_halves(g, kQuants);
    R.m = lane_halves(g, kQuants + 2 * kLaneRows);
  }
  COLIBRI_FORCE_INLINE static void load(const unsigned char* const* rp, int64_t i, Rows& R) {
    const std::size_t off = static_cast<std::size_t>(i) * sizeof(BlockQ4_1);
    __m256i raw[4];
    transpose8x4(rp, off + offsetof(BlockQ4_1, qs), raw);
    const __m256i lo = _mm256_set1_epi8(0x0f);
    COLIBRI_UNROLL
    for (int k = 0; k < 4; ++k) {
      R.q[k] = _mm256_and_si256(raw[k], lo);
      R.q[k + 4] = _mm256_and_si256(_mm256_srli_epi16(raw[k], 4), lo);
    }
    const __m256i dm = first_dwords(rp, off);  // d in the low half, m in the high half
    R.d = halves_lo(dm);
    R.m = halves_hi(dm);
  }
  static void scales(const Act& y, float* sc) {
    sc[0] = half_at(&y.d);
    sc[1] = half_at(&y.s);
  }
  COLIBRI_FORCE_INLINE static __m256i init(const float*) { return _mm256_setzero_si256(); }
  // The block's term of the sum from its integer sums isum.
  COLIBRI_FORCE_INLINE static __m256 term(const Rows& R, __m256i isum, const float* sc) {
    const __m256 dd = _mm256_mul_ps(R.d, _mm256_set1_ps(sc[0]));
    return _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(isum), _mm256_mul_ps(R.m, _mm256_set1_ps(sc[1])));
  }
};

// Q8_0 . Q8_0. VNNI multiplies unsigned by signed bytes, so the weights go in as w + 128
// (q[k] = dword k of qs, sign bit flipped) and each token's block starts its dot at
// -128 sum(a): sum (w + 128) a - 128 sum a = sum w a, exactly (|partial sums| < 2^21).
// Token scales: {d_a, the starting value's bits}.
struct Q8_0 {
  using Block = BlockQ8_0;
  using Act = BlockQ8_0;
  struct Rows {
    __m256i q[8];
    __m256 d;
  };
  static constexpr std::size_t kQuants = kLaneRows * sizeof(BlockQ8_0::qs);  // then d
  COLIBRI_FORCE_INLINE static void load_packed(const unsigned char* g, Rows& R) {
    const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
    COLIBRI_UNROLL
    for (int k = 0; k < 8; ++k) R.q[k] = _mm256_xor_si256(load256(g + 32 * k), flip);
    R.d = lane_halves(g, kQuants);
  }
  COLIBRI_FORCE_INLINE static void load(const unsigned char* const* rp, int64_t i, Rows& R) {
    const std::size_t off = static_cast<std::size_t>(i) * sizeof(BlockQ8_0);
    transpose8x4(rp, off + offsetof(BlockQ8_0, qs), R.q);
    transpose8x4(rp, off + offsetof(BlockQ8_0, qs) + 16, R.q + 4);
    const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
    COLIBRI_UNROLL
    for (int k = 0; k < 8; ++k) R.q[k] = _mm256_xor_si256(R.q[k], flip);
    R.d = halves_lo(first_dwords(rp, off));
  }
  static void scales(const Act& y, float* sc) {
    sc[0] = half_at(&y.d);
    // sum a = sum (a + 128) - 32 * 128, the biased bytes summed by SAD in 4 64-bit lanes
    const __m256i sad = _mm256_sad_epu8(_mm256_xor_si256(load256(y.qs), _mm256_set1_epi8(static_cast<char>(0x80))),
                                        _mm256_setzero_si256());
    const __m128i s2 = _mm_add_epi64(_mm256_castsi256_si128(sad), _mm256_extracti128_si256(sad, 1));
    const int32_t sum = _mm_cvtsi128_si32(_mm_add_epi64(s2, _mm_unpackhi_epi64(s2, s2))) - 32 * 128;
    const int32_t init = -128 * sum;
    std::memcpy(&sc[1], &init, sizeof init);
  }
  COLIBRI_FORCE_INLINE static __m256i init(const float* sc) {
    int32_t v;
    std::memcpy(&v, &sc[1], sizeof v);
    return _mm256_set1_epi32(v);
  }
  COLIBRI_FORCE_INLINE static __m256 term(const Rows& R, __m256i isum, const float* sc) {
    return _mm256_mul_ps(_mm256_mul_ps(R.d, _mm256_set1_ps(sc[0])), _mm256_cvtepi32_ps(isum));
  }
};

// Token scales of T tokens (rows of as bytes) for nb blocks: sc[2 (i T + t) ..].
template <class K>
void token_scales(int64_t nb, const unsigned char* act, std::size_t as, int T, float* sc) {
  for (int t = 0; t < T; ++t) {
    const auto* y = reinterpret_cast<const typename K::Act*>(act + static_cast<std::size_t>(t) * as);
    for (int64_t i = 0; i < nb; ++i) K::scales(y[i], sc + 2 * (i * T + t));
  }
}

// Tokens [T0, T) of a pass (T of them in all) in chunks of at most 4, each token's dots in
// two chains: the block's integer sums, then its terms added to the accumulators. Measured
// (1536 x 576, 8 tokens, 1 thread): chunks of 8 in one chain 76 us, of 4 in two 66 us, of 2
// no better; session 29, registers unrolled: chunks of 3 1-3 % slower than 4 at 9-16 tokens.
constexpr int kChunk = 4;  // tokens per chunk (see above)
template <class K, int T0, int T>
COLIBRI_FORCE_INLINE void chunk(const typename K::Rows& R, int64_t i, const unsigned char* act, std::size_t as,
                                const float* sc, __m512d* acc) {
  constexpr int C = T - T0 < kChunk ? T - T0 : kChunk;
  const int8_t* a[C];
  __m256i p[C];
  COLIBRI_UNROLL
  for (int c = 0; c < C; ++c) {
    a[c] = reinterpret_cast<const typename K::Act*>(act + static_cast<std::size_t>(T0 + c) * as)[i].qs;
    p[c] = K::init(sc + 2 * (i * T + T0 + c));
  }
  block_sums<C>(R.q, a, p);
  COLIBRI_UNROLL
  for (int c = 0; c < C; ++c)
    acc[T0 + c] = _mm512_add_pd(acc[T0 + c], _mm512_cvtps_pd(K::term(R, p[c], sc + 2 * (i * T + T0 + c))));
  if constexpr (T0 + C < T) chunk<K, T0 + C, T>(R, i, act, as, sc, acc);
}

// One group of nv <= 8 rows (w, stride ws) against T tokens: out[t * os + r]. Packed: the
// group in the row-lane layout (quant/lane_pack.hpp; ws is still the row bytes, nv is 8).
template <class K, int T, bool Packed>
void group(int64_t nb, const unsigned char* w, std::size_t ws, int nv, const unsigned char* act, std::size_t as,
           const float* sc, float* out, std::size_t os) {
  const unsigned char* rp[8] = {};  // the rows (a packed group is one span)
  if constexpr (!Packed) {
    COLIBRI_UNROLL
    for (int r = 0; r < 8; ++r) rp[r] = w + static_cast<std::size_t>(r < nv ? r : nv - 1) * ws;
  }
  constexpr std::size_t kPackedBlock = kLaneRows * sizeof(typename K::Block);
  __m512d acc[T];  // the 8 rows' sums in double
  COLIBRI_UNROLL
  for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_pd();
  GroupPrefetch pf(w, ws, nv, nb);
  for (int64_t i = 0; i < nb; ++i) {
    pf.step();
    typename K::Rows R;
    if constexpr (Packed)
      K::load_packed(w + static_cast<std::size_t>(i) * kPackedBlock, R);
    else
      K::load(rp, i, R);
    chunk<K, 0, T>(R, i, act, as, sc, acc);
  }
  const auto mask = static_cast<__mmask8>((1u << nv) - 1);
  COLIBRI_UNROLL
  for (int t = 0; t < T; ++t)
    _mm256_mask_storeu_ps(out + static_cast<std::size_t>(t) * os, mask, _mm512_cvtpd_ps(acc[t]));
}

template <class K, int T, bool Packed>
void rows(int64_t nb, const unsigned char* w, std::size_t ws, int64_t nrows, const unsigned char* act,
          std::size_t as, const float* sc, float* out, std::size_t os) {
  for (int64_t r = 0; r < nrows; r += 8)
    group<K, T, Packed>(nb, w + static_cast<std::size_t>(r) * ws, ws, static_cast<int>(std::min<int64_t>(8, nrows - r)), act,
                as, sc, out + r, os);
}

// Per-thread room for a pass's token scales (grows, never shrinks).
inline float* scale_buffer(std::size_t n) {
  thread_local std::vector<float> buf;
  if (buf.size() < n) buf.resize(n);
  return buf.data();
}

// The kernel table's vec_dot_rows: one token, the rows' first 16 KiB prefetched at once
// (they start cold, as in row_groups::vec_dot_rows). Packed: rows in the row-lane layout
// (DotTile::packed_rows).
template <class K, bool Packed = false>
void vec_dot_rows(int64_t n, const void* w, std::size_t stride, int64_t nrows, const void* act, float* out) {
  const auto* wb = static_cast<const unsigned char*>(w);
  const std::size_t head = std::min<std::size_t>(static_cast<std::size_t>(nrows) * stride, kGroupPrefetchAhead);
  for (std::size_t off = 0; off < head; off += 64) __builtin_prefetch(wb + off, 0, 2);
  const int64_t nb = n / kQK;
  float* sc = scale_buffer(static_cast<std::size_t>(2 * nb));
  token_scales<K>(nb, static_cast<const unsigned char*>(act), 0, 1, sc);
  rows<K, 1, Packed>(nb, wb, stride, nrows, static_cast<const unsigned char*>(act), 0, sc, out, 0);
}

template <class K>
float vec_dot(int64_t n, const void* w, const void* act) {
  const int64_t nb = n / kQK;
  float* sc = scale_buffer(static_cast<std::size_t>(2 * nb));
  token_scales<K>(nb, static_cast<const unsigned char*>(act), 0, 1, sc);
  float out;
  group<K, 1, false>(nb, static_cast<const unsigned char*>(w), 0, 1, static_cast<const unsigned char*>(act), 0, sc, &out, 0);
  return out;
}

// Prefill / verify tiles: passes of up to kMaxTok tokens over all the rows given (the
// transposed weights of a group are reused by every token of the pass; T accumulators,
// 8 transposed quant vectors and the row scales fit the 32 registers up to 16 tokens).
constexpr int kMaxTok = 16;
// Weight bytes per call from the matmul (DotTile::weight_tile_bytes): a pass converts its
// tokens' scales once per call (~6 ops per token and block), next to ~20 per token and block
// for each group of 8 rows, so calls of a few groups (the default 16 KiB: 2 groups of the
// 1536-column down projection) spent 5-25 % on it. 128 KiB stays in L2 between a prefill's
// token passes.
constexpr std::size_t kTileWeightBytes = 128 * 1024;
using PassFn = void (*)(int64_t, const unsigned char*, std::size_t, int64_t, const unsigned char*, std::size_t,
                        const float*, float*, std::size_t);

template <class K, bool Packed, std::size_t... I>
constexpr std::array<PassFn, sizeof...(I)> passes(std::index_sequence<I...>) {
  return {&rows<K, static_cast<int>(I) + 1, Packed>...};
}

template <class K, bool Packed = false>
void tiles(int64_t n, const void* w, std::size_t ws, int64_t nrows, const void* act, std::size_t as, int64_t ntok,
           float* out, std::size_t os) {
  static constexpr std::array<PassFn, kMaxTok> pass = passes<K, Packed>(std::make_index_sequence<kMaxTok>{});
  const int64_t nb = n / kQK;
  float* sc = scale_buffer(static_cast<std::size_t>(2 * nb * kMaxTok));
  const auto* ab = static_cast<const unsigned char*>(act);
  for (int64_t t0 = 0; t0 < ntok; t0 += kMaxTok) {
    const int tt = static_cast<int>(std::min<int64_t>(kMaxTok, ntok - t0));
    const unsigned char* a = ab + static_cast<std::size_t>(t0) * as;
    token_scales<K>(nb, a, as, tt, sc);
    pass[static_cast<std::size_t>(tt - 1)](nb, static_cast<const unsigned char*>(w), ws, nrows, a, as, sc,
                                           out + static_cast<std::size_t>(t0) * os, os);
  }
}

}  // namespace lanes

template <class K>
constexpr VecDotRowsFn vec_dot_rows = row_groups::vec_dot_rows<K, 8, kGroupPrefetchAhead>;
using row_groups::rows_each;
using row_groups::vec_dot;

const TypeKernels kAvx512[] = {
    {DType::F32, DType::F32, ref::dequantize_row_f32, ref::quantize_row_f32, vec_dot_f32, ref::quantize_row_f32,
     rows_each<vec_dot_f32>},
    {DType::F16, DType::F32, dequantize_row_f16, ref::quantize_row_f16, vec_dot_f16, ref::quantize_row_f32,
     rows_each<vec_dot_f16>},
    {DType::BF16, DType::F32, dequantize_row_bf16, ref::quantize_row_bf16, vec_dot_bf16, ref::quantize_row_f32,
     rows_each<vec_dot_bf16>},
    {DType::Q4_0, DType::Q8_0, dequantize_row_q4_0, ref::quantize_row_q4_0, vec_dot<Q4_0>, quantize_row_q8_0,
     vec_dot_rows<Q4_0>},
    {DType::Q4_1, DType::Q8_1, dequantize_row_q4_1, ref::quantize_row_q4_1, lanes::vec_dot<lanes::Q4_1>,
     quantize_row_q8_1, lanes::vec_dot_rows<lanes::Q4_1>},
    {DType::Q8_0, DType::Q8_0, dequantize_row_q8_0, quantize_row_q8_0, lanes::vec_dot<lanes::Q8_0>,
     quantize_row_q8_0, lanes::vec_dot_rows<lanes::Q8_0>},
    {DType::Q8_1, DType::Q8_1, dequantize_row_q8_1, quantize_row_q8_1, nullptr, quantize_row_q8_1, nullptr},
};

// Prefill tiles (dot_tiles.hpp), each reproducing its vec_dot above bit for bit. Without
// them the batched matmul runs vec_dot_rows once per token (each weight block decoded per
// token), so a forward of n tokens cost n one-token forwards. 4 rows x 4 tokens for Q4_0
// (16 accumulators of the 32 registers); Q4_1 and Q8_0 groups of 8 rows against up to 16
// tokens a pass (lanes::tiles).
const DotTile kTiles[] = {
    {vec_dot_f32, f32_tile},
    {vec_dot<Q4_0>, dot_tiles::run<Q4_0, 4, 4, row_groups::kBlock>},
    {lanes::vec_dot<lanes::Q4_1>, lanes::tiles<lanes::Q4_1>, lanes::kTileWeightBytes,
     lanes::vec_dot_rows<lanes::Q4_1, true>, lanes::tiles<lanes::Q4_1, true>},
    {lanes::vec_dot<lanes::Q8_0>, lanes::tiles<lanes::Q8_0>, lanes::kTileWeightBytes,
     lanes::vec_dot_rows<lanes::Q8_0, true>, lanes::tiles<lanes::Q8_0, true>},
    {nullptr, nullptr},
};

}  // namespace

const DotTile* basic_avx512_tiles() { return kTiles; }

const FloatActDot* float_act_dots_avx512() { return kFloatActDots; }

const TypeKernels* avx512_kernels(DType type) {
  for (const TypeKernels& k : kAvx512)
    if (k.type == type) return &k;
  return nullptr;
}

}  // namespace colibri
