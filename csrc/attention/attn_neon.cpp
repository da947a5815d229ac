// NEON attention kernels (AArch64, where Advanced SIMD is always present). Same structure
// as attn_avx2.cpp with 4 lanes: a score is 4 lanes of FMA partial sums (a tail of dk % 4
// is zero-padded) reduced as (a0+a1)+(a2+a3), then times the scale; an output element is
// o * alpha then one FMA per key in key order. Rows are converted on load as in the AVX2
// file (vcvt_f32_f16 for F16).
#include <arm_neon.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "attention/attention.hpp"
#include "attention/kernels.hpp"
#include "quant/blocks.hpp"
#include "quant/fp16.hpp"

namespace colibri::attn {
namespace {

static_assert(kBlockKeys % 4 == 0, "softmax_block loads whole vectors");

inline float32x4_t exp4(float32x4_t x) {
  const float32x4_t lo = vdupq_n_f32(-87.33654f);
  const uint32x4_t underflow = vcltq_f32(x, lo);
  x = vmaxq_f32(vminq_f32(x, vdupq_n_f32(88.0f)), lo);
  const float32x4_t n = vrndnq_f32(vmulq_f32(x, vdupq_n_f32(1.44269504088896341f)));
  float32x4_t r = vfmsq_f32(x, n, vdupq_n_f32(0.693359375f));
  r = vfmsq_f32(r, n, vdupq_n_f32(-2.12194440e-4f));
  float32x4_t y = vdupq_n_f32(1.9875691500e-4f);
  y = vfmaq_f32(vdupq_n_f32(1.3981999507e-3f), y, r);
  y = vfmaq_f32(vdupq_n_f32(8.3334519073e-3f), y, r);
  y = vfmaq_f32(vdupq_n_f32(4.1665795894e-2f), y, r);
  y = vfmaq_f32(vdupq_n_f32(1.6666665459e-1f), y, r);
  y = vfmaq_f32(vdupq_n_f32(5.0000001201e-1f), y, r);
  y = vfmaq_f32(r, y, vmulq_f32(r, r));
  y = vaddq_f32(y, vdupq_n_f32(1.0f));
  const int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23);
  const float32x4_t out = vmulq_f32(y, vreinterpretq_f32_s32(e));
  return vreinterpretq_f32_u32(vbicq_u32(vreinterpretq_u32_f32(out), underflow));
}

// Lane i: (a_i0 + a_i1) + (a_i2 + a_i3) for the four vectors a_0..a_3.
inline float32x4_t hsum4(float32x4_t a, float32x4_t b, float32x4_t c, float32x4_t d) {
  return vpaddq_f32(vpaddq_f32(a, b), vpaddq_f32(c, d));
}

// Up to 4 floats, zero-padded.
inline float32x4_t load_part(const float* p, int64_t n) {
  float tmp[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  std::memcpy(tmp, p, static_cast<std::size_t>(n) * sizeof(float));
  return vld1q_f32(tmp);
}

// How each cache type is read: elements [i, i + 4) of a row as F32 (exact), and the
// zero-padded tail of n < 4 elements at i (never read past the row).
struct F32Elems {
  static inline float32x4_t load(const unsigned char* row, int64_t i) {
    return vld1q_f32(reinterpret_cast<const float*>(row) + i);
  }
  static inline float32x4_t tail(const unsigned char* row, int64_t i, int64_t n) {
    return load_part(reinterpret_cast<const float*>(row) + i, n);
  }
};

inline uint16x4_t halves(const unsigned char* p) {
  uint16_t h[4];
  std::memcpy(h, p, sizeof h);
  return vld1_u16(h);
}

inline uint16x4_t half_tail(const unsigned char* p, int64_t n) {
  uint16_t h[4] = {0, 0, 0, 0};
  std::memcpy(h, p, static_cast<std::size_t>(n) * sizeof(uint16_t));
  return vld1_u16(h);
}

struct F16Elems {
  static inline float32x4_t load(const unsigned char* row, int64_t i) {
    return vcvt_f32_f16(vreinterpret_f16_u16(halves(row + 2 * i)));
  }
  static inline float32x4_t tail(const unsigned char* row, int64_t i, int64_t n) {
    return vcvt_f32_f16(vreinterpret_f16_u16(half_tail(row + 2 * i, n)));
  }
};

struct BF16Elems {
  static inline float32x4_t load(const unsigned char* row, int64_t i) {
    return vreinterpretq_f32_u32(vshll_n_u16(halves(row + 2 * i), 16));
  }
  static inline float32x4_t tail(const unsigned char* row, int64_t i, int64_t n) {
    return vreinterpretq_f32_u32(vshll_n_u16(half_tail(row + 2 * i, n), 16));
  }
};

// Q8_0: i is a multiple of 4 and the row whole blocks, so 4 elements never straddle a
// block. q * d is exact in F32 (an 8-bit integer times an 11-bit half mantissa).
struct Q8Elems {
  static inline float32x4_t load(const unsigned char* row, int64_t i) {
    const unsigned char* block = row + (i / kQK) * static_cast<int64_t>(sizeof(BlockQ8_0));
    uint16_t d;
    std::memcpy(&d, block + offsetof(BlockQ8_0, d), sizeof d);
    int8_t q[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    std::memcpy(q, block + offsetof(BlockQ8_0, qs) + i % kQK, 4);
    const int32x4_t w = vmovl_s16(vget_low_s16(vmovl_s8(vld1_s8(q))));
    return vmulq_n_f32(vcvtq_f32_s32(w), fp16_to_fp32(d));
  }
  static inline float32x4_t tail(const unsigned char* row, int64_t i, int64_t n) {
    float tmp[4];
    vst1q_f32(tmp, load(row, i));  // unreachable: whole blocks
    return load_part(tmp, n);
  }
};

// Scores of R query rows against C keys (R * C <= 8 accumulators).
template <class E, int R, int C>
inline void score_tile(const float* q, int64_t qs, const unsigned char* k, int64_t ks, int64_t dk, float scale,
                       float* s, int64_t ld) {
  static_assert(R * C <= 8, "two reductions of 4 sums");
  float32x4_t acc[8];
  COLIBRI_UNROLL for (int i = 0; i < 8; ++i) acc[i] = vdupq_n_f32(0.0f);
  int64_t i = 0;
  for (; i + 4 <= dk; i += 4) {
    float32x4_t qv[R];
    COLIBRI_UNROLL for (int r = 0; r < R; ++r) qv[r] = vld1q_f32(q + r * qs + i);
    COLIBRI_UNROLL for (int c = 0; c < C; ++c) {
      const float32x4_t kv = E::load(k + c * ks, i);
      COLIBRI_UNROLL for (int r = 0; r < R; ++r) acc[r * C + c] = vfmaq_f32(acc[r * C + c], qv[r], kv);
    }
  }
  if (i < dk) {
    float32x4_t qv[R];
    COLIBRI_UNROLL for (int r = 0; r < R; ++r) qv[r] = load_part(q + r * qs + i, dk - i);
    COLIBRI_UNROLL for (int c = 0; c < C; ++c) {
      const float32x4_t kv = E::tail(k + c * ks, i, dk - i);
      COLIBRI_UNROLL for (int r = 0; r < R; ++r) acc[r * C + c] = vfmaq_f32(acc[r * C + c], qv[r], kv);
    }
  }
  float out[8];
  const float32x4_t sc = vdupq_n_f32(scale);
  vst1q_f32(out, vmulq_f32(hsum4(acc[0], acc[1], acc[2], acc[3]), sc));
  vst1q_f32(out + 4, vmulq_f32(hsum4(acc[4], acc[5], acc[6], acc[7]), sc));
  COLIBRI_UNROLL for (int r = 0; r < R; ++r)
    COLIBRI_UNROLL for (int c = 0; c < C; ++c) s[r * ld + c] = out[r * C + c];
}

// R rows (1..4) against every key: up to 4 rows share each key load.
template <class E, int R>
void score_rows(const float* q, int64_t qs, const Rows& k, int64_t n_keys, int64_t dk, float scale, float* s,
                int64_t ld, bool prefetch) {
  constexpr int C = R <= 2 ? 4 : 2;
  int64_t j = 0;
  for (; j + C <= n_keys; j += C) {
    if (prefetch)
      COLIBRI_UNROLL for (int c = 0; c < C; ++c) prefetch_ahead(k, j + c);
    score_tile<E, R, C>(q, qs, k.data + j * k.stride, k.stride, dk, scale, s + j, ld);
  }
  for (; j < n_keys; ++j) {
    if (prefetch) prefetch_ahead(k, j);
    score_tile<E, R, 1>(q, qs, k.data + j * k.stride, k.stride, dk, scale, s + j, ld);
  }
}

template <class E>
void scores_as(const float* q, int64_t q_stride, int64_t n_rows, const Rows& k, int64_t n_keys, int64_t dk,
               float scale, float* s, int64_t ld) {
  for (int64_t r = 0; r < n_rows; r += 4) {
    const bool prefetch = r == 0 && k.prefetch > 0;  // the first pass over the keys asks ahead
    const float* qr = q + r * q_stride;
    float* sr = s + r * ld;
    switch (n_rows - r) {
      case 1: score_rows<E, 1>(qr, q_stride, k, n_keys, dk, scale, sr, ld, prefetch); break;
      case 2: score_rows<E, 2>(qr, q_stride, k, n_keys, dk, scale, sr, ld, prefetch); break;
      case 3: score_rows<E, 3>(qr, q_stride, k, n_keys, dk, scale, sr, ld, prefetch); break;
      default: score_rows<E, 4>(qr, q_stride, k, n_keys, dk, scale, sr, ld, prefetch); break;
    }
  }
}

void scores(const float* q, int64_t q_stride, int64_t n_rows, const Rows& k, int64_t n_keys, int64_t dk,
            float scale, float* s, int64_t ld) {
  switch (k.type) {
    case DType::F16: return scores_as<F16Elems>(q, q_stride, n_rows, k, n_keys, dk, scale, s, ld);
    case DType::BF16: return scores_as<BF16Elems>(q, q_stride, n_rows, k, n_keys, dk, scale, s, ld);
    case DType::Q8_0: return scores_as<Q8Elems>(q, q_stride, n_rows, k, n_keys, dk, scale, s, ld);
    default: return scores_as<F32Elems>(q, q_stride, n_rows, k, n_keys, dk, scale, s, ld);
  }
}

float softmax_block(float* s, float* m, float* l) {
  constexpr int kVecs = kBlockKeys / 4;
  float32x4_t mx = vdupq_n_f32(*m);
  COLIBRI_UNROLL for (int i = 0; i < kVecs; ++i) mx = vmaxq_f32(mx, vld1q_f32(s + 4 * i));
  const float m_new = vmaxvq_f32(mx);
  const float alpha = vgetq_lane_f32(exp4(vdupq_n_f32(*m - m_new)), 0);
  const float32x4_t mn = vdupq_n_f32(m_new);
  float32x4_t sum = vdupq_n_f32(0.0f);
  COLIBRI_UNROLL for (int i = 0; i < kVecs; ++i) {
    const float32x4_t p = exp4(vsubq_f32(vld1q_f32(s + 4 * i), mn));
    vst1q_f32(s + 4 * i, p);
    sum = vaddq_f32(sum, p);
  }
  const float32x4_t z = vdupq_n_f32(0.0f);
  *l = *l * alpha + vgetq_lane_f32(hsum4(sum, z, z, z), 0);
  *m = m_new;
  return alpha;
}

// Output dims [d0, d0 + 4 * NC) of R rows; `last` elements of the last vector are real (1..4).
template <class E, int R, int NC>
inline void pv_tile(float* o, int64_t os, const float* p, int64_t ps, const float* alpha, const Rows& v, int64_t d0,
                    int64_t n_keys, int64_t last, bool prefetch) {
  float32x4_t acc[R][NC];
  COLIBRI_UNROLL for (int r = 0; r < R; ++r) {
    COLIBRI_UNROLL for (int c = 0; c < NC; ++c)
      acc[r][c] = c == NC - 1 && last < 4 ? load_part(o + r * os + 4 * c, last) : vld1q_f32(o + r * os + 4 * c);
    if (alpha)
      COLIBRI_UNROLL for (int c = 0; c < NC; ++c) acc[r][c] = vmulq_n_f32(acc[r][c], alpha[r]);
  }
  for (int64_t j = 0; j < n_keys; ++j) {
    if (prefetch) prefetch_ahead(v, j);
    const unsigned char* row = v.data + j * v.stride;
    float32x4_t pj[R];
    COLIBRI_UNROLL for (int r = 0; r < R; ++r) pj[r] = vdupq_n_f32(p[r * ps + j]);
    COLIBRI_UNROLL for (int c = 0; c < NC; ++c) {
      const float32x4_t vv = c == NC - 1 && last < 4 ? E::tail(row, d0 + 4 * c, last) : E::load(row, d0 + 4 * c);
      COLIBRI_UNROLL for (int r = 0; r < R; ++r) acc[r][c] = vfmaq_f32(acc[r][c], pj[r], vv);
    }
  }
  COLIBRI_UNROLL for (int r = 0; r < R; ++r)
    COLIBRI_UNROLL for (int c = 0; c < NC; ++c) {
      if (c == NC - 1 && last < 4) {
        float tmp[4];
        vst1q_f32(tmp, acc[r][c]);
        std::memcpy(o + r * os + 4 * c, tmp, static_cast<std::size_t>(last) * sizeof(float));
      } else {
        vst1q_f32(o + r * os + 4 * c, acc[r][c]);
      }
    }
}

// R rows (1..4): 16 output dims at a time, every key's value row read once per pass.
template <class E, int R>
void pv_rows(float* o, int64_t os, const float* p, int64_t ps, const float* alpha, const Rows& v, int64_t n_keys,
             int64_t dv, bool prefetch) {
  for (int64_t d0 = 0; d0 < dv; d0 += 16) {
    const int64_t left = dv - d0, last = left >= 16 ? 4 : (left - 1) % 4 + 1;
    switch (left >= 16 ? 4 : (left + 3) / 4) {
      case 4: pv_tile<E, R, 4>(o + d0, os, p, ps, alpha, v, d0, n_keys, last, prefetch); break;
      case 3: pv_tile<E, R, 3>(o + d0, os, p, ps, alpha, v, d0, n_keys, last, prefetch); break;
      case 2: pv_tile<E, R, 2>(o + d0, os, p, ps, alpha, v, d0, n_keys, last, prefetch); break;
      default: pv_tile<E, R, 1>(o + d0, os, p, ps, alpha, v, d0, n_keys, last, prefetch); break;
    }
    prefetch = false;  // the later passes find the rows in L1
  }
}

template <class E>
void pv_as(float* o, int64_t o_stride, int64_t n_rows, const float* p, int64_t p_stride, const float* alpha,
           const Rows& v, int64_t n_keys, int64_t dv) {
  for (int64_t r = 0; r < n_rows; r += 4) {
    const bool prefetch = r == 0 && v.prefetch > 0;
    float* orow = o + r * o_stride;
    const float* pr = p + r * p_stride;
    const float* ar = alpha ? alpha + r : nullptr;
    switch (n_rows - r) {
      case 1: pv_rows<E, 1>(orow, o_stride, pr, p_stride, ar, v, n_keys, dv, prefetch); break;
      case 2: pv_rows<E, 2>(orow, o_stride, pr, p_stride, ar, v, n_keys, dv, prefetch); break;
      case 3: pv_rows<E, 3>(orow, o_stride, pr, p_stride, ar, v, n_keys, dv, prefetch); break;
      default: pv_rows<E, 4>(orow, o_stride, pr, p_stride, ar, v, n_keys, dv, prefetch); break;
    }
  }
}

void pv(float* o, int64_t o_stride, int64_t n_rows, const float* p, int64_t p_stride, const float* alpha,
        const Rows& v, int64_t n_keys, int64_t dv) {
  switch (v.type) {
    case DType::F16: return pv_as<F16Elems>(o, o_stride, n_rows, p, p_stride, alpha, v, n_keys, dv);
    case DType::BF16: return pv_as<BF16Elems>(o, o_stride, n_rows, p, p_stride, alpha, v, n_keys, dv);
    case DType::Q8_0: return pv_as<Q8Elems>(o, o_stride, n_rows, p, p_stride, alpha, v, n_keys, dv);
    default: return pv_as<F32Elems>(o, o_stride, n_rows, p, p_stride, alpha, v, n_keys, dv);
  }
}

const Kernels kNeon{Isa::NEON, scores, softmax_block, pv};

}  // namespace

const Kernels* neon_kernels() { return &kNeon; }

}  // namespace colibri::attn
