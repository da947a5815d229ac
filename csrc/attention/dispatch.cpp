// Which attention kernels run: the best ISA the CPU supports (quant/dispatch.cpp probes the
// feature bits once), as for the matmul kernels.
#include "attention/kernels.hpp"

namespace colibri::attn {

const Kernels* kernels_for(Isa isa) {
  if (!isa_available(isa)) return nullptr;
  switch (isa) {
    case Isa::Scalar: return scalar_kernels();
#if defined(COLIBRI_X86)
    case Isa::AVX2: return avx2_kernels();
    case Isa::AVX512: return avx512_kernels();
#endif
#if defined(COLIBRI_ARM)
    case Isa::NEON: return neon_kernels();
#endif
    default: return nullptr;
  }
}

const Kernels& best_kernels() {
  static const Kernels* const best = [] {
    for (Isa isa : {Isa::AVX512, Isa::AVX2, Isa::NEON})
      if (const Kernels* k = kernels_for(isa)) return k;
    return scalar_kernels();
  }();
  return *best;
}

}  // namespace colibri::attn
