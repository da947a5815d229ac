// AVX-512 kernels of the i-quants and MXFP4, compiled with the AVX-512 F/BW/VL/DQ + VNNI
// flags and run only where dispatch.cpp found them: the templates of iquants_x86.hpp with
// VNNI's fused multiply-accumulates on ymm (vpdpwssd / vpdpbusd, from AVX512-VL), and for the
// grid types (iquants_grid_x86.hpp) two sub-blocks per zmm with masked sign application.
// Their integer results equal AVX2's (iquants_x86.hpp: no product or sum there saturates or
// overflows), so these kernels compute exactly what the AVX2 ones do, which are
// bit-identical to the scalar reference for the Q8_K types. The prefill tiles take more
// rows (32 vector registers). Checked against scalar by tests/kernels/test_iquants.py where
// the CPU has AVX-512.
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
  // Two 32-weight sub-blocks of a grid type (iquants_grid_x86.hpp) in one zmm: acc + (unsigned
  // grid bytes g0 | g1 . the 64 activations at q8, negated where the bits of the 32-bit lanes
  // k | k + 1 of `bits` are set: one masked subtract) per pair, times the int16 scales
  // ls0 | ls1 (one vpdpwssd). k is even.
  using Acc = __m512i;
  static Acc acc_zero() { return _mm512_setzero_si512(); }
  static __m256i acc_fold(Acc a) { return _mm256_add_epi32(_mm512_castsi512_si256(a), _mm512_extracti64x4_epi64(a, 1)); }
  static Acc pair_dot(Acc acc, __m256i g0, __m256i g1, const int8_t* q8, __m256i bits, int k, __m256i ls0, __m256i ls1) {
    alignas(32) uint64_t masks[4];
    _mm256_store_si256(reinterpret_cast<__m256i*>(masks), bits);
    const __m512i a = _mm512_loadu_si512(q8);
    const __m512i s = _mm512_mask_sub_epi8(a, masks[k / 2], _mm512_setzero_si512(), a);
    const __m512i g = _mm512_inserti64x4(_mm512_castsi256_si512(g0), g1, 1);
    const __m512i ls = _mm512_inserti64x4(_mm512_castsi256_si512(ls0), ls1, 1);
    return _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(g, s), ls);
  }
  // Two sub-blocks of unsigned weight bytes u0 | u1 (IQ1_*) in one zmm: acc + (u . the 64
  // activations at q8) per pair, times the int16 scales ls0 | ls1.
  static Acc pair_madd(Acc acc, __m256i u0, __m256i u1, const int8_t* q8, __m256i ls0, __m256i ls1) {
    const __m512i u = _mm512_inserti64x4(_mm512_castsi256_si512(u0), u1, 1);
    const __m512i ls = _mm512_inserti64x4(_mm512_castsi256_si512(ls0), ls1, 1);
    return _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(u, _mm512_loadu_si512(q8)), ls);
  }
  static constexpr bool kEvenSignsByTable = false;  // pair_dot is faster (iquants_grid_x86.hpp)
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
