// The delta rule's kernels with AVX-512F (16 lanes): linear_attn_kernels_x86.hpp's
// template. No FMA: a multiply then an add, as the scalar reference, for the same bits.
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

struct Avx512 {
  using reg = __m512;
  static constexpr int kBlock = 8;  // 2 x 8 accumulators of 32 registers
  static constexpr int W = 16;
  static inline __mmask16 mask(int64_t n) { return static_cast<__mmask16>((1u << n) - 1); }
  static inline reg zero() { return _mm512_setzero_ps(); }
  static inline reg set1(float x) { return _mm512_set1_ps(x); }
  static inline reg load(const float* p) { return _mm512_loadu_ps(p); }
  static inline reg load(const float* p, int64_t n) { return _mm512_maskz_loadu_ps(mask(n), p); }
  static inline void store(float* p, reg r) { _mm512_storeu_ps(p, r); }
  static inline void store(float* p, reg r, int64_t n) { _mm512_mask_storeu_ps(p, mask(n), r); }
  static inline reg add(reg a, reg b) { return _mm512_add_ps(a, b); }
  static inline reg sub(reg a, reg b) { return _mm512_sub_ps(a, b); }
  static inline reg mul(reg a, reg b) { return _mm512_mul_ps(a, b); }
};

const Kernels kAvx512{Isa::AVX512, x86::step<Avx512>, x86::row_acc<Avx512>};

}  // namespace

const Kernels* avx512_kernels() { return &kAvx512; }

}  // namespace colibri::linattn
