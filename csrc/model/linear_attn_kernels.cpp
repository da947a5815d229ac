// The scalar reference of the delta rule's kernels, and which kernels run. No contraction
// to FMA here either (where the ISA has it), so the reference is the SIMD kernels' order.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include "model/linear_attn_kernels.hpp"

#include <atomic>
#include <string>

#include "common/errors.hpp"

namespace colibri::linattn {
namespace {

void step_scalar(float* S, int64_t dk, int64_t dv, const float* decay, const float* k, const float* v, float beta,
                 const float* q, float* o) {
  for (int64_t j = 0; j < dv; ++j) o[j] = 0.0f;  // first S^T k, in o's room
  for (int64_t i = 0; i < dk; ++i) {             // the decay and S^T k in one pass over S
    float* Si = S + i * dv;
    for (int64_t j = 0; j < dv; ++j) {
      Si[j] *= decay[i];
      o[j] += Si[j] * k[i];
    }
  }
  float delta[64];  // d in column blocks of 64, o's room free again for o
  for (int64_t j0 = 0; j0 < dv; j0 += 64) {
    const int64_t nj = dv - j0 < 64 ? dv - j0 : 64;
    for (int64_t j = 0; j < nj; ++j) {
      delta[j] = (v[j0 + j] - o[j0 + j]) * beta;
      o[j0 + j] = 0.0f;
    }
    for (int64_t i = 0; i < dk; ++i) {
      float* Si = S + i * dv + j0;
      for (int64_t j = 0; j < nj; ++j) {
        Si[j] += k[i] * delta[j];
        o[j0 + j] += Si[j] * q[i];
      }
    }
  }
}

void row_acc_scalar(float* c, const float* w, int64_t m, const float* B, int64_t ldb, int64_t n) {
  for (int64_t a = 0; a < m; ++a) {
    const float wa = w[a];
    const float* Ba = B + a * ldb;
    for (int64_t x = 0; x < n; ++x) c[x] += wa * Ba[x];
  }
}

const Kernels kScalar{Isa::Scalar, step_scalar, row_acc_scalar};

std::atomic<const Kernels*>& chosen() {
  static std::atomic<const Kernels*> k{nullptr};
  return k;
}

}  // namespace

const Kernels* scalar_kernels() { return &kScalar; }

const Kernels* kernels_for(Isa isa) {
  if (!isa_available(isa)) return nullptr;
  switch (isa) {
    case Isa::Scalar: return scalar_kernels();
#if defined(COLIBRI_X86)
    case Isa::AVX2: return avx2_kernels();
    case Isa::AVX512: return avx512_kernels();
#endif
    default: return nullptr;
  }
}

const Kernels& active() {
  if (const Kernels* k = chosen().load(std::memory_order_acquire)) return *k;
  static const Kernels* const best = [] {
    for (Isa isa : {Isa::AVX512, Isa::AVX2})
      if (const Kernels* k = kernels_for(isa)) return k;
    return scalar_kernels();
  }();
  return *best;
}

void set_active(Isa isa) {
  const Kernels* k = kernels_for(isa);
  if (!k) fail(ErrorKind::Unsupported, std::string("no ") + isa_name(isa) + " linear-attention kernels on this CPU");
  chosen().store(k, std::memory_order_release);
}

}  // namespace colibri::linattn
