// The delta rule's kernels with AVX2 (8 lanes): linear_attn_kernels_x86.hpp's template.
// No FMA: a multiply then an add, as the scalar reference, for the same bits.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <immintrin.h>

#include "model/linear_attn_kernels.hpp"
#include "model/linear_attn_kernels_x86.hpp"

namespace colibri::linattn {
namespace {

struct Avx2 {
  using reg = __m256;
  static constexpr int kBlock = 4;  // 2 x 4 accumulators of 16 registers
  static constexpr int W = 8;
  static inline __m256i mask(int64_t n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  static inline reg zero() { return _mm256_setzero_ps(); }
  static inline reg set1(float x) { return _mm256_set1_ps(x); }
  static inline reg load(const float* p) { return _mm256_loadu_ps(p); }
  static inline reg load(const float* p, int64_t n) { return _mm256_maskload_ps(p, mask(n)); }
  static inline void store(float* p, reg r) { _mm256_storeu_ps(p, r); }
  static inline void store(float* p, reg r, int64_t n) { _mm256_maskstore_ps(p, mask(n), r); }
  static inline reg add(reg a, reg b) { return _mm256_add_ps(a, b); }
  static inline reg sub(reg a, reg b) { return _mm256_sub_ps(a, b); }
  static inline reg mul(reg a, reg b) { return _mm256_mul_ps(a, b); }
};

const Kernels kAvx2{Isa::AVX2, x86::step<Avx2>, x86::row_acc<Avx2>};

}  // namespace

const Kernels* avx2_kernels() { return &kAvx2; }

}  // namespace colibri::linattn
