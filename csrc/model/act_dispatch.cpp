// Which clamped-SwiGLU kernels run (act_kernels.hpp): the best ISA the CPU supports, as for
// the matmul and attention kernels; the scalar reference where no SIMD one exists.
#include "model/act_kernels.hpp"

namespace colibri {
namespace {
const ActKernels kScalar{swiglu_oai_mul_scalar, swiglu_clamp_mul_scalar};
}  // namespace

const ActKernels* act_kernels_for(Isa isa) {
  if (!isa_available(isa)) return nullptr;
  switch (isa) {
    case Isa::Scalar: return &kScalar;
#if defined(COLIBRI_X86)
    case Isa::AVX2: return act_avx2_kernels();
    case Isa::AVX512: return act_avx512_kernels();
#endif
    default: return nullptr;
  }
}

const ActKernels& best_act_kernels() {
  static const ActKernels* const best = [] {
    for (Isa isa : {Isa::AVX512, Isa::AVX2})
      if (const ActKernels* k = act_kernels_for(isa)) return k;
    return &kScalar;
  }();
  return *best;
}

}  // namespace colibri
