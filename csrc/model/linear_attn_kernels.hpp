// The inner loops of the delta rule (linear_attn_rules.hpp), per ISA: a scalar reference
// (linear_attn_kernels.cpp) and AVX2 / AVX-512 versions (linear_attn_kernels_avx2.cpp,
// _avx512.cpp, one template in linear_attn_kernels_x86.hpp), picked at run time as the
// attention and matmul kernels are (quant/dispatch.cpp probes the CPU).
//
// Both kernels work on rows of a row-major state or matrix and are vectorized over its
// columns only: each output element gets the scalar reference's operations in its order,
// a multiply then an add (no FMA; the SIMD files are compiled without contraction). So
// every ISA gives the same bits as the scalar reference, and the model's logits do not
// depend on the CPU (tests/kernels/test_linear_attn_kernels.py).
#pragma once
#include <cstdint>

#include "quant/kernels.hpp"

namespace colibri::linattn {

struct Kernels {
  Isa isa;
  // One token of the delta rule on a (dk x dv) state S, row i decayed by decay[i]:
  //   S_i *= decay[i];  d = beta * (v - S^T k);  S_i += k_i d;  o = S^T q
  // d[j] and o[j] summed over i in order from 0.
  void (*step)(float* S, int64_t dk, int64_t dv, const float* decay, const float* k, const float* v, float beta,
               const float* q, float* o);
  // c[x] += w[a] * B[a * ldb + x] for a = 0, 1, ..., m - 1 in order, for x < n.
  void (*row_acc)(float* c, const float* w, int64_t m, const float* B, int64_t ldb, int64_t n);
};

const Kernels* scalar_kernels();
#if defined(COLIBRI_X86)
const Kernels* avx2_kernels();
const Kernels* avx512_kernels();
#endif

// Kernels for `isa`, or nullptr when this CPU or build has none.
const Kernels* kernels_for(Isa isa);
// The kernels the model runs: the best this CPU has, unless set_active chose others.
const Kernels& active();
// Makes `isa`'s kernels the model's, process-wide (benchmarks compare them in one run;
// they give the same bits). Error(Unsupported) where kernels_for(isa) is nullptr.
void set_active(Isa isa);

}  // namespace colibri::linattn
