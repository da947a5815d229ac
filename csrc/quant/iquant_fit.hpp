// A lattice fit shared by colibri's own low-bit i-quant quantizers (IQ2_XS, IQ2_S, IQ3_XXS,
// IQ3_S, IQ1_S, IQ1_M). Private to csrc/quant.
//
// Every one of these formats is the same shape: a 256-element super-block with one half
// scale d; "scale blocks" of 16 or 32 elements with an integer code l, whose scale is
// d * alpha * (l + 0.5); and lattice points of 4 or 8 elements, each one of the grid's
// points. Magnitudes and signs are stored apart (free sign bits, or 7 bits per 8 with even
// parity implied), except IQ1's grid, whose values carry their sign and get a +-1/8 shift
// (per scale block for IQ1_S, per point for IQ1_M). The fit minimises the weighted squared
// error sum_j w_j (x_j - q_j)^2 with llama.cpp's weights w_j = sqrt(sigma2 + x_j^2) (its
// importance set to 1; sigma2 = sigma_factor * mean(x^2) over the super-block):
//   1. signs from the data (for even-parity types the cheapest element is flipped);
//   2. for every point group and grid point, the sums c = sum w a g, e = sum w g^2 (and
//      f = sum w g for the shifted grids), so the error of any point at any scale is a
//      line in the scale: one pass over the grid serves every candidate scale;
//   3. per scale block, a search over candidate scales (every group its best point) with a
//      least-squares rescale of the best; the first few candidates scan the whole grid, the
//      others only the points that won those scans (the grids are large: this is the cost);
//   4. a search over a few super-block scales d (fp16-rounded, as stored) with, per scale
//      block, the two nearest codes; then a least-squares refit of d; finally every point
//      is picked again from the whole grid at its block's stored scale.
// Exhaustive over the grid, so no neighbour tables; deterministic (strict IEEE float, no
// contraction, ties to the lowest index).
#pragma once
#include <cstdint>
#include <vector>

namespace colibri::iq::fit {

enum class Signs {
  Free,      // one stored sign bit per element (IQ2_S, IQ3_S)
  EvenPer8,  // 7 stored bits per 8 elements, even count of negatives (IQ2_XS, IQ3_XXS)
  InGrid,    // the grid values are signed; no sign bits (IQ1_S, IQ1_M)
};
enum class Shift {
  None,
  PerScaleBlock,  // IQ1_S: one +-delta for each scale block
  PerPoint,       // IQ1_M: one +-delta for each lattice point
};

// A grid as floats, transposed (element j of every point in one row: vectorizes over points).
struct Lattice {
  int width = 0;   // elements per point: 4 or 8
  int points = 0;  // a multiple of 8
  float gmax = 0;  // largest |value| (shift included)
  std::vector<float> g, g2;  // [width][points]
};

struct Spec {
  const Lattice* lattice;
  int scale_block;     // elements per scale code: 16 or 32
  int levels;          // codes 0 .. levels - 1
  float alpha;         // scale of a block = d * alpha * (code + 0.5)
  float sigma_factor;  // sigma2 = sigma_factor * mean(x^2), as llama.cpp for the type
  Signs signs;
  Shift shift;
  float delta;         // the shift's size (IQ1: 0.125)
  int full_tries;      // candidate scales per scale block scanning the whole grid
  int scale_tries;     // further candidates scanning only the points that won so far
  int d_tries;         // candidate super-block scales
};

constexpr int kMaxPoints = 64;  // 256 / 4

struct Result {
  uint16_t d_bits = 0;              // the half d; 0 (and everything else 0) for a zero block
  int code[16] = {};                // per scale block
  int index[kMaxPoints] = {};       // per lattice point
  bool shift_negative[kMaxPoints] = {};  // per lattice point (IQ1): value = g - delta
  uint8_t sign_bits[32] = {};       // per 8 elements: bit j set = element j negative
};

// Fits one super-block of 256 values.
void fit_superblock(const Spec& spec, const float* x, Result* out);

// A lattice from packed grid entries (element j in byte j; `signed_values`: bytes are int8).
template <typename Entry>
Lattice make_lattice(const Entry* grid, int points, int width, bool signed_values, float shift) {
  Lattice L;
  L.width = width;
  L.points = points;
  L.g.assign(static_cast<std::size_t>(width * points), 0.0f);
  L.g2 = L.g;
  for (int p = 0; p < points; ++p)
    for (int j = 0; j < width; ++j) {
      const auto byte = static_cast<uint8_t>(grid[p] >> (8 * j));
      const float v = signed_values ? static_cast<float>(static_cast<int8_t>(byte)) : static_cast<float>(byte);
      L.g[static_cast<std::size_t>(j * points + p)] = v;
      L.g2[static_cast<std::size_t>(j * points + p)] = v * v;
      const float m = (v < 0 ? -v : v) + shift;
      if (m > L.gmax) L.gmax = m;
    }
  return L;
}

}  // namespace colibri::iq::fit
