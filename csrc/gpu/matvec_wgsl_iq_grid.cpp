// WGSL decoders of the i-quants with a lattice: IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S,
// IQ1_S, IQ1_M (layouts in quant/blocks_iq.hpp), element for element the operations of
// quant/iquants_ref.cpp. The lattice (quant/iquant_grids.hpp: 256 to 2048 points) is a
// read-only storage binding (`grid`, binding 4), uploaded once per device; shader_table
// gives its words (a uint64 entry i is words 2i, 2i + 1, low word first: the byte order of
// the CPU's own reads). Written into the shader as a private array instead, the lattice is
// initialised in every invocation and lavapipe's compile time grows steeply with its size
// (measured, docs/gpu.md: IQ2_XXS's 512 words took about 40 s, IQ2_XS's 1024 about 100 s).
//
// Every product is exact in float32, so a fused multiply-add changes nothing: the IQ2 /
// IQ3 types `(d * (0.5 + s)) * 0.25 or 0.5` or `d * (1 + 2 s)`, times a magnitude: at most
// 11 + 5 + 6 bits; IQ1_S / IQ1_M `(d * (2 s + 1)) * (g + delta)` with g in {-1, 0, 1} and
// delta = ±1/8: 11 + 4 + 4 bits, and g + delta itself exact.
#include <vector>

#include "gpu/matvec_wgsl.hpp"
#include "gpu/matvec_wgsl_types.hpp"
#include "quant/iquant_grids.hpp"

namespace colibri::gpu {

namespace {

const char* kGridBinding = R"WGSL(
@group(0) @binding(4) var<storage, read> grid: array<u32>;
)WGSL";

// Shared by the IQ2 / IQ3 types: a grid byte, the sign of bit k of a sign byte, and the
// eighth sign bit of a group of seven (kKsignsIq2xs: the count of negatives made even).
const char* kGridHelpers = R"WGSL(
fn grid_byte(word: u32, k: u32) -> f32 {
  return f32((word >> (8u * k)) & 255u);
}
fn sign_bit(signs: u32, k: u32) -> f32 {
  return select(1.0, -1.0, ((signs >> k) & 1u) != 0u);
}
fn ksigns(s7: u32) -> u32 {
  return s7 | ((countOneBits(s7) & 1u) << 7u);
}
)WGSL";

// IQ2_XXS: 66 bytes: f16 d, then per 32 elements two little-endian words: four 8-bit grid
// indices (one per 8 elements), then four 7-bit sign groups and a 4-bit scale s in the top
// bits. w = ((d * (0.5 + s)) * 0.25) * grid magnitude * sign. Its own row_part reads the two
// words once per sub-block (the values and their order are sub_value's).
const char* kIQ2_XXS = R"WGSL(
fn sub_scale(row_off: u32, sb: u32) -> Scales {
  let off = row_off + (sb / 8u) * 66u;
  let sg = u32_at(off + 2u + 8u * (sb % 8u) + 4u);
  return Scales(half_at(off) * (0.5 + f32(sg >> 28u)) * 0.25, 0.0, 0.0, 0.0);
}
fn sub_value(sc: Scales, row_off: u32, sb: u32, j: u32) -> f32 {
  let off = row_off + (sb / 8u) * 66u + 2u + 8u * (sb % 8u);
  let l = j / 8u;
  let g = byte_at(off + l);
  let signs = ksigns((u32_at(off + 4u) >> (7u * l)) & 127u);
  let mag = grid_byte(grid[2u * g + (j % 8u) / 4u], j % 4u);
  return sc.x * mag * sign_bit(signs, j % 8u);
}
fn row_part(row_off: u32, t: u32) -> f32 {
  var acc = 0.0;
  let nsb = p.cols / 32u;
  for (var sb = t; sb < nsb; sb += WG) {
    let sc = sub_scale(row_off, sb);
    let off = row_off + (sb / 8u) * 66u + 2u + 8u * (sb % 8u);
    let idx = u32_at(off);
    let sg = u32_at(off + 4u);
    for (var l = 0u; l < 4u; l++) {
      let g = (idx >> (8u * l)) & 255u;
      let signs = ksigns((sg >> (7u * l)) & 127u);
      for (var h = 0u; h < 2u; h++) {
        let word = grid[2u * g + h];
        for (var k = 0u; k < 4u; k++) {
          let j = 8u * l + 4u * h + k;
          acc += sc.x * grid_byte(word, k) * sign_bit(signs, 4u * h + k) * x[sb * 32u + j];
        }
      }
    }
  }
  return acc;
}
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

// IQ3_XXS: 98 bytes: f16 d, 64 index bytes (one per 4 elements, a 256-entry grid of 4
// magnitudes), then per 32 elements a word of 4 x 7 sign bits and a 4-bit scale;
// w = ((d * (0.5 + s)) * 0.5) * magnitude * sign.
const char* kIQ3_XXS = R"WGSL(
fn sub_scale(row_off: u32, sb: u32) -> Scales {
  let off = row_off + (sb / 8u) * 98u;
  let sg = u32_at(off + 66u + 4u * (sb % 8u));
  return Scales(half_at(off) * (0.5 + f32(sg >> 28u)) * 0.5, 0.0, 0.0, 0.0);
}
fn sub_value(sc: Scales, row_off: u32, sb: u32, j: u32) -> f32 {
  let off = row_off + (sb / 8u) * 98u;
  let ib = sb % 8u;
  let sg = u32_at(off + 66u + 4u * ib);
  let mag = grid_byte(grid[byte_at(off + 2u + 8u * ib + j / 4u)], j % 4u);
  return sc.x * mag * sign_bit(ksigns((sg >> (7u * (j / 8u))) & 127u), j % 8u);
}
)WGSL";

// IQ3_S: 110 bytes: f16 d, qs[64] (index low bytes, one per 4 elements), qh[8] (the ninth
// index bit), signs[32] (a byte per 8 elements), scales[4] (a nibble per 32);
// w = (d * (1 + 2 s)) * magnitude * sign, a 512-entry grid of 4 odd magnitudes.
const char* kIQ3_S = R"WGSL(
fn sub_scale(row_off: u32, sb: u32) -> Scales {
  let off = row_off + (sb / 8u) * 110u;
  let ib = sb % 8u;
  let s = (byte_at(off + 106u + ib / 2u) >> (4u * (ib % 2u))) & 15u;
  return Scales(half_at(off) * f32(1u + 2u * s), 0.0, 0.0, 0.0);
}
fn sub_value(sc: Scales, row_off: u32, sb: u32, j: u32) -> f32 {
  let off = row_off + (sb / 8u) * 110u;
  let ib = sb % 8u;
  let k = j / 4u;  // which 4-element group of the 32
  let index = byte_at(off + 2u + 8u * ib + k) | (((byte_at(off + 66u + ib) >> k) & 1u) << 8u);
  let mag = grid_byte(grid[index], j % 4u);
  return sc.x * mag * sign_bit(byte_at(off + 74u + 4u * ib + j / 8u), j % 8u);
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

const char* wgsl_iquant_grid_body(DType type) {
  static const std::string iq2xxs = std::string(kGridBinding) + kGridHelpers + kIQ2_XXS;
  static const std::string iq2xs = std::string(kGridBinding) + kGridHelpers + kIQ2_XS;
  static const std::string iq2s = std::string(kGridBinding) + kGridHelpers + kIQ2_S;
  static const std::string iq3xxs = std::string(kGridBinding) + kGridHelpers + kIQ3_XXS;
  static const std::string iq3s = std::string(kGridBinding) + kGridHelpers + kIQ3_S;
  static const std::string iq1s = std::string(kGridBinding) + kIq1Grid + kIQ1_S;
  static const std::string iq1m = std::string(kGridBinding) + kIq1Grid + kIQ1_M;
  switch (type) {
    case DType::IQ2_XXS: return iq2xxs.c_str();
    case DType::IQ3_XXS: return iq3xxs.c_str();
    case DType::IQ3_S: return iq3s.c_str();
    case DType::IQ2_XS: return iq2xs.c_str();
    case DType::IQ2_S: return iq2s.c_str();
    case DType::IQ1_S: return iq1s.c_str();
    case DType::IQ1_M: return iq1m.c_str();
    default: return nullptr;
  }
}

const std::vector<uint32_t>& shader_table(DType type) {
  static const std::vector<uint32_t> none;
  static const std::vector<uint32_t> iq2xxs = words_of(iq::kIq2xxsGrid, 256);
  static const std::vector<uint32_t> iq3xxs(iq::kIq3xxsGrid, iq::kIq3xxsGrid + 256);
  static const std::vector<uint32_t> iq3s(iq::kIq3sGrid, iq::kIq3sGrid + 512);
  static const std::vector<uint32_t> iq2xs = words_of(iq::kIq2xsGrid, 512);
  static const std::vector<uint32_t> iq2s = words_of(iq::kIq2sGrid, 1024);
  static const std::vector<uint32_t> iq1s = words_of(iq::kIq1sGrid, 2048);
  switch (type) {
    case DType::IQ2_XXS: return iq2xxs;
    case DType::IQ3_XXS: return iq3xxs;
    case DType::IQ3_S: return iq3s;
    case DType::IQ2_XS: return iq2xs;
    case DType::IQ2_S: return iq2s;
    case DType::IQ1_S: case DType::IQ1_M: return iq1s;
    default: return none;
  }
}

}  // namespace colibri::gpu
