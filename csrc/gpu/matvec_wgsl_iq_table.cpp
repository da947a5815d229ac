// WGSL decoders of IQ2_XS, IQ2_S, IQ1_S and IQ1_M (layouts in quant/blocks_iq.hpp),
// element for element the operations of quant/iquants_ref.cpp. Their lattices (512, 1024
// and 2048 eight-byte points) are too large to write into the shader as private arrays:
// lavapipe took about 15 s and 80 s to compile IQ2_XS and IQ2_S that way. Here the lattice
// is a read-only storage binding (`grid`, binding 4), uploaded once per device
// (shader_table gives its words: entry i is words 2i, 2i + 1, low word first, the byte
// order of the CPU's own reads).
//
// Every product is exact in float32, so a fused multiply-add changes nothing: IQ2_XS /
// IQ2_S as IQ2_XXS (11 + 5 + 6 bits); IQ1_S / IQ1_M `(d * (2 s + 1)) * (g + delta)` with
// g in {-1, 0, 1} and delta = ±1/8: 11 + 4 + 4 bits, and g + delta itself exact.
#include <vector>

#include "gpu/matvec_wgsl.hpp"
#include "gpu/matvec_wgsl_types.hpp"
#include "quant/iquant_grids.hpp"

namespace colibri::gpu {

namespace {

const char* kGridBinding = R"WGSL(
@group(0) @binding(4) var<storage, read> grid: array<u32>;
)WGSL";

// IQ2_XS: 74 bytes: f16 d, qs[32] u16 (a 9-bit grid index and 7 sign bits per 8 elements),
// scales[8] (a nibble per 16 elements); w = ((d * (0.5 + s)) * 0.25) * magnitude * sign.
const char* kIQ2_XS = R"WGSL(
fn sub_scale(row_off: u32, sb: u32) -> Scales {
  let off = row_off + (sb / 8u) * 74u;
  let d = half_at(off);
  let s = byte_at(off + 66u + sb % 8u);
  return Scales(d * (0.5 + f32(s & 15u)) * 0.25, d * (0.5 + f32(s >> 4u)) * 0.25, 0.0, 0.0);
}
fn sub_value(sc: Scales, row_off: u32, sb: u32, j: u32) -> f32 {
  let l = j / 8u;
  let q = u16_at(row_off + (sb / 8u) * 74u + 2u + 2u * (4u * (sb % 8u) + l));
  let mag = grid_byte(grid[2u * (q & 511u) + (j % 8u) / 4u], j % 4u);
  return select(sc.x, sc.y, l >= 2u) * mag * sign_bit(ksigns(q >> 9u), j % 8u);
}
)WGSL";

// IQ2_S: 82 bytes: f16 d, qs[64] (32 index low bytes, then 32 sign bytes, one each per 8
// elements), qh[8] (two index high bits per 8 elements), scales[8] (a nibble per 16);
// w = ((d * (0.5 + s)) * 0.25) * magnitude * sign.
const char* kIQ2_S = R"WGSL(
fn sub_scale(row_off: u32, sb: u32) -> Scales {
  let off = row_off + (sb / 8u) * 82u;
  let d = half_at(off);
  let s = byte_at(off + 74u + sb % 8u);
  return Scales(d * (0.5 + f32(s & 15u)) * 0.25, d * (0.5 + f32(s >> 4u)) * 0.25, 0.0, 0.0);
}
fn sub_value(sc: Scales, row_off: u32, sb: u32, j: u32) -> f32 {
  let off = row_off + (sb / 8u) * 82u;
  let ib = sb % 8u;
  let l = j / 8u;
  let index = byte_at(off + 2u + 4u * ib + l) | (((byte_at(off + 66u + ib) >> (2u * l)) & 3u) << 8u);
  let mag = grid_byte(grid[2u * index + (j % 8u) / 4u], j % 4u);
  return select(sc.x, sc.y, l >= 2u) * mag * sign_bit(byte_at(off + 34u + 4u * ib + l), j % 8u);
}
)WGSL";

// The IQ1 lattice value k (0..7) of grid entry `index`: an int8 in {-1, 0, 1}.
const char* kIq1Grid = R"WGSL(
fn iq1_grid(index: u32, k: u32) -> f32 {
  let word = grid[2u * index + k / 4u];
  return f32(bitcast<i32>(word << (24u - 8u * (k % 4u))) >> 24u);
}
)WGSL";

// IQ1_S: 50 bytes: f16 d, qs[32] (index low bytes, one per 8 elements), qh[8] u16 per 32
// elements: three index high bits per 8 elements, a 3-bit scale s in bits 12..14, the
// delta's sign in bit 15; w = (d * (2 s + 1)) * (g + delta), delta = ±0.125.
const char* kIQ1_S = R"WGSL(
fn sub_scale(row_off: u32, sb: u32) -> Scales {
  let off = row_off + (sb / 8u) * 50u;
  let qh = u16_at(off + 34u + 2u * (sb % 8u));
  return Scales(half_at(off) * f32(2u * ((qh >> 12u) & 7u) + 1u),
                select(0.125, -0.125, (qh & 0x8000u) != 0u), 0.0, 0.0);
}
fn sub_value(sc: Scales, row_off: u32, sb: u32, j: u32) -> f32 {
  let off = row_off + (sb / 8u) * 50u;
  let l = j / 8u;
  let qh = u16_at(off + 34u + 2u * (sb % 8u));
  let index = byte_at(off + 2u + 4u * (sb % 8u) + l) | (((qh >> (3u * l)) & 7u) << 8u);
  return sc.x * (iq1_grid(index, j % 8u) + sc.y);
}
)WGSL";

// IQ1_M: 56 bytes: qs[32] (index low bytes), qh[16] (a nibble per 8 elements: three index
// high bits and the delta's sign in bit 3), scales[8] as four u16: 3-bit scales, two per 32
// elements (bits 6 (ib % 2) and 6 (ib % 2) + 3 of word ib / 2), and the f16 d in their top
// nibbles (word k's bits 12..15 are d's bits 4k..4k+3); w = (d * (2 s + 1)) * (g + delta).
const char* kIQ1_M = R"WGSL(
fn sub_scale(row_off: u32, sb: u32) -> Scales {
  let off = row_off + (sb / 8u) * 56u;
  let s0 = u16_at(off + 48u);
  let s1 = u16_at(off + 50u);
  let s2 = u16_at(off + 52u);
  let s3 = u16_at(off + 54u);
  let d = half_bits((s0 >> 12u) | ((s1 >> 8u) & 0xf0u) | ((s2 >> 4u) & 0xf00u) | (s3 & 0xf000u));
  let ib = sb % 8u;
  let sc = u16_at(off + 48u + 2u * (ib / 2u)) >> (6u * (ib % 2u));
  return Scales(d * f32(2u * (sc & 7u) + 1u), d * f32(2u * ((sc >> 3u) & 7u) + 1u), 0.0, 0.0);
}
fn sub_value(sc: Scales, row_off: u32, sb: u32, j: u32) -> f32 {
  let off = row_off + (sb / 8u) * 56u;
  let ib = sb % 8u;
  let l = j / 8u;
  let h = (byte_at(off + 32u + 2u * ib + l / 2u) >> (4u * (l % 2u))) & 15u;
  let index = byte_at(off + 4u * ib + l) | ((h & 7u) << 8u);
  let delta = select(0.125, -0.125, (h & 8u) != 0u);
  return select(sc.x, sc.y, l >= 2u) * (iq1_grid(index, j % 8u) + delta);
}
)WGSL";

std::vector<uint32_t> words_of(const uint64_t* table, int entries) {
  std::vector<uint32_t> words;
  words.reserve(2 * static_cast<std::size_t>(entries));
  for (int i = 0; i < entries; ++i) {
    words.push_back(static_cast<uint32_t>(table[i]));
    words.push_back(static_cast<uint32_t>(table[i] >> 32));
  }
  return words;
}

}  // namespace

const char* wgsl_iquant_table_body(DType type) {
  static const std::string iq2xs = std::string(kGridBinding) + wgsl_grid_helpers() + kIQ2_XS;
  static const std::string iq2s = std::string(kGridBinding) + wgsl_grid_helpers() + kIQ2_S;
  static const std::string iq1s = std::string(kGridBinding) + kIq1Grid + kIQ1_S;
  static const std::string iq1m = std::string(kGridBinding) + kIq1Grid + kIQ1_M;
  switch (type) {
    case DType::IQ2_XS: return iq2xs.c_str();
    case DType::IQ2_S: return iq2s.c_str();
    case DType::IQ1_S: return iq1s.c_str();
    case DType::IQ1_M: return iq1m.c_str();
    default: return nullptr;
  }
}

const std::vector<uint32_t>& shader_table(DType type) {
  static const std::vector<uint32_t> none;
  static const std::vector<uint32_t> iq2xs = words_of(iq::kIq2xsGrid, 512);
  static const std::vector<uint32_t> iq2s = words_of(iq::kIq2sGrid, 1024);
  static const std::vector<uint32_t> iq1s = words_of(iq::kIq1sGrid, 2048);
  switch (type) {
    case DType::IQ2_XS: return iq2xs;
    case DType::IQ2_S: return iq2s;
    case DType::IQ1_S: case DType::IQ1_M: return iq1s;
    default: return none;
  }
}

}  // namespace colibri::gpu
