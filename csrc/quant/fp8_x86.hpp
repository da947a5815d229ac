// The x86 kernel for FP8 e4m3 block-scaled weights (see fp8.hpp), written once over a
// vector-traits struct and compiled twice: fp8_avx2.cpp (8 lanes, AVX2 + F16C) and
// fp8_avx512.cpp (16 lanes), each with its own ISA flags. Include it only from those
// files, which define the traits struct; everything here has internal linkage, so no
// function built with one ISA's flags can be picked by the linker for another's caller.
// Scalar reference: fp8.cpp (dot_rows_scalar).
//
// e4m3 -> half is a shift: the bits (c & 0x7f) << 7 (sign << 8) read as a half equal
// e4m3(c) * 2^-8 for normal and subnormal codes alike (both formats scale subnormals the
// same way), and vcvtph2ps converts them exactly; the 2^8 is folded into the block scale.
// NaN codes (S.1111.111) decode to +-480 here instead of NaN: checkpoints do not contain
// them. Agrees with the scalar reference to rounding (V::kLanes lanes, FMA).
//
// The traits struct V:
//   struct V { using F = <float vector>; static constexpr int64_t kLanes;
//              static F zero(); static F set1(float); static F load(const float*);
//              static F e4m3(const uint8_t*);       // kLanes codes -> floats * 2^-8
//              static F fmadd(F a, F b, F c);       // a b + c
//              static F add(F, F); static float sum(F); };
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "quant/fp8.hpp"

namespace colibri::fp8 {
namespace {

template <class V>
void dot_rows_x86(int64_t n, const uint8_t* w, std::size_t stride, int64_t nrows, int64_t row0,
                  const BlockScales& s, const float* x, float* out) {
  using F = typename V::F;
  constexpr int64_t L = V::kLanes;
  const int64_t nsc = scale_cols(n, s.block_cols);
  for (int64_t r = 0; r < nrows; ++r) {
    const uint8_t* wr = w + static_cast<std::size_t>(r) * stride;
    const int64_t first = ((row0 + r) / s.block_rows) * nsc;
    F acc = V::zero();
    float tail = 0.0f;
    for (int64_t b = 0; b < nsc; ++b) {
      const int64_t j0 = b * s.block_cols, j1 = std::min<int64_t>(n, j0 + s.block_cols);
      F p0 = V::zero(), p1 = V::zero();
      int64_t j = j0;
      for (; j + 2 * L <= j1; j += 2 * L) {
        p0 = V::fmadd(V::e4m3(wr + j), V::load(x + j), p0);
        p1 = V::fmadd(V::e4m3(wr + j + L), V::load(x + j + L), p1);
      }
      for (; j + L <= j1; j += L) p0 = V::fmadd(V::e4m3(wr + j), V::load(x + j), p0);
      const float sb = scale_at(s, first + b), scale = sb * 256.0f;
      if (j < j1) {  // fewer than kLanes left in this block
        float part = 0.0f;
        for (; j < j1; ++j) part += e4m3_to_float(wr[j]) * x[j];
        tail += sb * part;
      }
      acc = V::fmadd(V::set1(scale), V::add(p0, p1), acc);
    }
    out[r] = V::sum(acc) + tail;
  }
}

}  // namespace
}  // namespace colibri::fp8
