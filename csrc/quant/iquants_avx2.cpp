// AVX2 kernels of the i-quants and MXFP4 (compiled with -mavx2 -mfma -mf16c -mbmi2; run only
// when the CPU has them): the templates of iquants_x86.hpp with AVX2's multiply-adds.
// Scalar reference: quant/iquants_ref.cpp.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <immintrin.h>

#include "quant/q8_k.hpp"
#include "quant/reference.hpp"

namespace colibri {
namespace {

struct Ops {
  // acc + pairwise sums of p (int16) times s (int16): vpmaddwd, then an add.
  static __m256i madd_acc(__m256i acc, __m256i p, __m256i s) { return _mm256_add_epi32(acc, _mm256_madd_epi16(p, s)); }
  // Sum of u[i] * s[i] over each group of 4 bytes (vpmaddubsw, then vpmaddwd by ones).
  static __m256i dot_u8_i8(__m256i u, __m256i s) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
  }
  // q8 with byte j negated where bit j % 8 of byte j / 8 of `bits`' 32-bit lane k is set: that
  // lane's bytes spread over the 32 bytes (vpshufb within the 128-bit half holding it), a
  // byte mask by compare, then (q8 ^ m) - m. k is a constant once inlined.
  static __m256i negate_where(__m256i q8, __m256i bits, int k) {
    const __m256i half = k < 4 ? _mm256_permute4x64_epi64(bits, 0x44) : _mm256_permute4x64_epi64(bits, 0xee);
    const __m256i spread = _mm256_add_epi8(_mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0),
                                           _mm256_set1_epi8(static_cast<char>(4 * (k & 3))));
    const __m256i sel = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ull));
    const __m256i m = _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(half, spread), sel), sel);
    return _mm256_sub_epi8(_mm256_xor_si256(q8, m), m);
  }
  // Two 32-weight sub-blocks of a grid type (iquants_grid_x86.hpp), one accumulator each:
  // acc + (unsigned grid bytes g0 | g1 . the 64 activations at q8, negated where the 32-bit
  // lanes k | k + 1 of `bits` say) per pair, times the int16 scales ls0 | ls1.
  struct Acc {
    __m256i lo, hi;
  };
  static Acc acc_zero() { return {_mm256_setzero_si256(), _mm256_setzero_si256()}; }
  static __m256i acc_fold(Acc a) { return _mm256_add_epi32(a.lo, a.hi); }
  static Acc pair_dot(Acc acc, __m256i g0, __m256i g1, const int8_t* q8, __m256i bits, int k, __m256i ls0, __m256i ls1) {
    const __m256i a0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q8));
    const __m256i a1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q8 + 32));
    acc.lo = madd_acc(acc.lo, _mm256_maddubs_epi16(g0, negate_where(a0, bits, k)), ls0);
    acc.hi = madd_acc(acc.hi, _mm256_maddubs_epi16(g1, negate_where(a1, bits, k + 1)), ls1);
    return acc;
  }
  // Two sub-blocks of unsigned weight bytes u0 | u1 (IQ1_*): acc + (u . the 64 activations at
  // q8) per pair, times the int16 scales ls0 | ls1.
  static Acc pair_madd(Acc acc, __m256i u0, __m256i u1, const int8_t* q8, __m256i ls0, __m256i ls1) {
    const __m256i a0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q8));
    const __m256i a1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q8 + 32));
    acc.lo = madd_acc(acc.lo, _mm256_maddubs_epi16(u0, a0), ls0);
    acc.hi = madd_acc(acc.hi, _mm256_maddubs_epi16(u1, a1), ls1);
    return acc;
  }
  // IQ2_XXS's signs from a 128-entry table of sign bytes (measured faster here than
  // negate_where; iquants_grid_x86.hpp).
  static constexpr bool kEvenSignsByTable = true;
};

constexpr int kTileRowsIq4nl = 2, kTileRowsIq4xs = 2, kTileTokens = 4;  // prefill tiles (16 ymm)
constexpr QuantizeRowFn kQuantizeQ8K = q8k::quantize_row_avx2;
inline const TypeKernels* base_kernels(DType type) { return avx2_kernels(type); }

}  // namespace
}  // namespace colibri

#include "quant/iquants_x86.hpp"

namespace colibri {

const TypeKernels* iq_avx2_kernels(DType type) { return table(type); }
const DotTile* iq_avx2_tiles() { return kTiles; }

}  // namespace colibri
