// The ISA-independent driver around a SIMD kernel's row-group body. Each ISA file defines,
// per block type, a struct K with `using Act = <activation block>` and
//   template <int NR> static void rows(int64_t nb, const unsigned char* w, size_t stride,
//                                      const Act* y, float* out);
// computing NR dot products that share each activation block. The helpers here turn that
// into the kernel table's vec_dot_rows / vec_dot, and run float kernels row by row.
// Template arguments are the ISA files' internal types, so every instantiation is private
// to the file that makes it and compiled with that file's ISA flags.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "quant/kernels.hpp"

namespace colibri::row_groups {

constexpr int64_t kBlock = 32;  // elements per block unless a kernel names its own (Block)

// Groups of MaxGroup rows (8 or 4), then 4, then the 1..3 left over, all through the same
// per-row arithmetic, so a row's result does not depend on its group. With HeadBytes > 0
// the first HeadBytes of this call's rows are prefetched at once: they start cold (the
// previous call prefetched other memory), then the groups' own prefetch keeps ahead.
template <class K, int MaxGroup, std::size_t HeadBytes, int64_t Block = kBlock>
void vec_dot_rows(int64_t n, const void* w, std::size_t stride, int64_t nrows, const void* act, float* out) {
  static_assert(MaxGroup == 4 || MaxGroup == 8, "row groups of 4 or 8");
  const unsigned char* wb = static_cast<const unsigned char*>(w);
  const auto* y = static_cast<const typename K::Act*>(act);
  const int64_t nb = n / Block;
  if constexpr (HeadBytes > 0) {
    const std::size_t head = std::min<std::size_t>(static_cast<std::size_t>(nrows) * stride, HeadBytes);
    for (std::size_t off = 0; off < head; off += 64) __builtin_prefetch(wb + off, 0, 2);  // into L2
  }
  int64_t r = 0;
  if constexpr (MaxGroup == 8)
    for (; r + 8 <= nrows; r += 8) K::template rows<8>(nb, wb + r * stride, stride, y, out + r);
  for (; r + 4 <= nrows; r += 4) K::template rows<4>(nb, wb + r * stride, stride, y, out + r);
  const unsigned char* wr = wb + r * stride;
  switch (nrows - r) {
    case 3: K::template rows<3>(nb, wr, stride, y, out + r); break;
    case 2: K::template rows<2>(nb, wr, stride, y, out + r); break;
    case 1: K::template rows<1>(nb, wr, stride, y, out + r); break;
    default: break;
  }
}

// One row: the same arithmetic as a group of one.
template <class K, int64_t Block = kBlock>
float vec_dot(int64_t n, const void* w, const void* act) {
  float out;
  K::template rows<1>(n / Block, static_cast<const unsigned char*>(w), 0,
                      static_cast<const typename K::Act*>(act), &out);
  return out;
}

// Float weights: rows one after the other (they stream 2-4 bytes per element; sharing the
// activation load would not change the memory traffic).
template <VecDotFn F>
void rows_each(int64_t n, const void* w, std::size_t stride, int64_t nrows, const void* act, float* out) {
  for (int64_t r = 0; r < nrows; ++r) out[r] = F(n, static_cast<const unsigned char*>(w) + r * stride, act);
}

}  // namespace colibri::row_groups
