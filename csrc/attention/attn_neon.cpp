// NEON attention kernels (AArch64, where Advanced SIMD is always present). Same structure
// as attn_avx2.cpp with 4 lanes: a score is 4 lanes of FMA partial sums (a tail of dk % 4
// is zero-padded) reduced as (a0+a1)+(a2+a3), then times the scale; an output element is
// o * alpha then one FMA per key in key order.
#include <arm_neon.h>

#include <cstdint>
#include <cstring>

#include "attention/attention.hpp"
#include "attention/kernels.hpp"

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

template <int R, int C>
inline void score_tile(const float* q, int64_t qs, const float* k, int64_t ks, int64_t dk, float scale, float* s,
                       int64_t ld) {
  float32x4_t acc[8];
  for (int i = 0; i < 8; ++i) acc[i] = vdupq_n_f32(0.0f);
  int64_t i = 0;
  for (; i + 4 <= dk; i += 4) {
    float32x4_t qv[R];
    for (int r = 0; r < R; ++r) qv[r] = vld1q_f32(q + r * qs + i);
    for (int c = 0; c < C; ++c) {
      const float32x4_t kv = vld1q_f32(k + c * ks + i);
      for (int r = 0; r < R; ++r) acc[r * C + c] = vfmaq_f32(acc[r * C + c], qv[r], kv);
    }
  }
  if (i < dk) {
    float32x4_t qv[R];
    for (int r = 0; r < R; ++r) qv[r] = load_part(q + r * qs + i, dk - i);
    for (int c = 0; c < C; ++c) {
      const float32x4_t kv = load_part(k + c * ks + i, dk - i);
      for (int r = 0; r < R; ++r) acc[r * C + c] = vfmaq_f32(acc[r * C + c], qv[r], kv);
    }
  }
  float out[8];
  const float32x4_t sc = vdupq_n_f32(scale);
  vst1q_f32(out, vmulq_f32(hsum4(acc[0], acc[1], acc[2], acc[3]), sc));
  vst1q_f32(out + 4, vmulq_f32(hsum4(acc[4], acc[5], acc[6], acc[7]), sc));
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) s[r * ld + c] = out[r * C + c];
}

template <int R>
inline void score_rows(const float* q, int64_t qs, const float* k, int64_t ks, int64_t n_keys, int64_t dk,
                       float scale, float* s, int64_t ld) {
  int64_t j = 0;
  for (; j + 4 <= n_keys; j += 4) score_tile<R, 4>(q, qs, k + j * ks, ks, dk, scale, s + j, ld);
  switch (n_keys - j) {
    case 3: score_tile<R, 3>(q, qs, k + j * ks, ks, dk, scale, s + j, ld); break;
    case 2: score_tile<R, 2>(q, qs, k + j * ks, ks, dk, scale, s + j, ld); break;
    case 1: score_tile<R, 1>(q, qs, k + j * ks, ks, dk, scale, s + j, ld); break;
    default: break;
  }
}

void scores(const float* q, int64_t q_stride, int64_t n_rows, const float* k, int64_t k_stride, int64_t n_keys,
            int64_t dk, float scale, float* s, int64_t ld) {
  int64_t r = 0;
  for (; r + 2 <= n_rows; r += 2)
    score_rows<2>(q + r * q_stride, q_stride, k, k_stride, n_keys, dk, scale, s + r * ld, ld);
  if (r < n_rows) score_rows<1>(q + r * q_stride, q_stride, k, k_stride, n_keys, dk, scale, s + r * ld, ld);
}

float softmax_block(float* s, float* m, float* l) {
  constexpr int kVecs = kBlockKeys / 4;
  float32x4_t mx = vdupq_n_f32(*m);
  for (int i = 0; i < kVecs; ++i) mx = vmaxq_f32(mx, vld1q_f32(s + 4 * i));
  const float m_new = vmaxvq_f32(mx);
  const float alpha = vgetq_lane_f32(exp4(vdupq_n_f32(*m - m_new)), 0);
  const float32x4_t mn = vdupq_n_f32(m_new);
  float32x4_t sum = vdupq_n_f32(0.0f);
  for (int i = 0; i < kVecs; ++i) {
    const float32x4_t p = exp4(vsubq_f32(vld1q_f32(s + 4 * i), mn));
    vst1q_f32(s + 4 * i, p);
    sum = vaddq_f32(sum, p);
  }
  const float32x4_t z = vdupq_n_f32(0.0f);
  *l = *l * alpha + vgetq_lane_f32(hsum4(sum, z, z, z), 0);
  *m = m_new;
  return alpha;
}

// Output dims [0, 4 * NC) of R rows; `last` floats of the last vector are real (1..4).
template <int R, int NC>
inline void pv_tile(float* o, int64_t os, const float* p, int64_t ps, const float* alpha, const float* v,
                    int64_t vs, int64_t n_keys, int64_t last) {
  float32x4_t acc[R][NC];
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < NC; ++c)
      acc[r][c] = c == NC - 1 && last < 4 ? load_part(o + r * os + 4 * c, last) : vld1q_f32(o + r * os + 4 * c);
    if (alpha)
      for (int c = 0; c < NC; ++c) acc[r][c] = vmulq_n_f32(acc[r][c], alpha[r]);
  }
  for (int64_t j = 0; j < n_keys; ++j) {
    float32x4_t vv[NC];
    for (int c = 0; c < NC; ++c)
      vv[c] = c == NC - 1 && last < 4 ? load_part(v + j * vs + 4 * c, last) : vld1q_f32(v + j * vs + 4 * c);
    for (int r = 0; r < R; ++r) {
      const float32x4_t pj = vdupq_n_f32(p[r * ps + j]);
      for (int c = 0; c < NC; ++c) acc[r][c] = vfmaq_f32(acc[r][c], pj, vv[c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < NC; ++c) {
      if (c == NC - 1 && last < 4) {
        float tmp[4];
        vst1q_f32(tmp, acc[r][c]);
        std::memcpy(o + r * os + 4 * c, tmp, static_cast<std::size_t>(last) * sizeof(float));
      } else {
        vst1q_f32(o + r * os + 4 * c, acc[r][c]);
      }
    }
}

template <int R>
inline void pv_rows(float* o, int64_t os, const float* p, int64_t ps, const float* alpha, const float* v,
                    int64_t vs, int64_t n_keys, int64_t dv) {
  for (int64_t d0 = 0; d0 < dv; d0 += 16) {
    const int64_t left = dv - d0, last = left >= 16 ? 4 : (left - 1) % 4 + 1;
    switch (left >= 16 ? 4 : (left + 3) / 4) {
      case 4: pv_tile<R, 4>(o + d0, os, p, ps, alpha, v + d0, vs, n_keys, last); break;
      case 3: pv_tile<R, 3>(o + d0, os, p, ps, alpha, v + d0, vs, n_keys, last); break;
      case 2: pv_tile<R, 2>(o + d0, os, p, ps, alpha, v + d0, vs, n_keys, last); break;
      default: pv_tile<R, 1>(o + d0, os, p, ps, alpha, v + d0, vs, n_keys, last); break;
    }
  }
}

void pv(float* o, int64_t o_stride, int64_t n_rows, const float* p, int64_t p_stride, const float* alpha,
        const float* v, int64_t v_stride, int64_t n_keys, int64_t dv) {
  int64_t r = 0;
  for (; r + 2 <= n_rows; r += 2)
    pv_rows<2>(o + r * o_stride, o_stride, p + r * p_stride, p_stride, alpha ? alpha + r : nullptr, v, v_stride,
               n_keys, dv);
  if (r < n_rows)
    pv_rows<1>(o + r * o_stride, o_stride, p + r * p_stride, p_stride, alpha ? alpha + r : nullptr, v, v_stride,
               n_keys, dv);
}

const Kernels kNeon{Isa::NEON, scores, softmax_block, pv};

}  // namespace

const Kernels* neon_kernels() { return &kNeon; }

}  // namespace colibri::attn
