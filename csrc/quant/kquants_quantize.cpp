// Reference quantizers of the K-quants: ggml's quantize_row_q{2,3,4,5,6}_K_ref arithmetic
// (ggml-quants.c, the path llama.cpp takes without an importance matrix), so a tensor
// quantized here is byte-identical to llama.cpp's. Every float operation below is written
// in the order C evaluates ggml's expressions (left to right, each product and sum rounded
// once; contraction is off), because the searches compare errors and a different rounding
// can pick another scale. tests/kernels/test_kquants.py compares the bytes with libggml's own.
//
// The shared pieces, each named as in ggml:
//  - make_qkx2_quants: an asymmetric fit (scale, min) of n values to 0..nmax, trying
//    nstep + 1 scales around nmax / (max - min) and keeping the lowest weighted error;
//  - make_qx_quants (rmse_type 1): a symmetric fit to -nmax..nmax-1 with weights x^2,
//    trying 18 scales around -nmax / max;
//  - make_q3_quants: the symmetric fit of Q3_K, refined by moving one quant at a time.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <algorithm>
#include <cmath>
#include <cstring>

#include "quant/blocks_k.hpp"
#include "quant/fp16.hpp"
#include "quant/kquant_common.hpp"
#include "quant/kquants.hpp"

namespace colibri {
namespace ref {
namespace {

using kq::nearest_int;

constexpr float kGroupMaxEps = 1e-15f;  // ggml's GROUP_MAX_EPS: a group this small is zero

float make_qkx2_quants(int n, int nmax, const float* x, const float* weights, uint8_t* L, float* the_min,
                       uint8_t* Laux, float rmin, float rdelta, int nstep, bool use_mad) {
  float min = x[0], max = x[0];
  float sum_w = weights[0];
  float sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    if (x[i] < min) min = x[i];
    if (x[i] > max) max = x[i];
    const float w = weights[i];
    sum_w += w;
    sum_x += w * x[i];
  }
  if (min > 0) min = 0;
  if (max == min) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    *the_min = -min;
    return 0.0f;
  }
  float iscale = static_cast<float>(nmax) / (max - min);
  float scale = 1 / iscale;
  float best_error = 0;
  for (int i = 0; i < n; ++i) {
    const int l = nearest_int(iscale * (x[i] - min));
    L[i] = static_cast<uint8_t>(std::max(0, std::min(nmax, l)));
    float diff = scale * static_cast<float>(L[i]) + min - x[i];
    diff = use_mad ? std::fabs(diff) : diff * diff;
    best_error += weights[i] * diff;
  }
  if (nstep < 1) {
    *the_min = -min;
    return scale;
  }
  for (int is = 0; is <= nstep; ++is) {
    iscale = (rmin + rdelta * static_cast<float>(is) + static_cast<float>(nmax)) / (max - min);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      int l = nearest_int(iscale * (x[i] - min));
      l = std::max(0, std::min(nmax, l));
      Laux[i] = static_cast<uint8_t>(l);
      const float w = weights[i], fl = static_cast<float>(l);
      sum_l += w * fl;
      sum_l2 += w * fl * fl;
      sum_xl += w * fl * x[i];
    }
    const float D = sum_w * sum_l2 - sum_l * sum_l;
    if (D > 0) {
      float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
      float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
      if (this_min > 0) {
        this_min = 0;
        this_scale = sum_xl / sum_l2;
      }
      float cur_error = 0;
      for (int i = 0; i < n; ++i) {
        float diff = this_scale * static_cast<float>(Laux[i]) + this_min - x[i];
        diff = use_mad ? std::fabs(diff) : diff * diff;
        cur_error += weights[i] * diff;
      }
      if (cur_error < best_error) {
        std::memcpy(L, Laux, static_cast<std::size_t>(n));
        best_error = cur_error;
        scale = this_scale;
        min = this_min;
      }
    }
  }
  *the_min = -min;
  return scale;
}

// ggml's make_qx_quants with rmse_type = 1 and no importance weights (Q6_K's use).
float make_qx_quants_rmse1(int n, int nmax, const float* x, int8_t* L) {
  float max = 0, amax = 0;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
  if (amax < kGroupMaxEps) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    return 0.0f;
  }
  const float fnmax = static_cast<float>(nmax);
  float iscale = -fnmax / max;
  float sumlx = 0, suml2 = 0;
  for (int i = 0; i < n; ++i) {
    int l = nearest_int(iscale * x[i]);
    l = std::max(-nmax, std::min(nmax - 1, l));
    L[i] = static_cast<int8_t>(l + nmax);
    const float w = x[i] * x[i], fl = static_cast<float>(l);
    sumlx += w * x[i] * fl;
    suml2 += w * fl * fl;
  }
  float scale = suml2 != 0.0f ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  for (int is = -9; is <= 9; ++is) {
    if (is == 0) continue;
    iscale = -(fnmax + 0.1f * static_cast<float>(is)) / max;
    sumlx = suml2 = 0;
    for (int i = 0; i < n; ++i) {
      int l = nearest_int(iscale * x[i]);
      l = std::max(-nmax, std::min(nmax - 1, l));
      const float w = x[i] * x[i], fl = static_cast<float>(l);
      sumlx += w * x[i] * fl;
      suml2 += w * fl * fl;
    }
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      for (int i = 0; i < n; ++i) {
        const int l = nearest_int(iscale * x[i]);
        L[i] = static_cast<int8_t>(nmax + std::max(-nmax, std::min(nmax - 1, l)));
      }
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

// ggml's make_q3_quants with do_rmse = true (Q3_K's use).
float make_q3_quants(int n, int nmax, const float* x, int8_t* L) {
  float max = 0, amax = 0;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
  if (amax < kGroupMaxEps) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    return 0.0f;
  }
  const float iscale = -static_cast<float>(nmax) / max;
  float sumlx = 0, suml2 = 0;
  for (int i = 0; i < n; ++i) {
    int l = nearest_int(iscale * x[i]);
    l = std::max(-nmax, std::min(nmax - 1, l));
    L[i] = static_cast<int8_t>(l);
    const float w = x[i] * x[i], fl = static_cast<float>(l);
    sumlx += w * x[i] * fl;
    suml2 += w * fl * fl;
  }
  for (int itry = 0; itry < 5; ++itry) {
    int n_changed = 0;
    for (int i = 0; i < n; ++i) {
      const float w = x[i] * x[i], li = static_cast<float>(L[i]);
      float slx = sumlx - w * x[i] * li;
      if (slx > 0) {
        float sl2 = suml2 - w * li * li;
        int new_l = nearest_int(x[i] * sl2 / slx);
        new_l = std::max(-nmax, std::min(nmax - 1, new_l));
        if (new_l != L[i]) {
          const float fl = static_cast<float>(new_l);
          slx += w * x[i] * fl;
          sl2 += w * fl * fl;
          if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
            L[i] = static_cast<int8_t>(new_l);
            sumlx = slx;
            suml2 = sl2;
            ++n_changed;
          }
        }
      }
    }
    if (!n_changed) break;
  }
  for (int i = 0; i < n; ++i) L[i] = static_cast<int8_t>(L[i] + nmax);
  return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

// Q4_K / Q5_K scales and mins: 6 bits each, relative to the largest, packed as in
// kquant_common.hpp's scale_min_k4. Returns nothing; writes d, dmin and the 12 bytes.
void pack_scale_min_k4(const float* scales, const float* mins, float max_scale, float max_min, uint8_t* out,
                       uint16_t* d, uint16_t* dmin) {
  const float inv_scale = max_scale > 0 ? 63.0f / max_scale : 0.0f;
  const float inv_min = max_min > 0 ? 63.0f / max_min : 0.0f;
  for (int j = 0; j < 8; ++j) {
    uint8_t ls = static_cast<uint8_t>(nearest_int(inv_scale * scales[j]));
    uint8_t lm = static_cast<uint8_t>(nearest_int(inv_min * mins[j]));
    ls = std::min<uint8_t>(63, ls);
    lm = std::min<uint8_t>(63, lm);
    if (j < 4) {
      out[j] = ls;
      out[j + 4] = lm;
    } else {
      out[j + 4] = static_cast<uint8_t>((ls & 0x0f) | ((lm & 0x0f) << 4));
      out[j - 4] |= static_cast<uint8_t>((ls >> 4) << 6);
      out[j - 0] |= static_cast<uint8_t>((lm >> 4) << 6);
    }
  }
  *d = fp32_to_fp16(max_scale / 63.0f);
  *dmin = fp32_to_fp16(max_min / 63.0f);
}

// The (scale, min) fit of the 8 sub-blocks of 32 of a Q4_K / Q5_K super-block, then the
// quants (0..nmax) recomputed from the stored 6-bit scales and mins.
void fit_scale_min_k4(const float* x, int nmax, float rmin, int nstep, uint8_t* L, uint8_t* scales_out,
                      uint16_t* d_out, uint16_t* dmin_out) {
  float scales[8], mins[8], weights[32];
  uint8_t Laux[32];
  float max_scale = 0, max_min = 0;
  for (int j = 0; j < 8; ++j) {
    float sum_x2 = 0;
    for (int l = 0; l < 32; ++l) sum_x2 += x[32 * j + l] * x[32 * j + l];
    const float av_x = std::sqrt(sum_x2 / 32);
    for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(x[32 * j + l]);
    scales[j] = make_qkx2_quants(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j], Laux, rmin, 0.1f, nstep, false);
    if (scales[j] > max_scale) max_scale = scales[j];
    if (mins[j] > max_min) max_min = mins[j];
  }
  std::memset(scales_out, 0, 12);
  pack_scale_min_k4(scales, mins, max_scale, max_min, scales_out, d_out, dmin_out);
  for (int j = 0; j < 8; ++j) {
    uint8_t sc, m;
    kq::scale_min_k4(j, scales_out, &sc, &m);
    const float d = fp16_to_fp32(*d_out) * static_cast<float>(sc);
    if (d == 0.0f) continue;
    const float dm = fp16_to_fp32(*dmin_out) * static_cast<float>(m);
    for (int ii = 0; ii < 32; ++ii) {
      const int l = nearest_int((x[32 * j + ii] + dm) / d);
      L[32 * j + ii] = static_cast<uint8_t>(std::max(0, std::min(nmax, l)));
    }
  }
}

// Two-bit quants of 128 elements at a time into 32 bytes: byte l holds l, l+32, l+64, l+96.
template <class T>
void pack_2bit(const T* L, uint8_t* qs) {
  for (int j = 0; j < kQK_K; j += 128)
    for (int l = 0; l < 32; ++l)
      qs[j / 4 + l] = static_cast<uint8_t>(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6));
}

}  // namespace

void quantize_row_q2_k(const float* src, void* dst, int64_t n) {
  BlockQ2K* y = static_cast<BlockQ2K*>(dst);
  const float q4scale = 15.0f;
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const float* x = src + i * kQK_K;
    uint8_t L[kQK_K], Laux[16];
    float weights[16], mins[16], scales[16];
    float max_scale = 0, max_min = 0;  // the min is subtracted, so scales are >= 0
    for (int j = 0; j < 16; ++j) {
      for (int l = 0; l < 16; ++l) weights[l] = std::fabs(x[16 * j + l]);
      scales[j] = make_qkx2_quants(16, 3, x + 16 * j, weights, L + 16 * j, &mins[j], Laux, -0.5f, 0.1f, 15, true);
      if (scales[j] > max_scale) max_scale = scales[j];
      if (mins[j] > max_min) max_min = mins[j];
    }
    if (max_scale > 0) {
      const float iscale = q4scale / max_scale;
      for (int j = 0; j < 16; ++j) y[i].scales[j] = static_cast<uint8_t>(nearest_int(iscale * scales[j]));
      y[i].d = fp32_to_fp16(max_scale / q4scale);
    } else {
      for (int j = 0; j < 16; ++j) y[i].scales[j] = 0;
      y[i].d = fp32_to_fp16(0.0f);
    }
    if (max_min > 0) {
      const float iscale = q4scale / max_min;
      for (int j = 0; j < 16; ++j) y[i].scales[j] |= static_cast<uint8_t>(nearest_int(iscale * mins[j]) << 4);
      y[i].dmin = fp32_to_fp16(max_min / q4scale);
    } else {
      y[i].dmin = fp32_to_fp16(0.0f);
    }
    for (int j = 0; j < 16; ++j) {
      const float d = fp16_to_fp32(y[i].d) * static_cast<float>(y[i].scales[j] & 0x0f);
      if (d == 0.0f) continue;
      const float dm = fp16_to_fp32(y[i].dmin) * static_cast<float>(y[i].scales[j] >> 4);
      for (int ii = 0; ii < 16; ++ii) {
        const int l = nearest_int((x[16 * j + ii] + dm) / d);
        L[16 * j + ii] = static_cast<uint8_t>(std::max(0, std::min(3, l)));
      }
    }
    pack_2bit(L, y[i].qs);
  }
}

void quantize_row_q3_k(const float* src, void* dst, int64_t n) {
  BlockQ3K* y = static_cast<BlockQ3K*>(dst);
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const float* x = src + i * kQK_K;
    int8_t L[kQK_K];
    float scales[16];
    float max_scale = 0, amax = 0;
    for (int j = 0; j < 16; ++j) {
      scales[j] = make_q3_quants(16, 4, x + 16 * j, L + 16 * j);
      const float scale = std::fabs(scales[j]);
      if (scale > amax) {
        amax = scale;
        max_scale = scales[j];
      }
    }
    std::memset(y[i].scales, 0, 12);
    if (max_scale != 0.0f) {
      const float iscale = -32.0f / max_scale;
      for (int j = 0; j < 16; ++j) {
        int8_t l = static_cast<int8_t>(nearest_int(iscale * scales[j]));
        l = static_cast<int8_t>(std::max<int8_t>(-32, std::min<int8_t>(31, l)) + 32);
        if (j < 8)
          y[i].scales[j] = static_cast<uint8_t>(l & 0x0f);
        else
          y[i].scales[j - 8] |= static_cast<uint8_t>((l & 0x0f) << 4);
        l = static_cast<int8_t>(l >> 4);
        y[i].scales[j % 4 + 8] |= static_cast<uint8_t>(l << (2 * (j / 4)));
      }
      y[i].d = fp32_to_fp16(1 / iscale);
    } else {
      y[i].d = fp32_to_fp16(0.0f);
    }
    int8_t sc[16];
    kq::q3k_scales(y[i].scales, sc);
    for (int j = 0; j < 16; ++j) {
      const float d = fp16_to_fp32(y[i].d) * static_cast<float>(sc[j]);
      if (d == 0.0f) continue;
      for (int ii = 0; ii < 16; ++ii) {
        const int l = nearest_int(x[16 * j + ii] / d);
        L[16 * j + ii] = static_cast<int8_t>(std::max(-4, std::min(3, l)) + 4);
      }
    }
    // The high bit of quant j goes to bit j / 32 of hmask[j % 32]; the low two bits as Q2_K.
    std::memset(y[i].hmask, 0, sizeof y[i].hmask);
    for (int j = 0; j < kQK_K; ++j) {
      if (L[j] > 3) {
        y[i].hmask[j % 32] |= static_cast<uint8_t>(1u << (j / 32));
        L[j] = static_cast<int8_t>(L[j] - 4);
      }
    }
    pack_2bit(L, y[i].qs);
  }
}

void quantize_row_q4_k(const float* src, void* dst, int64_t n) {
  BlockQ4K* y = static_cast<BlockQ4K*>(dst);
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    uint8_t L[kQK_K];
    fit_scale_min_k4(src + i * kQK_K, 15, -1.0f, 20, L, y[i].scales, &y[i].d, &y[i].dmin);
    for (int j = 0; j < kQK_K; j += 64)
      for (int l = 0; l < 32; ++l) y[i].qs[j / 2 + l] = static_cast<uint8_t>(L[j + l] | (L[j + l + 32] << 4));
  }
}

void quantize_row_q5_k(const float* src, void* dst, int64_t n) {
  BlockQ5K* y = static_cast<BlockQ5K*>(dst);
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    uint8_t L[kQK_K];
    fit_scale_min_k4(src + i * kQK_K, 31, -0.5f, 15, L, y[i].scales, &y[i].d, &y[i].dmin);
    std::memset(y[i].qh, 0, sizeof y[i].qh);
    for (int c = 0; c < 4; ++c) {  // 64 elements: low nibbles 0..31, high nibbles 32..63
      for (int l = 0; l < 32; ++l) {
        int l1 = L[64 * c + l], l2 = L[64 * c + l + 32];
        if (l1 > 15) {
          l1 -= 16;
          y[i].qh[l] |= static_cast<uint8_t>(1u << (2 * c));
        }
        if (l2 > 15) {
          l2 -= 16;
          y[i].qh[l] |= static_cast<uint8_t>(2u << (2 * c));
        }
        y[i].qs[32 * c + l] = static_cast<uint8_t>(l1 | (l2 << 4));
      }
    }
  }
}

void quantize_row_q6_k(const float* src, void* dst, int64_t n) {
  BlockQ6K* y = static_cast<BlockQ6K*>(dst);
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const float* x = src + i * kQK_K;
    int8_t L[kQK_K];
    float scales[16];
    float max_scale = 0, max_abs_scale = 0;
    for (int ib = 0; ib < 16; ++ib) {
      const float scale = make_qx_quants_rmse1(16, 32, x + 16 * ib, L + 16 * ib);
      scales[ib] = scale;
      const float abs_scale = std::fabs(scale);
      if (abs_scale > max_abs_scale) {
        max_abs_scale = abs_scale;
        max_scale = scale;
      }
    }
    if (max_abs_scale < kGroupMaxEps) {
      std::memset(&y[i], 0, sizeof(BlockQ6K));
      continue;
    }
    const float iscale = -128.0f / max_scale;
    y[i].d = fp32_to_fp16(1 / iscale);
    for (int ib = 0; ib < 16; ++ib) y[i].scales[ib] = static_cast<int8_t>(std::min(127, nearest_int(iscale * scales[ib])));
    for (int j = 0; j < 16; ++j) {
      const float d = fp16_to_fp32(y[i].d) * static_cast<float>(y[i].scales[j]);
      if (d == 0.0f) continue;
      for (int ii = 0; ii < 16; ++ii) {
        const int l = nearest_int(x[16 * j + ii] / d);
        L[16 * j + ii] = static_cast<int8_t>(std::max(-32, std::min(31, l)) + 32);
      }
    }
    for (int h = 0; h < 2; ++h) {  // 128 elements: 64 bytes of nibbles, 32 of high bits
      const int8_t* q = L + 128 * h;
      uint8_t* ql = y[i].ql + 64 * h;
      uint8_t* qh = y[i].qh + 32 * h;
      for (int l = 0; l < 32; ++l) {
        ql[l] = static_cast<uint8_t>((q[l] & 0x0f) | ((q[l + 64] & 0x0f) << 4));
        ql[l + 32] = static_cast<uint8_t>((q[l + 32] & 0x0f) | ((q[l + 96] & 0x0f) << 4));
        qh[l] = static_cast<uint8_t>((q[l] >> 4) | ((q[l + 32] >> 4) << 2) | ((q[l + 64] >> 4) << 4) |
                                     ((q[l + 96] >> 4) << 6));
      }
    }
  }
}

}  // namespace ref
}  // namespace colibri
