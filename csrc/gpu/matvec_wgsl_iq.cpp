// WGSL decoders of IQ4_NL, IQ4_XS, IQ2_XXS and MXFP4 (layouts in quant/blocks_iq.hpp),
// element for element the operations of quant/iquants_ref.cpp. Their products are exact
// in float32 (IQ4_XS: an 11-bit f16 significand, a 6-bit scale, a 7-bit table value), so
// fusing changes nothing.
#include "gpu/matvec_wgsl_types.hpp"

#include <string>
#include <vector>

#include "quant/iquant_grids.hpp"

namespace colibri::gpu {

namespace {

const char* kKvaluesIq4nl = R"WGSL(
var<private> kv_iq4nl: array<f32, 16> = array<f32, 16>(
  -127.0, -104.0, -83.0, -65.0, -49.0, -35.0, -22.0, -10.0,
  1.0, 13.0, 25.0, 38.0, 53.0, 69.0, 89.0, 113.0);
)WGSL";

// IQ4_NL: 18-byte blocks of 32: f16 d, 16 bytes of nibbles (Q4_0's order);
// w = d * kvalues_iq4nl[nibble] (7 bits times 11: exact).
const char* kIQ4_NL = R"WGSL(
fn sub_scale(row_off: u32, sb: u32) -> Scales {
  return Scales(half_at(row_off + sb * 18u), 0.0, 0.0, 0.0);
}
fn sub_value(sc: Scales, row_off: u32, sb: u32, j: u32) -> f32 {
  let b = byte_at(row_off + sb * 18u + 2u + (j & 15u));
  return sc.x * kv_iq4nl[select(b & 15u, b >> 4u, j >= 16u)];
}
)WGSL";

// IQ2_XXS: 66 bytes: f16 d, then per 32 elements two little-endian words: four 8-bit grid
// indices (one per 8 elements), then four 7-bit sign groups and a 4-bit scale s in the top
// bits. w = ((d * (0.5 + s)) * 0.25) * grid magnitude * sign; the 8th sign of a group makes
// the count of negatives even (kKsignsIq2xs). Every product is exact (11 + 5 + 6 bits).
// The grid (quant/iquant_grids.hpp) is written into the shader as 512 words.
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
  let mag = grid_byte(iq2xxs_grid[2u * g + (j % 8u) / 4u], j % 4u);
  return sc.x * mag * sign_bit(signs, j % 8u);
}
)WGSL";

// A grid table as a private array<u32> of the shader, `words` long (a uint64 table is two
// words per entry, low word first: the byte order of the CPU's own reads). Such an array is
// initialised in every invocation, and lavapipe's compile time grows steeply with its size
// (tried: 1024 words took about 15 s to compile, 2048 about 80 s), so IQ2_XS, IQ2_S,
// IQ1_S and IQ1_M, whose grids are that large, read theirs from a storage binding
// (matvec_wgsl_iq_table.cpp).
std::string wgsl_table(const char* name, const uint32_t* words, int n) {
  const std::string type = "array<u32, " + std::to_string(n) + ">";
  std::string out = std::string("var<private> ") + name + ": " + type + " = " + type + "(";
  for (int i = 0; i < n; ++i) out += (i % 8 == 0 ? "\n  " : " ") + std::to_string(words[i]) + "u,";
  return out + ");\n";
}

std::string wgsl_table(const char* name, const uint64_t* table, int entries) {
  std::vector<uint32_t> words;
  for (int i = 0; i < entries; ++i) {
    words.push_back(static_cast<uint32_t>(table[i]));
    words.push_back(static_cast<uint32_t>(table[i] >> 32));
  }
  return wgsl_table(name, words.data(), 2 * entries);
}

// Shared by the IQ2 / IQ3 types: a little-endian u32 at any byte offset, a grid byte, and
// the sign of bit k of a sign byte.
const char* kGridHelpers = R"WGSL(
fn u32_at(off: u32) -> u32 {
  return byte_at(off) | (byte_at(off + 1u) << 8u) | (byte_at(off + 2u) << 16u) | (byte_at(off + 3u) << 24u);
}
fn grid_byte(word: u32, k: u32) -> f32 {
  return f32((word >> (8u * k)) & 255u);
}
fn sign_bit(signs: u32, k: u32) -> f32 {
  return select(1.0, -1.0, ((signs >> k) & 1u) != 0u);
}
fn ksigns(s7: u32) -> u32 {  // 7 sign bits and the 8th that makes the count even
  return s7 | ((countOneBits(s7) & 1u) << 7u);
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
  let mag = grid_byte(iq3xxs_grid[byte_at(off + 2u + 8u * ib + j / 4u)], j % 4u);
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
  let mag = grid_byte(iq3s_grid[index], j % 4u);
  return sc.x * mag * sign_bit(byte_at(off + 74u + 4u * ib + j / 8u), j % 8u);
}
)WGSL";

// IQ4_XS: 136 bytes: f16 d, u16 scales_h, scales_l[4], qs[128]; sub-block ib's 6-bit scale
// ls is nibble ib % 2 of scales_l[ib / 2] plus bits 2 ib..2 ib+1 of scales_h as bits 4..5;
// element j is kvalues_iq4nl at the low (j < 16) or high nibble of qs[16 ib + j % 16];
// w = (d * (ls - 32)) * kvalue.
const char* kIQ4_XS = R"WGSL(
fn sub_scale(row_off: u32, sb: u32) -> Scales {
  let off = row_off + (sb / 8u) * 136u;
  let ib = sb % 8u;
  let sh = byte_at(off + 2u) | (byte_at(off + 3u) << 8u);
  let ls = ((byte_at(off + 4u + ib / 2u) >> (4u * (ib % 2u))) & 15u) | (((sh >> (2u * ib)) & 3u) << 4u);
  return Scales(half_at(off) * f32(i32(ls) - 32), 0.0, 0.0, 0.0);
}
fn sub_value(sc: Scales, row_off: u32, sb: u32, j: u32) -> f32 {
  let b = byte_at(row_off + (sb / 8u) * 136u + 8u + 16u * (sb % 8u) + (j & 15u));
  return sc.x * kv_iq4nl[select(b & 15u, b >> 4u, j >= 16u)];
}
)WGSL";

// MXFP4: 17 bytes: an E8M0 exponent e, 16 bytes of nibbles ordered as Q4_0's;
// w = kvalues_mxfp4[nibble] * 2^(e - 128) (the table holds e2m1 values doubled). For e < 2
// the scale is a float32 subnormal, which WGSL lets a GPU flush, so the value's bits are
// built with integer operations there (exact); the matvec's products with such a scale
// may still be flushed by the GPU (an absolute error below 2^-126 |x| per element).
const char* kMXFP4 = R"WGSL(
var<private> kv_mxfp4: array<f32, 16> = array<f32, 16>(
  0.0, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 0.0, -1.0, -2.0, -3.0, -4.0, -6.0, -8.0, -12.0);
fn sub_scale(row_off: u32, sb: u32) -> Scales {
  let e = byte_at(row_off + sb * 17u);
  return Scales(f32(e), select(0.0, bitcast<f32>((e - 1u) << 23u), e >= 2u), 0.0, 0.0);
}
fn sub_value(sc: Scales, row_off: u32, sb: u32, j: u32) -> f32 {
  let b = byte_at(row_off + sb * 17u + 1u + (j & 15u));
  let kv = kv_mxfp4[select(b & 15u, b >> 4u, j >= 16u)];
  let e = u32(sc.x);
  if (e >= 2u || kv == 0.0) {
    return kv * sc.y;  // kv == 0: +0, as 0 times the positive scale
  }
  let a = abs(kv);
  let neg = select(0u, 0x80000000u, kv < 0.0);
  let units = u32(a) << (21u + e);  // |w| in units of 2^-149, the smallest subnormal
  if (units < 0x800000u) {
    return bitcast<f32>(neg | units);  // subnormal: the significand is the count
  }
  return bitcast<f32>(neg | (bitcast<u32>(a) - ((128u - e) << 23u)));  // normal: move the exponent
}
)WGSL";

}  // namespace

const char* wgsl_grid_helpers() { return kGridHelpers; }

const char* wgsl_iquant_body(DType type) {
  static const std::string iq4nl = std::string(kKvaluesIq4nl) + kIQ4_NL;
  static const std::string iq4xs = std::string(kKvaluesIq4nl) + kIQ4_XS;
  static const std::string iq2xxs =
      wgsl_table("iq2xxs_grid", iq::kIq2xxsGrid, 256) + kGridHelpers + kIQ2_XXS;
  static const std::string iq3xxs =
      wgsl_table("iq3xxs_grid", iq::kIq3xxsGrid, 256) + kGridHelpers + kIQ3_XXS;
  static const std::string iq3s = wgsl_table("iq3s_grid", iq::kIq3sGrid, 512) + kGridHelpers + kIQ3_S;
  switch (type) {
    case DType::IQ4_NL: return iq4nl.c_str();
    case DType::IQ4_XS: return iq4xs.c_str();
    case DType::IQ2_XXS: return iq2xxs.c_str();
    case DType::IQ3_XXS: return iq3xxs.c_str();
    case DType::IQ3_S: return iq3s.c_str();
    case DType::MXFP4: return kMXFP4;
    default: return nullptr;
  }
}

}  // namespace colibri::gpu
