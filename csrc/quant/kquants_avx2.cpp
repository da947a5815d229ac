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

template <class K, int64_t Block>
constexpr VecDotRowsFn rows_fn = row_groups::vec_dot_rows<K, kGroup, kGroupPrefetchAhead, Block>;
template <class K, int64_t Block>
constexpr VecDotFn dot_fn = row_groups::vec_dot<K, Block>;

using Q2 = Q2K<Ops>;
using Q3 = Q3K<Ops>;
using Q4 = Q45K<Ops, false>;
using Q5 = Q45K<Ops, true>;
using Q6 = Q6K<Ops>;

const TypeKernels kTable[] = {
    {DType::Q2_K, DType::Q8_K, dequantize_row_q2_k_x86, ref::quantize_row_q2_k, dot_fn<Q2, kQK_K>,
     q8k::quantize_row_avx2, rows_fn<Q2, kQK_K>},
    {DType::Q3_K, DType::Q8_K, dequantize_row_q3_k_x86, ref::quantize_row_q3_k, dot_fn<Q3, kQK_K>,
     q8k::quantize_row_avx2, rows_fn<Q3, kQK_K>},
    {DType::Q4_K, DType::Q8_K, dequantize_row_q45_k_x86<false>, ref::quantize_row_q4_k, dot_fn<Q4, kQK_K>,
     q8k::quantize_row_avx2, rows_fn<Q4, kQK_K>},
    {DType::Q5_K, DType::Q8_K, dequantize_row_q45_k_x86<true>, ref::quantize_row_q5_k, dot_fn<Q5, kQK_K>,
     q8k::quantize_row_avx2, rows_fn<Q5, kQK_K>},
    {DType::Q6_K, DType::Q8_K, dequantize_row_q6_k_x86, ref::quantize_row_q6_k, dot_fn<Q6, kQK_K>,
     q8k::quantize_row_avx2, rows_fn<Q6, kQK_K>},
    // Q8_0 / Q8_1 activations use kernels_avx2.cpp's quantizers (byte-identical to the reference).
    {DType::Q5_0, DType::Q8_0, dequantize_row_q5_0_x86, ref::quantize_row_q5_0, dot_fn<Q5_0<Ops>, 32>,
     avx2_kernels(DType::Q8_0)->quantize_act, rows_fn<Q5_0<Ops>, 32>},
    {DType::Q5_1, DType::Q8_1, dequantize_row_q5_1_x86, ref::quantize_row_q5_1, dot_fn<Q5_1<Ops>, 32>,
     avx2_kernels(DType::Q8_1)->quantize_act, rows_fn<Q5_1<Ops>, 32>},
    {DType::Q8_K, DType::Q8_K, q8k::dequantize_row_ref, q8k::quantize_row_avx2, nullptr, q8k::quantize_row_avx2,
     nullptr},
};

// Prefill tiles (3 rows x 3 tokens), each reproducing its vec_dot above bit for bit.
const DotTile kTiles[] = {
    {dot_fn<Q5_0<Ops>, 32>, dot_tiles::run<Q5_0<Ops>, 2, 4, 32>},
    {dot_fn<Q5_1<Ops>, 32>, dot_tiles::run<Q5_1<Ops>, 2, 4, 32>},
    {dot_fn<Q2, kQK_K>, dot_tiles::run<Q2, 1, 4, kQK_K>},
    {dot_fn<Q3, kQK_K>, dot_tiles::run<Q3, 1, 4, kQK_K>},
    {dot_fn<Q4, kQK_K>, dot_tiles::run<Q4, 1, 4, kQK_K>},
    {dot_fn<Q5, kQK_K>, dot_tiles::run<Q5, 1, 4, kQK_K>},
    {dot_fn<Q6, kQK_K>, dot_tiles::run<Q6, 1, 4, kQK_K>},
    {nullptr, nullptr},
};

}  // namespace

const DotTile* kquant_avx2_tiles() { return kTiles; }

const TypeKernels* kquant_avx2_kernels(DType type) {
  for (const TypeKernels& k : kTable)
    if (k.type == type) return &k;
  return nullptr;
}

}  // namespace colibri
