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
// Converting a cache element to F32 is exact, so reading rows straight from the cache or
// from an F32 tile of them gives the same bits.
#pragma once
#include <cstdint>

#include "common/unroll.hpp"  // COLIBRI_UNROLL, before the kernels' fixed-count register loops
#include "quant/dtype.hpp"
#include "quant/kernels.hpp"

namespace colibri::attn {

// Key or value rows as the kernels read them: row j starts at data + j * stride bytes and
// holds elements of `type` (F32, F16, BF16, or Q8_0 with the dims whole blocks of 32).
// The kernels convert each element to F32 as they load it (exact for every type), so
// decode reads a row once, straight from the cache, instead of through an F32 tile.
struct Rows {
  DType type = DType::F32;
  const unsigned char* data = nullptr;
  int64_t stride = 0;  // bytes
  // Rows straight from a cache that outgrows the CPU caches: while reading row j the
  // kernels ask for row j + prefetch (the same head's stream, past the block's end too),
  // the row_bytes of it. 0: no prefetch (rows in a tile).
  int64_t prefetch = 0;
  int64_t row_bytes = 0;
};

// Asks for the cache lines of row j + r.prefetch, into L2 (x86 prefetcht1: the distance is
// many rows, L1 would evict the rows in use). Never faults: a prefetch past the cache's
// end is dropped by the CPU; the address is formed as an integer.
inline void prefetch_ahead(const Rows& r, int64_t j) {
  const auto row = reinterpret_cast<std::uintptr_t>(r.data) + static_cast<std::uintptr_t>((j + r.prefetch) * r.stride);
  const std::uintptr_t last = row + static_cast<std::uintptr_t>(r.row_bytes) - 1;
  for (std::uintptr_t line = row & ~std::uintptr_t{63}; line <= last; line += 64)
    __builtin_prefetch(reinterpret_cast<const void*>(line), 0, 2);
}

struct Kernels {
  Isa isa;
  // s[r * ld + j] = scale * dot(q + r * q_stride, row j of k) over dk elements, for
  // r < n_rows, j < n_keys.
  void (*scores)(const float* q, int64_t q_stride, int64_t n_rows, const Rows& k, int64_t n_keys, int64_t dk,
                 float scale, float* s, int64_t ld);
  // One row's online-softmax step over kBlockKeys scores s (masked entries are -inf, at
  // least one is finite): m' = max(m, max s), alpha = exp(m - m'), s[j] = exp(s[j] - m'),
  // l = l * alpha + sum(s). Updates m and l; returns alpha.
  float (*softmax_block)(float* s, float* m, float* l);
  // o_r = o_r * alpha[r] (skipped when alpha is null) + sum_{j < n_keys} p_r[j] * (row j of
  // v), for r < n_rows, over dv elements; p_r = p + r * p_stride.
  void (*pv)(float* o, int64_t o_stride, int64_t n_rows, const float* p, int64_t p_stride, const float* alpha,
             const Rows& v, int64_t n_keys, int64_t dv);
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
