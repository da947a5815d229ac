// AVX-512 (F/BW/VL/DQ) attention kernels, compiled with the flags of quant's AVX-512 file
// and run only where the CPU has them (dispatch: quant/dispatch.cpp). Same structure as
// attn_avx2.cpp with 16 lanes: a score is 16 lanes of FMA partial sums (a tail of
// dk % 16 is zero-padded by a masked load), folded to 8 (lane i + lane i + 8) and reduced by
// the AVX2 tree; an output element is o * alpha then one FMA per key in key order. Rows are
// converted on load as in the AVX2 file (_mm512_cvtph_ps for F16).
// Checked against the scalar reference by tests/kernels/test_attention_kernels.py where it runs
// (the AVX-512 development VMs).
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "attention/attention.hpp"
#include "attention/kernels.hpp"
#include "quant/blocks.hpp"

namespace colibri::attn {
namespace {

static_assert(kBlockKeys % 16 == 0, "softmax_block loads whole vectors");

inline __m512 exp16(__m512 x) {
  const __m512 lo = _mm512_set1_ps(-87.33654f);
  const __mmask16 keep = _mm512_cmp_ps_mask(x, lo, _CMP_GE_OQ);  // x < lo, -inf (and NaN): 0
  x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.0f)), lo);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 y = _mm512_set1_ps(1.9875691500e-4f);
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.3981999507e-3f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(8.3334519073e-3f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.1665795894e-2f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.6666665459e-1f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(5.0000001201e-1f));
  y = _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), r);
  y = _mm512_add_ps(y, _mm512_set1_ps(1.0f));
  const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_maskz_mov_ps(keep, _mm512_mul_ps(y, _mm512_castsi512_ps(e)));
}

inline __m256 fold(__m512 v) { return _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1)); }

// Lane i: the tree sum of a[i] (16 lanes folded to 8, then the 8-lane tree).
inline __m256 hsum8(const __m512* a) {
  __m256 f[8];
  COLIBRI_UNROLL for (int i = 0; i < 8; ++i) f[i] = fold(a[i]);
  const __m256 g0 = _mm256_hadd_ps(_mm256_hadd_ps(f[0], f[1]), _mm256_hadd_ps(f[2], f[3]));
  const __m256 g1 = _mm256_hadd_ps(_mm256_hadd_ps(f[4], f[5]), _mm256_hadd_ps(f[6], f[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(g0, g1, 0x20), _mm256_permute2f128_ps(g0, g1, 0x31));
}

inline float hsum1(__m512 v) {
  const __m512 z = _mm512_setzero_ps();
  const __m512 a[8] = {v, z, z, z, z, z, z, z};
  return _mm256_cvtss_f32(hsum8(a));
}

inline __mmask16 lanes(int64_t n) { return static_cast<__mmask16>(n >= 16 ? 0xffff : (1u << n) - 1); }

// How each cache type is read: the elements of a row at [i, i + 16) lanes set in m, as
// F32 (exact), zeros elsewhere (masked loads never touch the bytes of unset lanes).
struct F32Elems {
  static inline __m512 load(const unsigned char* row, int64_t i, __mmask16 m) {
    return _mm512_maskz_loadu_ps(m, reinterpret_cast<const float*>(row) + i);
  }
};

struct F16Elems {
  static inline __m512 load(const unsigned char* row, int64_t i, __mmask16 m) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, row + 2 * i));
  }
};

struct BF16Elems {
  static inline __m512 load(const unsigned char* row, int64_t i, __mmask16 m) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, row + 2 * i)), 16));
  }
};

// Q8_0: i is a multiple of 16 and the row whole blocks of 32, so the 16 elements lie in one
// block and m is full. q * d is exact in F32 (an 8-bit integer times an 11-bit mantissa).
struct Q8Elems {
  static inline __m512 load(const unsigned char* row, int64_t i, __mmask16 m) {
    const unsigned char* block = row + (i / kQK) * static_cast<int64_t>(sizeof(BlockQ8_0));
    uint16_t d;
    std::memcpy(&d, block + offsetof(BlockQ8_0, d), sizeof d);
    const __m128i q = _mm_maskz_loadu_epi8(m, block + offsetof(BlockQ8_0, qs) + i % kQK);
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)),
                         _mm512_cvtph_ps(_mm256_set1_epi16(static_cast<short>(d))));
  }
};

// Scores of R query rows against C keys (R * C <= 8 accumulators).
template <class E, int R, int C>
inline void score_tile(const float* q, int64_t qs, const unsigned char* k, int64_t ks, int64_t dk, float scale,
                       float* s, int64_t ld) {
  static_assert(R * C <= 8, "one reduction of 8 sums");
  __m512 acc[8];
  COLIBRI_UNROLL for (int i = 0; i < 8; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t i = 0; i < dk; i += 16) {
    const __mmask16 m = lanes(dk - i);
    __m512 qv[R];
    COLIBRI_UNROLL for (int r = 0; r < R; ++r) qv[r] = _mm512_maskz_loadu_ps(m, q + r * qs + i);
    COLIBRI_UNROLL for (int c = 0; c < C; ++c) {
      const __m512 kv = E::load(k + c * ks, i, m);
      COLIBRI_UNROLL for (int r = 0; r < R; ++r) acc[r * C + c] = _mm512_fmadd_ps(qv[r], kv, acc[r * C + c]);
    }
  }
  alignas(32) float out[8];
  _mm256_store_ps(out, _mm256_mul_ps(hsum8(acc), _mm256_set1_ps(scale)));
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
  constexpr int kVecs = kBlockKeys / 16;
  __m512 v[kVecs];
  __m512 mx = _mm512_set1_ps(*m);
  COLIBRI_UNROLL for (int i = 0; i < kVecs; ++i) {
    v[i] = _mm512_loadu_ps(s + 16 * i);
    mx = _mm512_max_ps(mx, v[i]);
  }
  const float m_new = _mm512_reduce_max_ps(mx);
  const float alpha = _mm512_cvtss_f32(exp16(_mm512_set1_ps(*m - m_new)));
  const __m512 mn = _mm512_set1_ps(m_new);
  __m512 sum = _mm512_setzero_ps();
  COLIBRI_UNROLL for (int i = 0; i < kVecs; ++i) {
    const __m512 p = exp16(_mm512_sub_ps(v[i], mn));
    _mm512_storeu_ps(s + 16 * i, p);
    sum = _mm512_add_ps(sum, p);
  }
  *l = *l * alpha + hsum1(sum);
  *m = m_new;
  return alpha;
}

// Output dims [d0, d0 + 16 * NC) of R rows; the last vector's lanes are `tail`.
template <class E, int R, int NC>
inline void pv_tile(float* o, int64_t os, const float* p, int64_t ps, const float* alpha, const Rows& v, int64_t d0,
                    int64_t n_keys, __mmask16 tail, bool prefetch) {
  __m512 acc[R][NC];
  COLIBRI_UNROLL for (int r = 0; r < R; ++r) {
    COLIBRI_UNROLL for (int c = 0; c < NC; ++c)
      acc[r][c] = _mm512_maskz_loadu_ps(c == NC - 1 ? tail : static_cast<__mmask16>(0xffff), o + r * os + 16 * c);
    if (alpha) {
      const __m512 a = _mm512_set1_ps(alpha[r]);
      COLIBRI_UNROLL for (int c = 0; c < NC; ++c) acc[r][c] = _mm512_mul_ps(acc[r][c], a);
    }
  }
  for (int64_t j = 0; j < n_keys; ++j) {
    if (prefetch) prefetch_ahead(v, j);
    const unsigned char* row = v.data + j * v.stride;
    __m512 pj[R];
    COLIBRI_UNROLL for (int r = 0; r < R; ++r) pj[r] = _mm512_set1_ps(p[r * ps + j]);
    COLIBRI_UNROLL for (int c = 0; c < NC; ++c) {
      const __m512 vv = E::load(row, d0 + 16 * c, c == NC - 1 ? tail : static_cast<__mmask16>(0xffff));
      COLIBRI_UNROLL for (int r = 0; r < R; ++r) acc[r][c] = _mm512_fmadd_ps(pj[r], vv, acc[r][c]);
    }
  }
  COLIBRI_UNROLL for (int r = 0; r < R; ++r)
    COLIBRI_UNROLL for (int c = 0; c < NC; ++c)
      _mm512_mask_storeu_ps(o + r * os + 16 * c, c == NC - 1 ? tail : static_cast<__mmask16>(0xffff), acc[r][c]);
}

// R rows (1..4): 16 * NC output dims at a time, every key's value row read once per pass.
template <class E, int R>
void pv_rows(float* o, int64_t os, const float* p, int64_t ps, const float* alpha, const Rows& v, int64_t n_keys,
             int64_t dv, bool prefetch) {
  constexpr int NC = R <= 2 ? 4 : 2;
  for (int64_t d0 = 0; d0 < dv; d0 += 16 * NC) {
    const int64_t left = dv - d0;
    const __mmask16 tail = lanes(left >= 16 * NC ? 16 : (left - 1) % 16 + 1);
    switch (left >= 16 * NC ? NC : (left + 15) / 16) {
      case 1: pv_tile<E, R, 1>(o + d0, os, p, ps, alpha, v, d0, n_keys, tail, prefetch); break;
      case 2: pv_tile<E, R, 2>(o + d0, os, p, ps, alpha, v, d0, n_keys, tail, prefetch); break;
      case 3: pv_tile<E, R, NC < 3 ? NC : 3>(o + d0, os, p, ps, alpha, v, d0, n_keys, tail, prefetch); break;
      default: pv_tile<E, R, NC>(o + d0, os, p, ps, alpha, v, d0, n_keys, tail, prefetch); break;
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

const Kernels kAvx512{Isa::AVX512, scores, softmax_block, pv};

}  // namespace

const Kernels* avx512_kernels() { return &kAvx512; }

}  // namespace colibri::attn
