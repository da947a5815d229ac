// Software prefetch for row-group kernels (the K-quant and Q5 SIMD files), the scheme of
// kernels_avx2.cpp / kernels_avx512.cpp in portable form: decode streams weights from DRAM
// and a row group reads NR rows in parallel (block i of each), a pattern the hardware
// prefetchers follow poorly. So each block step requests, into L2, its share of the
// group-sized span that starts max(group bytes, kAhead) past the group start (the rows that
// come next, contiguous in memory), spread evenly over the group's blocks, every line once.
// Prefetches never fault, so running past the end of the matrix is harmless.
// Internal linkage: included by translation units built with different ISA flags.
#pragma once
#include <cstddef>
#include <cstdint>

namespace colibri {
namespace {

constexpr std::size_t kGroupPrefetchAhead = 16 * 1024;

struct GroupPrefetch {
  const unsigned char* ahead;
  uint64_t step_fp;   // bytes of the rows ahead to request per block step, 8 fraction bits
  uint64_t pos_fp = 0;
  uint64_t next = 0;  // bytes requested so far (whole lines)
  GroupPrefetch(const unsigned char* w, std::size_t stride, int nr, int64_t nb)
      : ahead(w + (nr * stride > kGroupPrefetchAhead ? nr * stride : kGroupPrefetchAhead)),
        step_fp(nb > 0 ? (static_cast<uint64_t>(nr) * stride << 8) / static_cast<uint64_t>(nb) : 0) {}
  void step() {
    pos_fp += step_fp;
    for (const uint64_t upto = pos_fp >> 8; next < upto; next += 64) __builtin_prefetch(ahead + next, 0, 2);
  }
};

}  // namespace
}  // namespace colibri
