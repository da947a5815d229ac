// AVX-512 kernels of the K-quant family and Q5_0 / Q5_1 (see kquants.hpp), compiled with the
// AVX-512 F/BW/VL/DQ + VNNI flags and run only where dispatch.cpp found them. The dot kernels
// are the templates of kquants_x86.hpp and q5_x86.hpp with VNNI's fused multiply-accumulate
// (vpdpwssd / vpdpbusd on ymm, from AVX512-VL): the integer results are the same as AVX2's
// (no product or sum here can overflow, and neither form saturates at these ranges), so
// these kernels compute exactly what the AVX2 ones do, which are bit-identical to the scalar
// reference for the K-quants. Not run on the development host (no AVX-512 there).
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
  // acc + pairwise sums of p (int16) times s (int16), in one vpdpwssd.
  static __m256i madd_acc(__m256i acc, __m256i p, __m256i s) { return _mm256_dpwssd_epi32(acc, p, s); }
  // Sum of u[i] * s[i] over each group of 4 bytes, in one vpdpbusd.
  static __m256i dot_u8_i8(__m256i u, __m256i s) { return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s); }
};

}  // namespace
}  // namespace colibri

#include "quant/kquants_x86.hpp"
#include "quant/q5_x86.hpp"
#include "quant/kquants_dequant_x86.hpp"

namespace colibri {
namespace {

constexpr int kGroup = 8;  // rows per pass (32 vector registers)

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
     q8k::quantize_row_avx512, rows_fn<Q2, kQK_K>},
    {DType::Q3_K, DType::Q8_K, dequantize_row_q3_k_x86, ref::quantize_row_q3_k, dot_fn<Q3, kQK_K>,
     q8k::quantize_row_avx512, rows_fn<Q3, kQK_K>},
    {DType::Q4_K, DType::Q8_K, dequantize_row_q45_k_x86<false>, ref::quantize_row_q4_k, dot_fn<Q4, kQK_K>,
     q8k::quantize_row_avx512, rows_fn<Q4, kQK_K>},
    {DType::Q5_K, DType::Q8_K, dequantize_row_q45_k_x86<true>, ref::quantize_row_q5_k, dot_fn<Q5, kQK_K>,
     q8k::quantize_row_avx512, rows_fn<Q5, kQK_K>},
    {DType::Q6_K, DType::Q8_K, dequantize_row_q6_k_x86, ref::quantize_row_q6_k, dot_fn<Q6, kQK_K>,
     q8k::quantize_row_avx512, rows_fn<Q6, kQK_K>},
    // Q8_0 / Q8_1 activations use kernels_avx512.cpp's quantizers (byte-identical to the reference).
    {DType::Q5_0, DType::Q8_0, dequantize_row_q5_0_x86, ref::quantize_row_q5_0, dot_fn<Q5_0<Ops>, 32>,
     avx512_kernels(DType::Q8_0)->quantize_act, rows_fn<Q5_0<Ops>, 32>},
    {DType::Q5_1, DType::Q8_1, dequantize_row_q5_1_x86, ref::quantize_row_q5_1, dot_fn<Q5_1<Ops>, 32>,
     avx512_kernels(DType::Q8_1)->quantize_act, rows_fn<Q5_1<Ops>, 32>},
    {DType::Q8_K, DType::Q8_K, q8k::dequantize_row_ref, q8k::quantize_row_avx512, nullptr, q8k::quantize_row_avx512,
     nullptr},
};

// Prefill tiles (4 rows x 4 tokens), each reproducing its vec_dot above bit for bit.
const DotTile kTiles[] = {
    {dot_fn<Q5_0<Ops>, 32>, dot_tiles::run<Q5_0<Ops>, 4, 4, 32>},
    {dot_fn<Q5_1<Ops>, 32>, dot_tiles::run<Q5_1<Ops>, 4, 4, 32>},
    {dot_fn<Q2, kQK_K>, dot_tiles::run<Q2, 2, 4, kQK_K>},
    {dot_fn<Q3, kQK_K>, dot_tiles::run<Q3, 2, 4, kQK_K>},
    {dot_fn<Q4, kQK_K>, dot_tiles::run<Q4, 2, 4, kQK_K>},
    {dot_fn<Q5, kQK_K>, dot_tiles::run<Q5, 2, 4, kQK_K>},
    {dot_fn<Q6, kQK_K>, dot_tiles::run<Q6, 2, 4, kQK_K>},
    {nullptr, nullptr},
};

}  // namespace

const DotTile* kquant_avx512_tiles() { return kTiles; }

const TypeKernels* kquant_avx512_kernels(DType type) {
  for (const TypeKernels& k : kTable)
    if (k.type == type) return &k;
  return nullptr;
}

}  // namespace colibri
