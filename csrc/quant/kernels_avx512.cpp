// AVX-512 (F/BW/VL/DQ) + VNNI kernels, run only where dispatch.cpp found those features.
// Scalar reference: quant/reference.cpp; same exactness rules as kernels_avx2.cpp:
// dequantize_row and the activation quantizers are bit-identical to the reference, vec_dot
// agrees to rounding (exact integer block sums, float accumulation in another order).
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
#include <cstring>
#include <utility>

#include "quant/block32_dot_x86.hpp"
#include "quant/blocks.hpp"
#include "quant/dot_tiles.hpp"
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
      for (int r = 0; r < NR; ++r) {
        const BlockQ4_0* x = reinterpret_cast<const BlockQ4_0*>(w + r * stride) + i;
        const __m256i p = _mm256_dpbusd_epi32(neg8a, nibbles_lo_hi16(x->qs), a);
        const __m256 d = _mm256_broadcastss_ps(_mm_mul_ps(half2_at(&x->d), da));
        acc[r] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc[r]);
      }
    }
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
        const __m256i p = dot_u8_i8(_mm256_abs_epi8(q), _mm256_sign_epi8(a, q));
        const __m256 d = _mm256_broadcastss_ps(_mm_mul_ps(half2_at(&x->d), da));
        acc[r] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc[r]);
      }
    }
    for (int r = 0; r < NR; ++r) out[r] = hsum_ps(acc[r]);
  }
  // R rows x T tokens, as Q4_0's tile: |w| and d_w once per row and block.
  using Block = BlockQ8_0;
  struct Row {
    __m256i q, aq;
    __m256 d;
  };
  struct Token {
    __m256i a;
    __m256 d;
  };
  using Acc = __m256;
  static Row row(const Block& x) {
    const __m256i q = load256(x.qs);
    return {q, _mm256_abs_epi8(q), _mm256_broadcastss_ps(half2_at(&x.d))};
  }
  static Token token(const Act& y) { return {load256(y.qs), _mm256_broadcastss_ps(half2_at(&y.d))}; }
  static Acc zero() { return _mm256_setzero_ps(); }
  static void madd(const Row& x, const Token& y, Acc& acc) {
    const __m256i p = dot_u8_i8(x.aq, _mm256_sign_epi8(y.a, x.q));
    acc = _mm256_fmadd_ps(_mm256_mul_ps(x.d, y.d), _mm256_cvtepi32_ps(p), acc);
  }
  static float sum(const Acc& acc) { return hsum_ps(acc); }
  template <int R, int T>
  static void tile(int64_t nb, const unsigned char* w, std::size_t ws, const unsigned char* act, std::size_t as,
                   float* out, std::size_t os) {
    dot_tiles::tile_loop<Q8_0, R, T>(nb, w, ws, act, as, out, os);
  }
};

// Q4_1 . Q8_1: block32_dot_x86.hpp's WithMin (d d_a sum q a + m s, as on AVX2) with the
// one-AND nibble layout and VNNI's dot.
struct NibblesLoHi16 {
  using Block = BlockQ4_1;
  static __m256i quants(const Block& x) { return nibbles_lo_hi16(x.qs); }
  static float sum(__m256 acc) { return hsum_lo_hi16(acc); }
};
struct Vnni {
  static __m256i dot_u8_i8(__m256i u, __m256i s) { return colibri::dot_u8_i8(u, s); }
};
using Q4_1 = block32::WithMin<NibblesLoHi16, Vnni>;

// Q4_1's prefill tile, R rows x T <= 8 tokens: WithMin's arithmetic per (row, token), with
// the per-block scale work of 4 tokens in one ymm per row. Token t's (d_a, s) halves sit in
// lanes 2t, 2t + 1 of a `ds` vector (two past 4 tokens), so one multiply by [d, m] x 4 gives
// 4 tokens' (d d_a, m s), lane for lane the products WithMin computes in lanes 0, 1 one
// token at a time, and one add keeps their running offset sums (lane 2t + 1); the dot takes
// lane 2t as its broadcast scale. Per (row, token, block) that leaves the VNNI dot, its
// conversion, the broadcast and the FMA (WithMin's madd also multiplies and adds the
// offsets per pair). Same operations on the same values per (row, token): vec_dot's bits.
struct Q4_1Tile {
  template <int R, int T>
  static void tile(int64_t nb, const unsigned char* w, std::size_t ws, const unsigned char* act, std::size_t as,
                   float* out, std::size_t os) {
    static_assert(T >= 1 && T <= 8, "the scale pairs of at most 8 tokens: two ymm");
    constexpr int H = (T + 3) / 4;  // ymm halves of the scale pairs: tokens 4h .. 4h + 3
    __m256 acc[R][T];
    __m256 offs[R][H];
    for (int r = 0; r < R; ++r) {
      for (int h = 0; h < H; ++h) offs[r][h] = _mm256_setzero_ps();
      for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();
    }
    GroupPrefetch pf(w, ws, R, nb);
    for (int64_t i = 0; i < nb; ++i) {
      pf.step();
      __m256i a[T];
      __m128i dsh[H];
      for (int h = 0; h < H; ++h) dsh[h] = _mm_setzero_si128();
      for (int t = 0; t < T; ++t) {
        const BlockQ8_1& y = reinterpret_cast<const BlockQ8_1*>(act + t * as)[i];
        a[t] = load256(y.qs);
        dsh[t / 4] = _mm_mask_set1_epi32(dsh[t / 4], static_cast<__mmask8>(1u << (t % 4)), load_i32(&y.d));
      }
      __m256 ds[H];
      for (int h = 0; h < H; ++h) ds[h] = _mm256_cvtph_ps(dsh[h]);
      for (int r = 0; r < R; ++r) {
        const BlockQ4_1& x = reinterpret_cast<const BlockQ4_1*>(w + r * ws)[i];
        const __m256 dm = _mm256_cvtph_ps(_mm_set1_epi32(load_i32(&x.d)));
        __m256 prod[H];
        for (int h = 0; h < H; ++h) {
          prod[h] = _mm256_mul_ps(dm, ds[h]);
          offs[r][h] = _mm256_add_ps(offs[r][h], prod[h]);
        }
        const __m256i q = nibbles_lo_hi16(x.qs);
        for (int t = 0; t < T; ++t) {
          const __m256 d = _mm256_permutexvar_ps(_mm256_set1_epi32(2 * (t % 4)), prod[t / 4]);
          acc[r][t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(dot_u8_i8(q, a[t])), acc[r][t]);
        }
      }
    }
    for (int r = 0; r < R; ++r) {
      alignas(32) float o[8 * H];
      for (int h = 0; h < H; ++h) _mm256_store_ps(o + 8 * h, offs[r][h]);
      for (int t = 0; t < T; ++t) out[t * os + r] = hsum_lo_hi16(acc[r][t]) + o[2 * t + 1];
    }
  }
};

// The Q4_1 tiles over a matrix: passes of 8 tokens over the rows, then the rest in one pass
// (a lone token through the one-token row groups: a pass's per-row work shared by one token
// costs more per pair than vec_dot_rows, so 9 tokens are 8 + 1, measured cheaper than 4 + 5
// or one 9-token pass); 4-row tiles up to 4 tokens, 2-row beyond (the accumulators of 4 x 8
// pairs would not fit the 32 registers). Measured on Zen 4 (1 thread, 1536 x 576 matmul):
// 8 tokens 154 -> 126 us, 9 tokens 182 -> 151 us against WithMin's 2 x 4 tiles in passes of
// 4 (dot_tiles::run); one token (vec_dot_rows) 24 us.
template <int R, int T>
void q4_1_body(int64_t nb, const unsigned char* w, std::size_t ws, const unsigned char* a, std::size_t as, float* out,
               std::size_t os) {
  Q4_1Tile::tile<R, T>(nb, w, ws, a, as, out, os);
}

template <int R, std::size_t... I>
constexpr std::array<dot_tiles::TileBody, sizeof...(I)> q4_1_bodies(std::index_sequence<I...>) {
  return {&q4_1_body<R, static_cast<int>(I) + 1>...};
}

void q4_1_tiles(int64_t n, const void* w, std::size_t ws, int64_t nrows, const void* act, std::size_t as,
                int64_t ntok, float* out, std::size_t os) {
  static constexpr int kMaxTok = 8;
  static constexpr std::array<dot_tiles::TileBody, 4> four = q4_1_bodies<4>(std::make_index_sequence<4>{});
  static constexpr std::array<dot_tiles::TileBody, kMaxTok> two = q4_1_bodies<2>(std::make_index_sequence<kMaxTok>{});
  static constexpr std::array<dot_tiles::TileBody, kMaxTok> one = q4_1_bodies<1>(std::make_index_sequence<kMaxTok>{});
  const auto* wb = static_cast<const unsigned char*>(w);
  const auto* ab = static_cast<const unsigned char*>(act);
  const int64_t nb = n / row_groups::kBlock;
  for (int64_t t0 = 0; t0 < ntok;) {
    const int64_t tt = std::min<int64_t>(kMaxTok, ntok - t0);
    if (tt == 1) {  // a lone token: the one-token row groups (vec_dot itself), cheaper per pair
      row_groups::vec_dot_rows<Q4_1, 8, 0>(n, wb, ws, nrows, ab + static_cast<std::size_t>(t0) * as,
                                           out + static_cast<std::size_t>(t0) * os);
      break;
    }
    const int mr = tt <= 4 ? 4 : 2;
    const auto ti = static_cast<std::size_t>(tt - 1);
    const dot_tiles::TileBody full = mr == 4 ? four[ti] : two[ti];
    int64_t r0 = 0;
    for (; r0 + mr <= nrows; r0 += mr)
      full(nb, wb + static_cast<std::size_t>(r0) * ws, ws, ab + static_cast<std::size_t>(t0) * as, as,
           out + static_cast<std::size_t>(t0) * os + r0, os);
    for (; r0 < nrows; ++r0)  // the last rows one at a time
      one[ti](nb, wb + static_cast<std::size_t>(r0) * ws, ws, ab + static_cast<std::size_t>(t0) * as, as,
              out + static_cast<std::size_t>(t0) * os + r0, os);
    t0 += tt;
  }
}

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
    {DType::Q4_1, DType::Q8_1, dequantize_row_q4_1, ref::quantize_row_q4_1, vec_dot<Q4_1>, quantize_row_q8_1,
     vec_dot_rows<Q4_1>},
    {DType::Q8_0, DType::Q8_0, dequantize_row_q8_0, quantize_row_q8_0, vec_dot<Q8_0>, quantize_row_q8_0,
     vec_dot_rows<Q8_0>},
    {DType::Q8_1, DType::Q8_1, dequantize_row_q8_1, quantize_row_q8_1, nullptr, quantize_row_q8_1, nullptr},
};

// Prefill tiles (dot_tiles.hpp), each reproducing its vec_dot above bit for bit. Without
// them the batched matmul runs vec_dot_rows once per token (each weight block decoded per
// token), so a forward of n tokens cost n one-token forwards. 4 rows x 4 tokens for Q4_0 /
// Q8_0 (16 accumulators of the 32 registers); Q4_1 up to 8 tokens a pass (q4_1_tiles).
const DotTile kTiles[] = {
    {vec_dot<Q4_0>, dot_tiles::run<Q4_0, 4, 4, row_groups::kBlock>},
    {vec_dot<Q4_1>, q4_1_tiles},
    {vec_dot<Q8_0>, dot_tiles::run<Q8_0, 4, 4, row_groups::kBlock>},
    {nullptr, nullptr},
};

}  // namespace

const DotTile* basic_avx512_tiles() { return kTiles; }

const TypeKernels* avx512_kernels(DType type) {
  for (const TypeKernels& k : kAvx512)
    if (k.type == type) return &k;
  return nullptr;
}

}  // namespace colibri
