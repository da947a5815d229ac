// Runtime kernel selection. One binary carries the scalar reference and every SIMD variant
// the target architecture can compile; which ones run is decided here from the CPU's
// feature bits (nothing is read from the environment).
#include <atomic>
#include <string>

#include "common/errors.hpp"
#include "quant/fp8.hpp"
#include "quant/iquants_ref.hpp"
#include "quant/reference.hpp"

namespace colibri {
namespace {

bool cpu_has(Isa isa) {
  switch (isa) {
    case Isa::Scalar:
      return true;
#if defined(COLIBRI_X86)
    case Isa::AVX2:
      // The AVX2 file is compiled with -mavx2 -mfma -mf16c -mbmi2.
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
             __builtin_cpu_supports("f16c") && __builtin_cpu_supports("bmi2");
    case Isa::AVX512:
      // AVX-512 F/BW/VL/DQ + VNNI (Ice Lake, Sapphire Rapids, Zen 4 and later). The file is
      // also compiled with -mavx512bf16 but uses no BF16 instruction, so that bit is not
      // required (Ice Lake lacks it).
      return cpu_has(Isa::AVX2) && __builtin_cpu_supports("avx512f") &&
             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
             __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vnni");
#endif
#if defined(COLIBRI_ARM)
    case Isa::NEON:
      return true;  // Advanced SIMD is mandatory on AArch64
#endif
    default:
      return false;
  }
}

// Feature bits do not change while the process runs: probe once.
struct Support {
  bool has[4];
  Support() {
    for (int i = 0; i < 4; ++i) has[i] = cpu_has(static_cast<Isa>(i));
  }
};

const Support& support() {
  static const Support s;
  return s;
}

// Each ISA's kernels come from several tables (one per family of types).
const TypeKernels* first_of(const TypeKernels* a, const TypeKernels* b) { return a ? a : b; }

}  // namespace

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::Scalar: return "scalar";
    case Isa::AVX2: return "avx2";
    case Isa::AVX512: return "avx512";
    case Isa::NEON: return "neon";
  }
  return "unknown";
}

bool isa_available(Isa isa) {
  const int i = static_cast<int>(isa);
  return i >= 0 && i < 4 && support().has[i];
}

Isa best_isa() {
  for (Isa isa : {Isa::AVX512, Isa::AVX2, Isa::NEON})
    if (isa_available(isa)) return isa;
  return Isa::Scalar;
}

const TypeKernels* kernels_for(DType type, Isa isa) {
  if (!isa_available(isa)) return nullptr;
  switch (isa) {
    case Isa::Scalar:
      return first_of(first_of(ref::scalar_kernels(type), iq::scalar_kernels(type)), fp8_type_kernels(type, Isa::Scalar));
#if defined(COLIBRI_X86)
    case Isa::AVX2:
      return first_of(first_of(avx2_kernels(type), iq_avx2_kernels(type)), fp8_type_kernels(type, Isa::AVX2));
    case Isa::AVX512: return first_of(avx512_kernels(type), iq_avx512_kernels(type));
#endif
#if defined(COLIBRI_ARM)
    case Isa::NEON: return first_of(neon_kernels(type), iq_neon_kernels(type));
#endif
    default: return nullptr;
  }
}

const TypeKernels& kernels(DType type) {
  // Per type, the best ISA that has kernels for it (an ISA may cover only some types).
  static std::atomic<const TypeKernels*> cache[64];  // zero-initialized (static storage)
  const int id = static_cast<int>(type);
  if (id >= 0 && id < 64) {
    if (const TypeKernels* hit = cache[id].load(std::memory_order_acquire)) return *hit;
  }
  const TypeKernels* k = nullptr;
  for (Isa isa : {Isa::AVX512, Isa::AVX2, Isa::NEON, Isa::Scalar}) {
    k = kernels_for(type, isa);
    if (k) break;
  }
  if (!k) {
    const std::string name = type_traits(type).name;  // throws for an unknown id
    fail(ErrorKind::Unsupported, "tensor type " + name +
                                     " has no kernels in this build yet (supported: F32, F16, "
                                     "BF16, Q4_0, Q4_1, Q8_0, IQ4_NL, IQ4_XS, IQ2_XXS, IQ2_XS, "
                                     "IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M, MXFP4, F8_E4M3)");
  }
  if (id >= 0 && id < 64) cache[id].store(k, std::memory_order_release);  // all store the same
  return *k;
}

}  // namespace colibri
