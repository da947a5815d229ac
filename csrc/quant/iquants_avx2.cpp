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
