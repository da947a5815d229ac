// Scalar reference kernels of the K-quant family (see kquants.hpp): dequantization with
// the operations of gguf.quants.dequantize in its order (so the floats are bit-identical),
// and the dot products against Q8_K that define what every SIMD version computes:
//   sum over super-blocks of  d_a * d * isum  [- d_a * dmin * msum]
// with isum = sum over sub-blocks of scale * (sum of q * a) and msum = sum over sub-blocks
// of min * (activation group sums), both exact in int32: |isum| < 2^28 for every type
// (Q6_K: 16 groups * 16 * 32 * 127 * 128 = 1.3e8; Q5_K: 8 * 32 * 31 * 127 * 63 = 6.4e7).
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include "quant/kquants.hpp"

#include "quant/blocks_k.hpp"
#include "quant/fp16.hpp"
#include "quant/kquant_common.hpp"
#include "quant/q8_k.hpp"
#include "quant/reference.hpp"

namespace colibri {
namespace ref {
namespace {

// The quant of element e (0..255) of each type, from the layouts in blocks_k.hpp.
inline int q2(const BlockQ2K& b, int e) { return (b.qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3; }

inline int q3(const BlockQ3K& b, int e) {
  const int lo = (b.qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
  const int hbit = (b.hmask[e % 32] >> (4 * (e / 128) + (e % 128) / 32)) & 1;
  return lo - (hbit ? 0 : 4);
}

inline int q4(const BlockQ4K& b, int e) {
  const uint8_t v = b.qs[32 * (e / 64) + e % 32];
  return e % 64 < 32 ? (v & 0x0f) : (v >> 4);
}

inline int q5(const BlockQ5K& b, int e) {
  const uint8_t v = b.qs[32 * (e / 64) + e % 32];
  const int lo = e % 64 < 32 ? (v & 0x0f) : (v >> 4);
  const int hbit = (b.qh[e % 32] >> (2 * (e / 64) + (e % 64) / 32)) & 1;
  return lo | (hbit << 4);
}

inline int q6(const BlockQ6K& b, int e) {
  const int h = e / 128, k = (e % 128) / 32, l = e % 32;
  const uint8_t v = b.ql[64 * h + l + 32 * (k & 1)];
  const int lo = k < 2 ? (v & 0x0f) : (v >> 4);
  const int hi = (b.qh[32 * h + l] >> (2 * k)) & 3;
  return (lo | (hi << 4)) - 32;
}

}  // namespace

// ---- dequantize ------------------------------------------------------------------------

void dequantize_row_q2_k(const void* src, float* dst, int64_t n) {
  const BlockQ2K* b = static_cast<const BlockQ2K*>(src);
  for (int64_t i = 0; i < n / kQK_K; ++i, dst += kQK_K) {
    const float d = fp16_to_fp32(b[i].d), dmin = fp16_to_fp32(b[i].dmin);
    for (int e = 0; e < kQK_K; ++e) {
      const uint8_t sc = b[i].scales[e / 16];
      const float dl = d * static_cast<float>(sc & 0x0f), ml = dmin * static_cast<float>(sc >> 4);
      dst[e] = dl * static_cast<float>(q2(b[i], e)) - ml;
    }
  }
}

void dequantize_row_q3_k(const void* src, float* dst, int64_t n) {
  const BlockQ3K* b = static_cast<const BlockQ3K*>(src);
  for (int64_t i = 0; i < n / kQK_K; ++i, dst += kQK_K) {
    const float d = fp16_to_fp32(b[i].d);
    int8_t sc[16];
    kq::q3k_scales(b[i].scales, sc);
    for (int e = 0; e < kQK_K; ++e) dst[e] = (d * static_cast<float>(sc[e / 16])) * static_cast<float>(q3(b[i], e));
  }
}

void dequantize_row_q4_k(const void* src, float* dst, int64_t n) {
  const BlockQ4K* b = static_cast<const BlockQ4K*>(src);
  for (int64_t i = 0; i < n / kQK_K; ++i, dst += kQK_K) {
    const float d = fp16_to_fp32(b[i].d), dmin = fp16_to_fp32(b[i].dmin);
    for (int s = 0; s < 8; ++s) {
      uint8_t sc, m;
      kq::scale_min_k4(s, b[i].scales, &sc, &m);
      const float ds = d * static_cast<float>(sc), ms = dmin * static_cast<float>(m);
      for (int e = 32 * s; e < 32 * s + 32; ++e) dst[e] = ds * static_cast<float>(q4(b[i], e)) - ms;
    }
  }
}

void dequantize_row_q5_k(const void* src, float* dst, int64_t n) {
  const BlockQ5K* b = static_cast<const BlockQ5K*>(src);
  for (int64_t i = 0; i < n / kQK_K; ++i, dst += kQK_K) {
    const float d = fp16_to_fp32(b[i].d), dmin = fp16_to_fp32(b[i].dmin);
    for (int s = 0; s < 8; ++s) {
      uint8_t sc, m;
      kq::scale_min_k4(s, b[i].scales, &sc, &m);
      const float ds = d * static_cast<float>(sc), ms = dmin * static_cast<float>(m);
      for (int e = 32 * s; e < 32 * s + 32; ++e) dst[e] = ds * static_cast<float>(q5(b[i], e)) - ms;
    }
  }
}

void dequantize_row_q6_k(const void* src, float* dst, int64_t n) {
  const BlockQ6K* b = static_cast<const BlockQ6K*>(src);
  for (int64_t i = 0; i < n / kQK_K; ++i, dst += kQK_K) {
    const float d = fp16_to_fp32(b[i].d);
    for (int e = 0; e < kQK_K; ++e)
      dst[e] = (d * static_cast<float>(b[i].scales[e / 16])) * static_cast<float>(q6(b[i], e));
  }
}

// ---- dot products against Q8_K ---------------------------------------------------------

float vec_dot_q2_k_q8_k(int64_t n, const void* w, const void* act) {
  const BlockQ2K* x = static_cast<const BlockQ2K*>(w);
  const BlockQ8K* y = static_cast<const BlockQ8K*>(act);
  float sum = 0.0f;
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    int isum = 0, msum = 0;
    for (int g = 0; g < 16; ++g) {
      int dot = 0;
      for (int e = 16 * g; e < 16 * g + 16; ++e) dot += q2(x[i], e) * y[i].qs[e];
      isum += (x[i].scales[g] & 0x0f) * dot;
      msum += (x[i].scales[g] >> 4) * y[i].bsums[g];
    }
    const float dall = y[i].d * fp16_to_fp32(x[i].d), dmin = y[i].d * fp16_to_fp32(x[i].dmin);
    sum += dall * static_cast<float>(isum) - dmin * static_cast<float>(msum);
  }
  return sum;
}

float vec_dot_q3_k_q8_k(int64_t n, const void* w, const void* act) {
  const BlockQ3K* x = static_cast<const BlockQ3K*>(w);
  const BlockQ8K* y = static_cast<const BlockQ8K*>(act);
  float sum = 0.0f;
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    int8_t sc[16];
    kq::q3k_scales(x[i].scales, sc);
    int isum = 0;
    for (int g = 0; g < 16; ++g) {
      int dot = 0;
      for (int e = 16 * g; e < 16 * g + 16; ++e) dot += q3(x[i], e) * y[i].qs[e];
      isum += sc[g] * dot;
    }
    sum += y[i].d * fp16_to_fp32(x[i].d) * static_cast<float>(isum);
  }
  return sum;
}

namespace {

// Q4_K and Q5_K share everything but the quant: 8 sub-blocks of 32 with a scale and a min.
template <class Block, int (*Quant)(const Block&, int)>
float dot_scale_min(int64_t n, const void* w, const void* act) {
  const Block* x = static_cast<const Block*>(w);
  const BlockQ8K* y = static_cast<const BlockQ8K*>(act);
  float sum = 0.0f;
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    int isum = 0, msum = 0;
    for (int s = 0; s < 8; ++s) {
      uint8_t sc, m;
      kq::scale_min_k4(s, x[i].scales, &sc, &m);
      int dot = 0;
      for (int e = 32 * s; e < 32 * s + 32; ++e) dot += Quant(x[i], e) * y[i].qs[e];
      isum += sc * dot;
      msum += m * (y[i].bsums[2 * s] + y[i].bsums[2 * s + 1]);
    }
    const float dall = y[i].d * fp16_to_fp32(x[i].d), dmin = y[i].d * fp16_to_fp32(x[i].dmin);
    sum += dall * static_cast<float>(isum) - dmin * static_cast<float>(msum);
  }
  return sum;
}

}  // namespace

float vec_dot_q4_k_q8_k(int64_t n, const void* w, const void* act) { return dot_scale_min<BlockQ4K, q4>(n, w, act); }

float vec_dot_q5_k_q8_k(int64_t n, const void* w, const void* act) { return dot_scale_min<BlockQ5K, q5>(n, w, act); }

float vec_dot_q6_k_q8_k(int64_t n, const void* w, const void* act) {
  const BlockQ6K* x = static_cast<const BlockQ6K*>(w);
  const BlockQ8K* y = static_cast<const BlockQ8K*>(act);
  float sum = 0.0f;
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    int isum = 0;
    for (int g = 0; g < 16; ++g) {
      int dot = 0;
      for (int e = 16 * g; e < 16 * g + 16; ++e) dot += q6(x[i], e) * y[i].qs[e];
      isum += x[i].scales[g] * dot;
    }
    sum += y[i].d * fp16_to_fp32(x[i].d) * static_cast<float>(isum);
  }
  return sum;
}

// ---- table -----------------------------------------------------------------------------

namespace {

template <VecDotFn F>
void rows_each(int64_t n, const void* w, std::size_t stride, int64_t nrows, const void* act, float* out) {
  for (int64_t r = 0; r < nrows; ++r) out[r] = F(n, static_cast<const unsigned char*>(w) + r * stride, act);
}

const TypeKernels kScalar[] = {
    {DType::Q2_K, DType::Q8_K, dequantize_row_q2_k, quantize_row_q2_k, vec_dot_q2_k_q8_k, q8k::quantize_row_ref,
     rows_each<vec_dot_q2_k_q8_k>},
    {DType::Q3_K, DType::Q8_K, dequantize_row_q3_k, quantize_row_q3_k, vec_dot_q3_k_q8_k, q8k::quantize_row_ref,
     rows_each<vec_dot_q3_k_q8_k>},
    {DType::Q4_K, DType::Q8_K, dequantize_row_q4_k, quantize_row_q4_k, vec_dot_q4_k_q8_k, q8k::quantize_row_ref,
     rows_each<vec_dot_q4_k_q8_k>},
    {DType::Q5_K, DType::Q8_K, dequantize_row_q5_k, quantize_row_q5_k, vec_dot_q5_k_q8_k, q8k::quantize_row_ref,
     rows_each<vec_dot_q5_k_q8_k>},
    {DType::Q6_K, DType::Q8_K, dequantize_row_q6_k, quantize_row_q6_k, vec_dot_q6_k_q8_k, q8k::quantize_row_ref,
     rows_each<vec_dot_q6_k_q8_k>},
    {DType::Q5_0, DType::Q8_0, dequantize_row_q5_0, quantize_row_q5_0, vec_dot_q5_0_q8_0, quantize_row_q8_0,
     rows_each<vec_dot_q5_0_q8_0>},
    {DType::Q5_1, DType::Q8_1, dequantize_row_q5_1, quantize_row_q5_1, vec_dot_q5_1_q8_1, quantize_row_q8_1,
     rows_each<vec_dot_q5_1_q8_1>},
    // Q8_K is an activation format only: no weight dot product.
    {DType::Q8_K, DType::Q8_K, q8k::dequantize_row_ref, q8k::quantize_row_ref, nullptr, q8k::quantize_row_ref,
     nullptr},
};

}  // namespace
}  // namespace ref

const TypeKernels* kquant_scalar_kernels(DType type) {
  for (const TypeKernels& k : ref::kScalar)
    if (k.type == type) return &k;
  return nullptr;
}

}  // namespace colibri
