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
constexpr int kTileRowsQ5 = 4, kTileRowsK = 2, kTileTokens = 4;  // prefill tiles: rows x tokens
constexpr QuantizeRowFn kQuantizeQ8K = q8k::quantize_row_avx512;
inline const TypeKernels* base_kernels(DType type) { return avx512_kernels(type); }

#include "quant/kquants_x86_tables.hpp"

}  // namespace

const DotTile* kquant_avx512_tiles() { return kTiles; }

const TypeKernels* kquant_avx512_kernels(DType type) { return find_kernels(type); }

}  // namespace colibri
