// Scalar reference kernels of the i-quants and MXFP4 (see iquants_ref.hpp for what each
// must compute). FMA contraction is off: ggml and NumPy round every multiply and add.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include "quant/iquants_ref.hpp"

#include <cmath>
#include <cstring>

#include "quant/blocks.hpp"
#include "quant/blocks_iq.hpp"
#include "quant/fp16.hpp"
#include "quant/iquant_grids.hpp"
#include "quant/q8_k.hpp"
#include "quant/reference.hpp"

namespace colibri::iq {
namespace {

inline uint32_t load_u32(const void* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline const uint8_t* grid8(const uint64_t* grid, unsigned index) {
  return reinterpret_cast<const uint8_t*>(grid + index);
}

inline float sign_of(uint8_t bits, int j) { return (bits >> j) & 1 ? -1.0f : 1.0f; }

// 8 values db * grid[j] * sign_j.
inline void put8(float* y, float db, const uint8_t* g, uint8_t signs) {
  for (int j = 0; j < 8; ++j) y[j] = db * static_cast<float>(g[j]) * sign_of(signs, j);
}

// Exact integer sum of 8 grid magnitudes times 8 activations with signs applied.
inline int dot8(const uint8_t* g, const int8_t* q8, uint8_t signs) {
  int s = 0;
  for (int j = 0; j < 8; ++j) s += ((signs >> j) & 1 ? -1 : 1) * g[j] * q8[j];
  return s;
}

}  // namespace

// ---- dequantize ------------------------------------------------------------------------

void dequantize_row_iq4_nl(const void* src, float* dst, int64_t n) {
  const BlockIQ4_NL* b = static_cast<const BlockIQ4_NL*>(src);
  const int8_t* kv = kvalues_iq4nl();
  for (int64_t i = 0; i < n / 32; ++i, dst += 32) {
    const float d = fp16_to_fp32(b[i].d);
    for (int j = 0; j < 16; ++j) {
      dst[j] = d * static_cast<float>(kv[b[i].qs[j] & 15]);
      dst[j + 16] = d * static_cast<float>(kv[b[i].qs[j] >> 4]);
    }
  }
}

void dequantize_row_iq4_xs(const void* src, float* dst, int64_t n) {
  const BlockIQ4_XS* b = static_cast<const BlockIQ4_XS*>(src);
  const int8_t* kv = kvalues_iq4nl();
  for (int64_t i = 0; i < n / kQKK; ++i) {
    const float d = fp16_to_fp32(b[i].d);
    for (int ib = 0; ib < 8; ++ib, dst += 32) {
      const int ls = ((b[i].scales_l[ib / 2] >> 4 * (ib % 2)) & 15) | (((b[i].scales_h >> 2 * ib) & 3) << 4);
      const float dl = d * static_cast<float>(ls - 32);
      const uint8_t* qs = b[i].qs + 16 * ib;
      for (int j = 0; j < 16; ++j) {
        dst[j] = dl * static_cast<float>(kv[qs[j] & 15]);
        dst[j + 16] = dl * static_cast<float>(kv[qs[j] >> 4]);
      }
    }
  }
}

void dequantize_row_iq2_xxs(const void* src, float* dst, int64_t n) {
  const BlockIQ2_XXS* b = static_cast<const BlockIQ2_XXS*>(src);
  for (int64_t i = 0; i < n / kQKK; ++i) {
    const float d = fp16_to_fp32(b[i].d);
    for (int ib = 0; ib < 8; ++ib) {
      const uint32_t idx = load_u32(b[i].qs + 4 * ib), sg = load_u32(b[i].qs + 4 * ib + 2);
      const float db = d * (0.5f + static_cast<float>(sg >> 28)) * 0.25f;
      for (int l = 0; l < 4; ++l, dst += 8)
        put8(dst, db, grid8(kIq2xxsGrid, (idx >> 8 * l) & 255), kKsignsIq2xs[(sg >> 7 * l) & 127]);
    }
  }
}

void dequantize_row_iq2_xs(const void* src, float* dst, int64_t n) {
  const BlockIQ2_XS* b = static_cast<const BlockIQ2_XS*>(src);
  for (int64_t i = 0; i < n / kQKK; ++i) {
    const float d = fp16_to_fp32(b[i].d);
    for (int ib = 0; ib < 8; ++ib) {
      const float db[2] = {d * (0.5f + static_cast<float>(b[i].scales[ib] & 15)) * 0.25f,
                           d * (0.5f + static_cast<float>(b[i].scales[ib] >> 4)) * 0.25f};
      for (int l = 0; l < 4; ++l, dst += 8) {
        const uint16_t q = b[i].qs[4 * ib + l];
        put8(dst, db[l / 2], grid8(kIq2xsGrid, q & 511), kKsignsIq2xs[q >> 9]);
      }
    }
  }
}

void dequantize_row_iq2_s(const void* src, float* dst, int64_t n) {
  const BlockIQ2_S* b = static_cast<const BlockIQ2_S*>(src);
  for (int64_t i = 0; i < n / kQKK; ++i) {
    const float d = fp16_to_fp32(b[i].d);
    const uint8_t* signs = b[i].qs + kQKK / 8;
    for (int ib = 0; ib < 8; ++ib) {
      const float db[2] = {d * (0.5f + static_cast<float>(b[i].scales[ib] & 15)) * 0.25f,
                           d * (0.5f + static_cast<float>(b[i].scales[ib] >> 4)) * 0.25f};
      for (int l = 0; l < 4; ++l, dst += 8) {
        const unsigned index = b[i].qs[4 * ib + l] | (((b[i].qh[ib] >> 2 * l) & 3u) << 8);
        put8(dst, db[l / 2], grid8(kIq2sGrid, index), signs[4 * ib + l]);
      }
    }
  }
}

void dequantize_row_iq3_xxs(const void* src, float* dst, int64_t n) {
  const BlockIQ3_XXS* b = static_cast<const BlockIQ3_XXS*>(src);
  for (int64_t i = 0; i < n / kQKK; ++i) {
    const float d = fp16_to_fp32(b[i].d);
    const uint8_t* qs = b[i].qs;
    for (int ib = 0; ib < 8; ++ib) {
      const uint32_t sg = load_u32(b[i].qs + kQKK / 4 + 4 * ib);
      const float db = d * (0.5f + static_cast<float>(sg >> 28)) * 0.5f;
      for (int l = 0; l < 4; ++l, dst += 8) {
        const uint8_t signs = kKsignsIq2xs[(sg >> 7 * l) & 127];
        const uint8_t* g1 = reinterpret_cast<const uint8_t*>(kIq3xxsGrid + qs[8 * ib + 2 * l]);
        const uint8_t* g2 = reinterpret_cast<const uint8_t*>(kIq3xxsGrid + qs[8 * ib + 2 * l + 1]);
        for (int j = 0; j < 4; ++j) {
          dst[j] = db * static_cast<float>(g1[j]) * sign_of(signs, j);
          dst[j + 4] = db * static_cast<float>(g2[j]) * sign_of(signs, j + 4);
        }
      }
    }
  }
}

void dequantize_row_iq3_s(const void* src, float* dst, int64_t n) {
  const BlockIQ3_S* b = static_cast<const BlockIQ3_S*>(src);
  for (int64_t i = 0; i < n / kQKK; ++i) {
    const float d = fp16_to_fp32(b[i].d);
    for (int ib = 0; ib < 8; ++ib) {
      const float db = d * static_cast<float>(1 + 2 * ((b[i].scales[ib / 2] >> 4 * (ib % 2)) & 15));
      for (int l = 0; l < 4; ++l, dst += 8) {
        const uint8_t signs = b[i].signs[4 * ib + l];
        const unsigned i1 = b[i].qs[8 * ib + 2 * l] | (((b[i].qh[ib] >> (2 * l)) & 1u) << 8);
        const unsigned i2 = b[i].qs[8 * ib + 2 * l + 1] | (((b[i].qh[ib] >> (2 * l + 1)) & 1u) << 8);
        const uint8_t* g1 = reinterpret_cast<const uint8_t*>(kIq3sGrid + i1);
        const uint8_t* g2 = reinterpret_cast<const uint8_t*>(kIq3sGrid + i2);
        for (int j = 0; j < 4; ++j) {
          dst[j] = db * static_cast<float>(g1[j]) * sign_of(signs, j);
          dst[j + 4] = db * static_cast<float>(g2[j]) * sign_of(signs, j + 4);
        }
      }
    }
  }
}

void dequantize_row_iq1_s(const void* src, float* dst, int64_t n) {
  const BlockIQ1_S* b = static_cast<const BlockIQ1_S*>(src);
  for (int64_t i = 0; i < n / kQKK; ++i) {
    const float d = fp16_to_fp32(b[i].d);
    for (int ib = 0; ib < 8; ++ib) {
      const uint16_t qh = b[i].qh[ib];
      const float dl = d * static_cast<float>(2 * ((qh >> 12) & 7) + 1);
      const float delta = qh & 0x8000 ? -0.125f : 0.125f;
      for (int l = 0; l < 4; ++l, dst += 8) {
        const int8_t* g = reinterpret_cast<const int8_t*>(kIq1sGrid + (b[i].qs[4 * ib + l] | (((qh >> 3 * l) & 7u) << 8)));
        for (int j = 0; j < 8; ++j) dst[j] = dl * (static_cast<float>(g[j]) + delta);
      }
    }
  }
}

void dequantize_row_iq1_m(const void* src, float* dst, int64_t n) {
  const BlockIQ1_M* b = static_cast<const BlockIQ1_M*>(src);
  for (int64_t i = 0; i < n / kQKK; ++i) {
    uint16_t sc[4];
    std::memcpy(sc, b[i].scales, sizeof sc);
    const float d = fp16_to_fp32(iq1m_scale_bits(b[i].scales));
    for (int ib = 0; ib < 8; ++ib) {
      const float dl[2] = {d * static_cast<float>(2 * ((sc[ib / 2] >> (6 * (ib % 2))) & 7) + 1),
                           d * static_cast<float>(2 * ((sc[ib / 2] >> (6 * (ib % 2) + 3)) & 7) + 1)};
      for (int l = 0; l < 4; ++l, dst += 8) {
        const unsigned h = (b[i].qh[2 * ib + l / 2] >> (4 * (l % 2))) & 15u;
        const int8_t* g = reinterpret_cast<const int8_t*>(kIq1sGrid + (b[i].qs[4 * ib + l] | ((h & 7u) << 8)));
        const float delta = h & 8 ? -0.125f : 0.125f;
        for (int j = 0; j < 8; ++j) dst[j] = dl[l / 2] * (static_cast<float>(g[j]) + delta);
      }
    }
  }
}

void dequantize_row_mxfp4(const void* src, float* dst, int64_t n) {
  const BlockMXFP4* b = static_cast<const BlockMXFP4*>(src);
  const int8_t* kv = kvalues_mxfp4();
  for (int64_t i = 0; i < n / 32; ++i, dst += 32) {
    const float d = e8m0_to_fp32_half(b[i].e);
    for (int j = 0; j < 16; ++j) {
      dst[j] = static_cast<float>(kv[b[i].qs[j] & 15]) * d;
      dst[j + 16] = static_cast<float>(kv[b[i].qs[j] >> 4]) * d;
    }
  }
}

// ---- quantize --------------------------------------------------------------------------

namespace {

// ggml's nearest_int (round half to even through the float mantissa), |v| <= 2^22.
inline int nearest_int(float v) {
  const float t = v + 12582912.0f;
  int32_t i;
  std::memcpy(&i, &t, sizeof i);
  return (i & 0x007fffff) - 0x00400000;
}

// Index of the table value nearest to x (values ascending; ties to the upper one unless
// strictly nearer the lower), as ggml's best_index_int8.
inline int best_index_int8(const int8_t* val, float x) {
  if (!(x > val[0])) return 0;  // NaN too
  if (x >= val[15]) return 15;
  int ml = 0, mu = 15;
  while (mu - ml > 1) {
    const int mav = (ml + mu) / 2;
    if (x < val[mav]) mu = mav; else ml = mav;
  }
  return x - val[mu - 1] < val[mu] - x ? mu - 1 : mu;
}

// llama.cpp's quantize_row_iq4_nl_impl without an importance matrix (weights x^2),
// ntry = 7 as in quantize_iq4_nl / quantize_iq4_xs. One call per super-block of `nsub`
// 32-blocks; nsub == 1 is IQ4_NL (scale stored directly), nsub == 8 is IQ4_XS.
void quantize_iq4_block(const float* x, int nsub, uint16_t* dh, uint8_t* q4, uint16_t* scales_h, uint8_t* scales_l) {
  constexpr int kNtry = 7;
  const int8_t* values = kvalues_iq4nl();
  uint8_t L[256];
  float scales[8];
  float weight[32];
  std::memset(q4, 0, static_cast<size_t>(nsub) * 16);
  *dh = fp32_to_fp16(0.0f);
  float max_scale = 0.0f, amax_scale = 0.0f;
  for (int ib = 0; ib < nsub; ++ib) {
    const float* xb = x + 32 * ib;
    uint8_t* Lb = L + 32 * ib;
    for (int j = 0; j < 32; ++j) weight[j] = xb[j] * xb[j];
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < 32; ++j) {
      const float ax = std::fabs(xb[j]);
      if (ax > amax) {
        amax = ax;
        max = xb[j];
      }
    }
    if (amax < 1e-15f) {  // GROUP_MAX_EPS
      scales[ib] = 0.0f;
      std::memset(Lb, 0, 32);
      continue;
    }
    float d = -max / static_cast<float>(values[0]);
    float id = 1.0f / d;
    float sumqx = 0.0f, sumq2 = 0.0f;
    for (int j = 0; j < 32; ++j) {
      const int l = best_index_int8(values, id * xb[j]);
      Lb[j] = static_cast<uint8_t>(l);
      const float q = values[l];
      const float w = weight[j];
      sumqx += w * q * xb[j];
      sumq2 += w * q * q;
    }
    d = sumq2 > 0.0f ? sumqx / sumq2 : 0.0f;
    float best = d * sumqx;
    for (int itry = -kNtry; itry <= kNtry; ++itry) {
      id = static_cast<float>(itry + values[0]) / max;
      sumqx = sumq2 = 0.0f;
      for (int j = 0; j < 32; ++j) {
        const int l = best_index_int8(values, id * xb[j]);
        const float q = values[l];
        const float w = weight[j];
        sumqx += w * q * xb[j];
        sumq2 += w * q * q;
      }
      if (sumq2 > 0.0f && sumqx * sumqx > best * sumq2) {
        d = sumqx / sumq2;
        best = d * sumqx;
      }
    }
    scales[ib] = d;
    const float abs_d = std::fabs(d);
    if (abs_d > amax_scale) {
      amax_scale = abs_d;
      max_scale = d;
    }
  }
  if (nsub > 1) {
    *scales_h = 0;
    const float d = -max_scale / 32.0f;
    *dh = fp32_to_fp16(d);
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int ib = 0; ib < nsub; ++ib) {
      int l = nearest_int(id * scales[ib]);
      l = l < -32 ? -32 : (l > 31 ? 31 : l);
      const float dl = d * static_cast<float>(l);
      const float idl = dl != 0.0f ? 1.0f / dl : 0.0f;
      for (int j = 0; j < 32; ++j) L[32 * ib + j] = static_cast<uint8_t>(best_index_int8(values, idl * x[32 * ib + j]));
      l += 32;
      const uint8_t lo = static_cast<uint8_t>(l & 15), hi = static_cast<uint8_t>(l >> 4);
      if (ib % 2 == 0) scales_l[ib / 2] = lo;
      else scales_l[ib / 2] = static_cast<uint8_t>(scales_l[ib / 2] | (lo << 4));
      *scales_h = static_cast<uint16_t>(*scales_h | (hi << 2 * ib));
    }
  } else {
    *dh = fp32_to_fp16(scales[0]);
    const float id = scales[0] != 0.0f ? 1.0f / scales[0] : 0.0f;
    for (int j = 0; j < 32; ++j) L[j] = static_cast<uint8_t>(best_index_int8(values, id * x[j]));
  }
  for (int i = 0; i < nsub; ++i)
    for (int j = 0; j < 16; ++j) q4[16 * i + j] = static_cast<uint8_t>(L[32 * i + j] | (L[32 * i + 16 + j] << 4));
}

inline int best_index_mxfp4(float x, float d) {
  const int8_t* kv = kvalues_mxfp4();
  int best = 0;
  float best_err = std::fabs(static_cast<float>(kv[0]) * d - x);
  for (int i = 1; i < 16; ++i) {
    const float err = std::fabs(static_cast<float>(kv[i]) * d - x);
    if (err < best_err) {
      best = i;
      best_err = err;
    }
  }
  return best;
}

}  // namespace

void quantize_row_iq4_nl(const float* src, void* dst, int64_t n) {
  BlockIQ4_NL* b = static_cast<BlockIQ4_NL*>(dst);
  for (int64_t i = 0; i < n / 32; ++i) quantize_iq4_block(src + 32 * i, 1, &b[i].d, b[i].qs, nullptr, nullptr);
}

void quantize_row_iq4_xs(const float* src, void* dst, int64_t n) {
  BlockIQ4_XS* b = static_cast<BlockIQ4_XS*>(dst);
  for (int64_t i = 0; i < n / kQKK; ++i)
    quantize_iq4_block(src + kQKK * i, 8, &b[i].d, b[i].qs, &b[i].scales_h, b[i].scales_l);
}

void quantize_row_mxfp4(const float* src, void* dst, int64_t n) {
  BlockMXFP4* b = static_cast<BlockMXFP4*>(dst);
  for (int64_t i = 0; i < n / 32; ++i) {
    const float* x = src + 32 * i;
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j)
      if (amax < std::fabs(x[j])) amax = std::fabs(x[j]);
    uint8_t e = 0;
    if (amax > 0.0f) {
      // ggml's (uint8_t)(floorf(log2f(amax)) - 2 + 127): finite inputs give -24..254, which
      // wrap modulo 256 as NumPy's astype(uint8) does; infinite amax saturates.
      const float v = std::floor(std::log2(amax)) - 2.0f + 127.0f;
      e = v < 1e6f ? static_cast<uint8_t>(static_cast<int>(v) & 255) : 255;
    }
    const float d = e8m0_to_fp32_half(e);
    b[i].e = e;
    for (int j = 0; j < 16; ++j)
      b[i].qs[j] = static_cast<uint8_t>(best_index_mxfp4(x[j], d) | (best_index_mxfp4(x[j + 16], d) << 4));
  }
}

// ---- dot products ----------------------------------------------------------------------

float vec_dot_iq4_nl_q8_0(int64_t n, const void* w, const void* a) {
  const BlockIQ4_NL* x = static_cast<const BlockIQ4_NL*>(w);
  const BlockQ8_0* y = static_cast<const BlockQ8_0*>(a);
  const int8_t* kv = kvalues_iq4nl();
  float sum = 0.0f;
  for (int64_t i = 0; i < n / 32; ++i) {
    const float d = fp16_to_fp32(y[i].d) * fp16_to_fp32(x[i].d);
    int isum = 0;
    for (int j = 0; j < 16; ++j) isum += y[i].qs[j] * kv[x[i].qs[j] & 15] + y[i].qs[j + 16] * kv[x[i].qs[j] >> 4];
    sum += d * static_cast<float>(isum);
  }
  return sum;
}

float vec_dot_mxfp4_q8_0(int64_t n, const void* w, const void* a) {
  const BlockMXFP4* x = static_cast<const BlockMXFP4*>(w);
  const BlockQ8_0* y = static_cast<const BlockQ8_0*>(a);
  const int8_t* kv = kvalues_mxfp4();
  float sum = 0.0f;
  for (int64_t i = 0; i < n / 32; ++i) {
    const float d = fp16_to_fp32(y[i].d) * e8m0_to_fp32_half(x[i].e);
    int isum = 0;
    for (int j = 0; j < 16; ++j) isum += y[i].qs[j] * kv[x[i].qs[j] & 15] + y[i].qs[j + 16] * kv[x[i].qs[j] >> 4];
    sum += d * static_cast<float>(isum);
  }
  return sum;
}

float vec_dot_iq4_xs_q8_k(int64_t n, const void* w, const void* a) {
  const BlockIQ4_XS* x = static_cast<const BlockIQ4_XS*>(w);
  const BlockQ8K* y = static_cast<const BlockQ8K*>(a);
  const int8_t* kv = kvalues_iq4nl();
  float sum = 0.0f;
  for (int64_t i = 0; i < n / kQKK; ++i) {
    int32_t bsum = 0;
    for (int ib = 0; ib < 8; ++ib) {
      const int ls = ((x[i].scales_l[ib / 2] >> 4 * (ib % 2)) & 15) | (((x[i].scales_h >> 2 * ib) & 3) << 4);
      const uint8_t* qs = x[i].qs + 16 * ib;
      const int8_t* q8 = y[i].qs + 32 * ib;
      int s = 0;
      for (int j = 0; j < 16; ++j) s += q8[j] * kv[qs[j] & 15] + q8[j + 16] * kv[qs[j] >> 4];
      bsum += (ls - 32) * s;
    }
    sum += fp16_to_fp32(x[i].d) * y[i].d * static_cast<float>(bsum);
  }
  return sum;
}

float vec_dot_iq2_xxs_q8_k(int64_t n, const void* w, const void* a) {
  const BlockIQ2_XXS* x = static_cast<const BlockIQ2_XXS*>(w);
  const BlockQ8K* y = static_cast<const BlockQ8K*>(a);
  float sum = 0.0f;
  for (int64_t i = 0; i < n / kQKK; ++i) {
    int32_t bsum = 0;
    for (int ib = 0; ib < 8; ++ib) {
      const uint32_t idx = load_u32(x[i].qs + 4 * ib), sg = load_u32(x[i].qs + 4 * ib + 2);
      int s = 0;
      for (int l = 0; l < 4; ++l)
        s += dot8(grid8(kIq2xxsGrid, (idx >> 8 * l) & 255), y[i].qs + 32 * ib + 8 * l, kKsignsIq2xs[(sg >> 7 * l) & 127]);
      bsum += static_cast<int32_t>(2 * (sg >> 28) + 1) * s;
    }
    sum += fp16_to_fp32(x[i].d) * y[i].d * static_cast<float>(bsum);
  }
  return 0.125f * sum;
}

float vec_dot_iq2_xs_q8_k(int64_t n, const void* w, const void* a) {
  const BlockIQ2_XS* x = static_cast<const BlockIQ2_XS*>(w);
  const BlockQ8K* y = static_cast<const BlockQ8K*>(a);
  float sum = 0.0f;
  for (int64_t i = 0; i < n / kQKK; ++i) {
    int32_t bsum = 0;
    for (int ib = 0; ib < 8; ++ib) {
      const int ls[2] = {2 * (x[i].scales[ib] & 15) + 1, 2 * (x[i].scales[ib] >> 4) + 1};
      for (int l = 0; l < 4; ++l) {
        const uint16_t q = x[i].qs[4 * ib + l];
        bsum += ls[l / 2] * dot8(grid8(kIq2xsGrid, q & 511), y[i].qs + 32 * ib + 8 * l, kKsignsIq2xs[q >> 9]);
      }
    }
    sum += fp16_to_fp32(x[i].d) * y[i].d * static_cast<float>(bsum);
  }
  return 0.125f * sum;
}

float vec_dot_iq2_s_q8_k(int64_t n, const void* w, const void* a) {
  const BlockIQ2_S* x = static_cast<const BlockIQ2_S*>(w);
  const BlockQ8K* y = static_cast<const BlockQ8K*>(a);
  float sum = 0.0f;
  for (int64_t i = 0; i < n / kQKK; ++i) {
    const uint8_t* signs = x[i].qs + kQKK / 8;
    int32_t bsum = 0;
    for (int ib = 0; ib < 8; ++ib) {
      const int ls[2] = {2 * (x[i].scales[ib] & 15) + 1, 2 * (x[i].scales[ib] >> 4) + 1};
      for (int l = 0; l < 4; ++l) {
        const unsigned index = x[i].qs[4 * ib + l] | (((x[i].qh[ib] >> 2 * l) & 3u) << 8);
        bsum += ls[l / 2] * dot8(grid8(kIq2sGrid, index), y[i].qs + 32 * ib + 8 * l, signs[4 * ib + l]);
      }
    }
    sum += fp16_to_fp32(x[i].d) * y[i].d * static_cast<float>(bsum);
  }
  return 0.125f * sum;
}

float vec_dot_iq3_xxs_q8_k(int64_t n, const void* w, const void* a) {
  const BlockIQ3_XXS* x = static_cast<const BlockIQ3_XXS*>(w);
  const BlockQ8K* y = static_cast<const BlockQ8K*>(a);
  float sum = 0.0f;
  for (int64_t i = 0; i < n / kQKK; ++i) {
    int32_t bsum = 0;
    for (int ib = 0; ib < 8; ++ib) {
      const uint32_t sg = load_u32(x[i].qs + kQKK / 4 + 4 * ib);
      int s = 0;
      for (int l = 0; l < 4; ++l) {
        uint8_t g[8];
        std::memcpy(g, kIq3xxsGrid + x[i].qs[8 * ib + 2 * l], 4);
        std::memcpy(g + 4, kIq3xxsGrid + x[i].qs[8 * ib + 2 * l + 1], 4);
        s += dot8(g, y[i].qs + 32 * ib + 8 * l, kKsignsIq2xs[(sg >> 7 * l) & 127]);
      }
      bsum += static_cast<int32_t>(2 * (sg >> 28) + 1) * s;
    }
    sum += fp16_to_fp32(x[i].d) * y[i].d * static_cast<float>(bsum);
  }
  return 0.25f * sum;
}

float vec_dot_iq3_s_q8_k(int64_t n, const void* w, const void* a) {
  const BlockIQ3_S* x = static_cast<const BlockIQ3_S*>(w);
  const BlockQ8K* y = static_cast<const BlockQ8K*>(a);
  float sum = 0.0f;
  for (int64_t i = 0; i < n / kQKK; ++i) {
    int32_t bsum = 0;
    for (int ib = 0; ib < 8; ++ib) {
      const int ls = 2 * ((x[i].scales[ib / 2] >> 4 * (ib % 2)) & 15) + 1;
      int s = 0;
      for (int l = 0; l < 4; ++l) {
        const unsigned i1 = x[i].qs[8 * ib + 2 * l] | (((x[i].qh[ib] >> (2 * l)) & 1u) << 8);
        const unsigned i2 = x[i].qs[8 * ib + 2 * l + 1] | (((x[i].qh[ib] >> (2 * l + 1)) & 1u) << 8);
        uint8_t g[8];
        std::memcpy(g, kIq3sGrid + i1, 4);
        std::memcpy(g + 4, kIq3sGrid + i2, 4);
        s += dot8(g, y[i].qs + 32 * ib + 8 * l, x[i].signs[4 * ib + l]);
      }
      bsum += ls * s;
    }
    sum += fp16_to_fp32(x[i].d) * y[i].d * static_cast<float>(bsum);
  }
  return sum;
}

float vec_dot_iq1_s_q8_k(int64_t n, const void* w, const void* a) {
  const BlockIQ1_S* x = static_cast<const BlockIQ1_S*>(w);
  const BlockQ8K* y = static_cast<const BlockQ8K*>(a);
  float sum = 0.0f;
  for (int64_t i = 0; i < n / kQKK; ++i) {
    int32_t sumi = 0, sumd = 0;  // grid part; delta part (sum of activations, signed)
    for (int ib = 0; ib < 8; ++ib) {
      const uint16_t qh = x[i].qh[ib];
      const int ls = 2 * ((qh >> 12) & 7) + 1;
      const int delta = qh & 0x8000 ? -1 : 1;
      int s = 0;
      for (int l = 0; l < 4; ++l) {
        const int8_t* g = reinterpret_cast<const int8_t*>(kIq1sGrid + (x[i].qs[4 * ib + l] | (((qh >> 3 * l) & 7u) << 8)));
        const int8_t* q8 = y[i].qs + 32 * ib + 8 * l;
        for (int j = 0; j < 8; ++j) s += g[j] * q8[j];
      }
      sumi += ls * s;
      sumd += ls * delta * (y[i].bsums[2 * ib] + y[i].bsums[2 * ib + 1]);
    }
    sum += fp16_to_fp32(x[i].d) * y[i].d * (static_cast<float>(sumi) + 0.125f * static_cast<float>(sumd));
  }
  return sum;
}

float vec_dot_iq1_m_q8_k(int64_t n, const void* w, const void* a) {
  const BlockIQ1_M* x = static_cast<const BlockIQ1_M*>(w);
  const BlockQ8K* y = static_cast<const BlockQ8K*>(a);
  float sum = 0.0f;
  for (int64_t i = 0; i < n / kQKK; ++i) {
    uint16_t sc[4];
    std::memcpy(sc, x[i].scales, sizeof sc);
    int32_t sumi = 0, sumd = 0;
    for (int ib = 0; ib < 8; ++ib) {
      const int ls[2] = {2 * ((sc[ib / 2] >> (6 * (ib % 2))) & 7) + 1, 2 * ((sc[ib / 2] >> (6 * (ib % 2) + 3)) & 7) + 1};
      for (int l = 0; l < 4; ++l) {
        const unsigned h = (x[i].qh[2 * ib + l / 2] >> (4 * (l % 2))) & 15u;
        const int8_t* g = reinterpret_cast<const int8_t*>(kIq1sGrid + (x[i].qs[4 * ib + l] | ((h & 7u) << 8)));
        const int8_t* q8 = y[i].qs + 32 * ib + 8 * l;
        int s = 0, t = 0;
        for (int j = 0; j < 8; ++j) {
          s += g[j] * q8[j];
          t += q8[j];
        }
        sumi += ls[l / 2] * s;
        sumd += ls[l / 2] * (h & 8 ? -t : t);
      }
    }
    sum += fp16_to_fp32(iq1m_scale_bits(x[i].scales)) * y[i].d * (static_cast<float>(sumi) + 0.125f * static_cast<float>(sumd));
  }
  return sum;
}

// ---- table -----------------------------------------------------------------------------

namespace {

template <VecDotFn F>
void rows_each(int64_t n, const void* w, std::size_t stride, int64_t nrows, const void* act, float* out) {
  for (int64_t r = 0; r < nrows; ++r) out[r] = F(n, static_cast<const unsigned char*>(w) + r * stride, act);
}

void quantize_row_q8_0(const float* src, void* dst, int64_t n) {
  ref::scalar_kernels(DType::Q8_0)->quantize_row(src, dst, n);
}

}  // namespace

const TypeKernels* scalar_kernels(DType type) {
  static const TypeKernels kTable[] = {
      {DType::IQ4_NL, DType::Q8_0, dequantize_row_iq4_nl, quantize_row_iq4_nl, vec_dot_iq4_nl_q8_0,
       quantize_row_q8_0, rows_each<vec_dot_iq4_nl_q8_0>},
      {DType::MXFP4, DType::Q8_0, dequantize_row_mxfp4, quantize_row_mxfp4, vec_dot_mxfp4_q8_0, quantize_row_q8_0,
       rows_each<vec_dot_mxfp4_q8_0>},
      {DType::IQ4_XS, DType::Q8_K, dequantize_row_iq4_xs, quantize_row_iq4_xs, vec_dot_iq4_xs_q8_k,
       q8k::quantize_row_ref, rows_each<vec_dot_iq4_xs_q8_k>},
      {DType::IQ2_XXS, DType::Q8_K, dequantize_row_iq2_xxs, low_bit_quantizer(DType::IQ2_XXS), vec_dot_iq2_xxs_q8_k,
       q8k::quantize_row_ref, rows_each<vec_dot_iq2_xxs_q8_k>},
      {DType::IQ2_XS, DType::Q8_K, dequantize_row_iq2_xs, low_bit_quantizer(DType::IQ2_XS), vec_dot_iq2_xs_q8_k,
       q8k::quantize_row_ref, rows_each<vec_dot_iq2_xs_q8_k>},
      {DType::IQ2_S, DType::Q8_K, dequantize_row_iq2_s, low_bit_quantizer(DType::IQ2_S), vec_dot_iq2_s_q8_k,
       q8k::quantize_row_ref, rows_each<vec_dot_iq2_s_q8_k>},
      {DType::IQ3_XXS, DType::Q8_K, dequantize_row_iq3_xxs, low_bit_quantizer(DType::IQ3_XXS), vec_dot_iq3_xxs_q8_k,
       q8k::quantize_row_ref, rows_each<vec_dot_iq3_xxs_q8_k>},
      {DType::IQ3_S, DType::Q8_K, dequantize_row_iq3_s, low_bit_quantizer(DType::IQ3_S), vec_dot_iq3_s_q8_k,
       q8k::quantize_row_ref, rows_each<vec_dot_iq3_s_q8_k>},
      {DType::IQ1_S, DType::Q8_K, dequantize_row_iq1_s, low_bit_quantizer(DType::IQ1_S), vec_dot_iq1_s_q8_k,
       q8k::quantize_row_ref, rows_each<vec_dot_iq1_s_q8_k>},
      {DType::IQ1_M, DType::Q8_K, dequantize_row_iq1_m, low_bit_quantizer(DType::IQ1_M), vec_dot_iq1_m_q8_k,
       q8k::quantize_row_ref, rows_each<vec_dot_iq1_m_q8_k>},
      // Q8_K is an activation format only (quant/q8_k.hpp): no weight dot product.
  };
  for (const TypeKernels& k : kTable)
    if (k.type == type) return &k;
  return nullptr;
}

}  // namespace colibri::iq
