// AVX2 kernels of the K-quant family and Q5_0 / Q5_1 (see kquants.hpp), compiled with
// -mavx2 -mfma -mf16c -mbmi2 and run only where dispatch.cpp found those features. The dot
// kernels are the templates of kquants_x86.hpp and q5_x86.hpp with AVX2's multiply-adds.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <immintrin.h>

#include "quant/dot_tiles.hpp"
#include "quant/kquants.hpp"
#include "quant/q8_k.hpp"
#include "quant/reference.hpp"
#include "quant/row_groups.hpp"

namespace colibri {
namespace {

struct Ops {
  // acc + pairwise sums of p (int16) times s (int16): vpmaddwd, then an add.
  static __m256i madd_acc(__m256i acc, __m256i p, __m256i s) { return _mm256_add_epi32(acc, _mm256_madd_epi16(p, s)); }
  // Sum of u[i] * s[i] over each group of 4 bytes (u <= 31, so maddubs cannot saturate).
  static __m256i dot_u8_i8(__m256i u, __m256i s) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
  }
};

}  // namespace
}  // namespace colibri

#include "quant/kquants_x86.hpp"
#include "quant/q5_x86.hpp"
#include "quant/kquants_dequant_x86.hpp"

namespace colibri {
namespace {

constexpr int kGroup = 4;  // rows per pass (16 vector registers)
constexpr int kTileRowsQ5 = 2, kTileRowsK = 1, kTileTokens = 4;  // prefill tiles: rows x tokens
constexpr QuantizeRowFn kQuantizeQ8K = q8k::quantize_row_avx2;
inline const TypeKernels* base_kernels(DType type) { return avx2_kernels(type); }

#include "quant/kquants_x86_tables.hpp"

}  // namespace

const DotTile* kquant_avx2_tiles() { return kTiles; }

const TypeKernels* kquant_avx2_kernels(DType type) { return find_kernels(type); }

}  // namespace colibri
