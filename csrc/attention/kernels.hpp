// Private to csrc/attention: the per-ISA inner kernels that attention.cpp's tiled driver
// calls. Scalar versions in attn_scalar.cpp, SIMD ones in attn_avx2.cpp, attn_avx512.cpp
// and attn_neon.cpp (compiled only where the ISA exists).
//
// Every kernel computes each output element with an arithmetic that depends only on that
// element's inputs and the ISA: never on how many rows or keys one call covers. So the
// driver may tile rows and keys however it likes (prefill vs decode, thread count) and
// still get the same bits for a given query. In particular:
//  - scores: each q . k is a fixed-lane dot product (lane l sums elements l, l + W, ...
//    with FMA, in order) then a fixed reduction tree, whatever the tile shape;
//  - softmax_block: max, exp and a fixed-order sum over exactly kBlockKeys scores;
//  - pv: each output element is o * alpha (if given) then one FMA per key, in key order.
#pragma once
#include <cstdint>

#include "quant/kernels.hpp"

namespace colibri::attn {

struct Kernels {
  Isa isa;
  // s[r * ld + j] = scale * dot(q + r * q_stride, k + j * k_stride) over dk floats,
  // for r < n_rows, j < n_keys.
  void (*scores)(const float* q, int64_t q_stride, int64_t n_rows, const float* k, int64_t k_stride,
                 int64_t n_keys, int64_t dk, float scale, float* s, int64_t ld);
  // One row's online-softmax step over kBlockKeys scores s (masked entries are -inf, at
  // least one is finite): m' = max(m, max s), alpha = exp(m - m'), s[j] = exp(s[j] - m'),
  // l = l * alpha + sum(s). Updates m and l; returns alpha.
  float (*softmax_block)(float* s, float* m, float* l);
  // o_r = o_r * alpha[r] (skipped when alpha is null) + sum_{j < n_keys} p_r[j] * v_j, for
  // r < n_rows, over dv floats; p_r = p + r * p_stride, v_j = v + j * v_stride.
  void (*pv)(float* o, int64_t o_stride, int64_t n_rows, const float* p, int64_t p_stride, const float* alpha,
             const float* v, int64_t v_stride, int64_t n_keys, int64_t dv);
};

const Kernels* scalar_kernels();
#if defined(COLIBRI_X86)
const Kernels* avx2_kernels();
const Kernels* avx512_kernels();
#endif
#if defined(COLIBRI_ARM)
const Kernels* neon_kernels();
#endif

// Kernels for `isa`, or nullptr when it is not available on this CPU.
const Kernels* kernels_for(Isa isa);
// The best available.
const Kernels& best_kernels();

}  // namespace colibri::attn
