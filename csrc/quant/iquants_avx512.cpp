// AVX-512 kernels of the i-quants and MXFP4, compiled with the AVX-512 F/BW/VL/DQ + VNNI
// flags and run only where dispatch.cpp found them: the templates of iquants_x86.hpp with
// VNNI's fused multiply-accumulates on ymm (vpdpwssd / vpdpbusd, from AVX512-VL). Their
// integer results equal AVX2's (iquants_x86.hpp: no product or sum there saturates or
// overflows), so these kernels compute exactly what the AVX2 ones do, which are
// bit-identical to the scalar reference for the Q8_K types. The prefill tiles take more
// rows (32 vector registers). NOT RUN on the development host (AVX2 only): correct by that
// construction and checked against scalar by tests/kernels/test_iquants.py where the CPU has AVX-512.
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
  // acc + pairwise sums of p (int16) times s (int16), in one vpdpwssd.
  static __m256i madd_acc(__m256i acc, __m256i p, __m256i s) { return _mm256_dpwssd_epi32(acc, p, s); }
  // Sum of u[i] * s[i] over each group of 4 bytes, in one vpdpbusd.
  static __m256i dot_u8_i8(__m256i u, __m256i s) { return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s); }
  // q8 with byte j negated where bit j of `bits`' 32-bit lane k is set: one masked subtract
  // from zero.
  static __m256i negate_where(__m256i q8, __m256i bits, int k) {
    alignas(32) uint32_t lanes[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), bits);
    return _mm256_mask_sub_epi8(q8, lanes[k], _mm256_setzero_si256(), q8);
  }
  static constexpr bool kEvenSignsByTable = false;  // negate_where is faster (iquants_grid_x86.hpp)
};

constexpr int kTileRowsIq4nl = 4, kTileRowsIq4xs = 2, kTileTokens = 4;  // prefill tiles (32 ymm)
constexpr QuantizeRowFn kQuantizeQ8K = q8k::quantize_row_avx512;
inline const TypeKernels* base_kernels(DType type) { return avx512_kernels(type); }

}  // namespace
}  // namespace colibri

#include "quant/iquants_x86.hpp"

namespace colibri {

const TypeKernels* iq_avx512_kernels(DType type) { return table(type); }
const DotTile* iq_avx512_tiles() { return kTiles; }

}  // namespace colibri
