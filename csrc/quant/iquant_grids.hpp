// The i-quant lattices and value tables (data, generated into iquant_grids_{iq1,iq2,iq3}.cpp
// from the gguf package by scripts/gen_iquant_grids.py). Grid entries pack one lattice point per
// integer, element 0 in the lowest byte:
//   kIq2xxsGrid / kIq2xsGrid / kIq2sGrid: 8 magnitudes, each 8, 25 or 43;
//   kIq3xxsGrid: 4 magnitudes in {4, 12, ..., 62}; kIq3sGrid: 4 odd magnitudes 1..15;
//   kIq1sGrid: 8 int8 values in {-1, 0, 1}.
// kKsignsIq2xs[k]: 7 sign bits k plus an 8th bit making the count of negatives even.
#pragma once
#include <cstdint>

namespace colibri::iq {

extern const uint64_t kIq2xxsGrid[256];
extern const uint64_t kIq2xsGrid[512];
extern const uint64_t kIq2sGrid[1024];
extern const uint32_t kIq3xxsGrid[256];
extern const uint32_t kIq3sGrid[512];
extern const uint64_t kIq1sGrid[2048];
extern const uint8_t kKsignsIq2xs[128];
extern const uint8_t kKvaluesIq4nlBits[16];  // int8 values as bytes
extern const uint8_t kKvaluesMxfp4Bits[16];  // e2m1 values doubled, int8 as bytes

inline const int8_t* kvalues_iq4nl() { return reinterpret_cast<const int8_t*>(kKvaluesIq4nlBits); }
inline const int8_t* kvalues_mxfp4() { return reinterpret_cast<const int8_t*>(kKvaluesMxfp4Bits); }

// Sign bytes of 8 elements from 8 sign bits (bit j set: element j negative), as +1 / -1
// int8 lanes packed in a uint64 (for SIMD sign application).
struct SignTable {
  uint64_t v[256];
  constexpr SignTable() : v() {
    for (int k = 0; k < 256; ++k) {
      uint64_t w = 0;
      for (int j = 0; j < 8; ++j) w |= static_cast<uint64_t>((k >> j) & 1 ? 0xffu : 0x01u) << (8 * j);
      v[k] = w;
    }
  }
};
inline constexpr SignTable kSigns8{};

}  // namespace colibri::iq
