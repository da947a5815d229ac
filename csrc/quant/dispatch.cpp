// Runtime kernel selection. One binary carries the scalar reference and every SIMD variant
// the target architecture can compile; which ones run is decided here from the CPU's
// feature bits (nothing is read from the environment).
#include <atomic>
#include <cstddef>
#include <string>

#include "common/errors.hpp"
#include "quant/kquants.hpp"
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

// Each ISA's kernels come in one table per type family (the 32-element formats in
// reference.cpp / kernels_<isa>.cpp, the K-quants in kquants_<isa>.cpp, ...). A (type, isa)
// pair is looked up in that ISA's tables in order; a family adds one line per ISA here.
using TableFn = const TypeKernels* (*)(DType);

constexpr TableFn kScalarTables[] = {
    ref::scalar_kernels,
    kquant_scalar_kernels,
    iq::scalar_kernels,
    [](DType t) { return fp8_type_kernels(t, Isa::Scalar); },
};
#if defined(COLIBRI_X86)
constexpr TableFn kAvx2Tables[] = {
    avx2_kernels,
    kquant_avx2_kernels,
    iq_avx2_kernels,
    [](DType t) { return fp8_type_kernels(t, Isa::AVX2); },
};
constexpr TableFn kAvx512Tables[] = {
    avx512_kernels,
    kquant_avx512_kernels,
    iq_avx512_kernels,
    [](DType t) { return fp8_type_kernels(t, Isa::AVX512); },
};
#endif
#if defined(COLIBRI_ARM)
constexpr TableFn kNeonTables[] = {
    neon_kernels,
    kquant_neon_kernels,
    iq_neon_kernels,
    [](DType t) { return fp8_type_kernels(t, Isa::NEON); },
};
#endif

template <std::size_t N>
const TypeKernels* find_in(const TableFn (&tables)[N], DType type) {
  for (TableFn f : tables)
    if (const TypeKernels* k = f(type)) return k;
  return nullptr;
}

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
    case Isa::Scalar: return find_in(kScalarTables, type);
#if defined(COLIBRI_X86)
    case Isa::AVX2: return find_in(kAvx2Tables, type);
    case Isa::AVX512: return find_in(kAvx512Tables, type);
#endif
#if defined(COLIBRI_ARM)
    case Isa::NEON: return find_in(kNeonTables, type);
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
    fail(ErrorKind::Unsupported, "tensor type " + name + " has no kernels in this build yet (supported: " +
                                     implemented_type_names() + ")");
  }
  if (id >= 0 && id < 64) cache[id].store(k, std::memory_order_release);  // all store the same
  return *k;
}

}  // namespace colibri
