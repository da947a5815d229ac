// WGSL decoders of the K-quants (256-element super-blocks, layouts in quant/blocks_k.hpp),
// element for element the operations of quant/kquants_ref.cpp. Every product there is
// exact in float32 (an 11-bit f16 significand times a scale of at most 8 bits times a
// quant of at most 6: 23 bits at most, and no underflow since the smallest f16 is 2^-24),
// so a compiler that fuses a multiply with the following subtract gives the same bits.
// Sub-block sb of a row is 32-element sub-block sb % 8 of super-block sb / 8.
#include "gpu/matvec_wgsl_types.hpp"

namespace colibri::gpu {

namespace {

// The 6-bit scale and min of sub-block s (0..7) from Q4_K / Q5_K's 12 packed bytes at
// `off` (quant/kquant_common.hpp, scale_min_k4).
const char* kScaleMinK4 = R"WGSL(
fn scale_min_k4(off: u32, s: u32) -> vec2<f32> {
  if (s < 4u) {
    return vec2<f32>(f32(byte_at(off + s) & 63u), f32(byte_at(off + s + 4u) & 63u));
  }
  let sc = (byte_at(off + s + 4u) & 15u) | ((byte_at(off + s - 4u) >> 6u) << 4u);
  let m = (byte_at(off + s + 4u) >> 4u) | ((byte_at(off + s) >> 6u) << 4u);
  return vec2<f32>(f32(sc), f32(m));
}
)WGSL";

// Q4_K: 144 bytes: f16 d, f16 dmin, 12 scale bytes, 128 bytes of nibbles; sub-block s's
// element j is the low (s even) or high nibble of qs[32 (s / 2) + j];
// w = (d * sc) * q - dmin * m. Its row_part reads the nibbles a word at a time (rows are
// whole 144-byte blocks, so every block is 4-aligned) and sums sub_value's values in order.
const char* kQ4_K = R"WGSL(
fn sub_scale(row_off: u32, sb: u32) -> Scales {
  let off = row_off + (sb / 8u) * 144u;
  let sm = scale_min_k4(off + 4u, sb % 8u);
  return Scales(half_at(off) * sm.x, half_at(off + 2u) * sm.y, 0.0, 0.0);
}
fn sub_value(sc: Scales, row_off: u32, sb: u32, j: u32) -> f32 {
  let s = sb % 8u;
  let b = byte_at(row_off + (sb / 8u) * 144u + 16u + 32u * (s / 2u) + j);
  let q = select(b & 15u, b >> 4u, (s & 1u) != 0u);
  return sc.x * f32(q) - sc.y;
}
fn row_part(row_off: u32, t: u32) -> f32 {  // sub_value's values, the nibbles 8 to a word
  var acc = 0.0;
  let nsb = p.cols / 32u;
  for (var sb = t; sb < nsb; sb += WG) {
    let sc = sub_scale(row_off, sb);
    let s = sb % 8u;
    let qs = (row_off + (sb / 8u) * 144u + 16u + 32u * (s / 2u)) >> 2u;  // 144-byte blocks: aligned
    let shift = 4u * (s & 1u);
    for (var i = 0u; i < 8u; i++) {
      let word = w[qs + i] >> shift;
      for (var k = 0u; k < 4u; k++) {
        acc += (sc.x * f32((word >> (8u * k)) & 15u) - sc.y) * x[sb * 32u + 4u * i + k];
      }
    }
  }
  return acc;
}
)WGSL";

// Q5_K: 176 bytes: as Q4_K with 32 bytes qh before the nibbles; bit s of qh[j] is the
// quant's fifth bit.
const char* kQ5_K = R"WGSL(
fn sub_scale(row_off: u32, sb: u32) -> Scales {
  let off = row_off + (sb / 8u) * 176u;
  let sm = scale_min_k4(off + 4u, sb % 8u);
  return Scales(half_at(off) * sm.x, half_at(off + 2u) * sm.y, 0.0, 0.0);
}
fn sub_value(sc: Scales, row_off: u32, sb: u32, j: u32) -> f32 {
  let s = sb % 8u;
  let off = row_off + (sb / 8u) * 176u;
  let b = byte_at(off + 48u + 32u * (s / 2u) + j);
  let lo = select(b & 15u, b >> 4u, (s & 1u) != 0u);
  let hi = (byte_at(off + 16u + j) >> s) & 1u;
  return sc.x * f32(lo | (hi << 4u)) - sc.y;
}
)WGSL";

// Q6_K: 210 bytes: ql[128], qh[64], int8 scales[16] (one per 16 elements), f16 d at 208.
// Sub-block s = 4 h + k: low bits from ql[64 h + j + 32 (k & 1)] (low nibble for k < 2),
// two high bits from qh[32 h + j] >> 2k; w = (d * scale) * (q - 32).
const char* kQ6_K = R"WGSL(
fn sub_scale(row_off: u32, sb: u32) -> Scales {
  let off = row_off + (sb / 8u) * 210u;
  let d = half_at(off + 208u);
  let sc = off + 192u + 2u * (sb % 8u);
  return Scales(d * i8_at(sc), d * i8_at(sc + 1u), 0.0, 0.0);
}
fn sub_value(sc: Scales, row_off: u32, sb: u32, j: u32) -> f32 {
  let s = sb % 8u;
  let h = s / 4u;
  let k = s % 4u;
  let off = row_off + (sb / 8u) * 210u;
  let b = byte_at(off + 64u * h + j + 32u * (k & 1u));
  let lo = select(b & 15u, b >> 4u, k >= 2u);
  let hi = (byte_at(off + 128u + 32u * h + j) >> (2u * k)) & 3u;
  return select(sc.x, sc.y, j >= 16u) * f32(i32(lo | (hi << 4u)) - 32);
}
)WGSL";

// Q2_K: 84 bytes: scales[16] (low nibble: scale, high: min, one byte per 16 elements),
// qs[64], f16 d, f16 dmin. Sub-block s's element j is bits 2 (s % 4) of qs[32 (s / 4) + j];
// w = (d * sc) * q - dmin * m.
const char* kQ2_K = R"WGSL(
fn sub_scale(row_off: u32, sb: u32) -> Scales {
  let off = row_off + (sb / 8u) * 84u;
  let a = byte_at(off + 2u * (sb % 8u));
  let b = byte_at(off + 2u * (sb % 8u) + 1u);
  let d = half_at(off + 80u);
  let dmin = half_at(off + 82u);
  return Scales(d * f32(a & 15u), dmin * f32(a >> 4u), d * f32(b & 15u), dmin * f32(b >> 4u));
}
fn sub_value(sc: Scales, row_off: u32, sb: u32, j: u32) -> f32 {
  let s = sb % 8u;
  let q = (byte_at(row_off + (sb / 8u) * 84u + 16u + 32u * (s / 4u) + j) >> (2u * (s % 4u))) & 3u;
  if (j < 16u) {
    return sc.x * f32(q) - sc.y;
  }
  return sc.z * f32(q) - sc.w;
}
)WGSL";

// Q3_K: 110 bytes: hmask[32], qs[64], 12 bytes of 16 signed 6-bit scales, f16 d. The quant
// is Q2_K's two bits minus 4 unless bit 4 (s / 4) + s % 4 of hmask[j] is set;
// w = (d * scale) * q, the scale one per 16 elements (kquant_common.hpp, q3k_scales).
const char* kQ3_K = R"WGSL(
fn q3k_scale(off: u32, g: u32) -> f32 {
  let lo = select(byte_at(off + g - 8u) >> 4u, byte_at(off + g) & 15u, g < 8u);
  let hi = (byte_at(off + 8u + g % 4u) >> (2u * (g / 4u))) & 3u;
  return f32(i32(lo | (hi << 4u)) - 32);
}
fn sub_scale(row_off: u32, sb: u32) -> Scales {
  let off = row_off + (sb / 8u) * 110u;
  let d = half_at(off + 108u);
  let s = sb % 8u;
  return Scales(d * q3k_scale(off + 96u, 2u * s), d * q3k_scale(off + 96u, 2u * s + 1u), 0.0, 0.0);
}
fn sub_value(sc: Scales, row_off: u32, sb: u32, j: u32) -> f32 {
  let s = sb % 8u;
  let off = row_off + (sb / 8u) * 110u;
  let lo = (byte_at(off + 32u + 32u * (s / 4u) + j) >> (2u * (s % 4u))) & 3u;
  let hbit = (byte_at(off + j) >> (4u * (s / 4u) + s % 4u)) & 1u;
  return select(sc.y, sc.x, j < 16u) * f32(i32(lo) - select(4, 0, hbit != 0u));
}
)WGSL";

std::string with_scale_min(const char* body) { return std::string(kScaleMinK4) + body; }

}  // namespace

const char* wgsl_kquant_body(DType type) {
  static const std::string q4k = with_scale_min(kQ4_K), q5k = with_scale_min(kQ5_K);
  switch (type) {
    case DType::Q4_K: return q4k.c_str();
    case DType::Q5_K: return q5k.c_str();
    case DType::Q6_K: return kQ6_K;
    case DType::Q2_K: return kQ2_K;
    case DType::Q3_K: return kQ3_K;
    default: return nullptr;
  }
}

}  // namespace colibri::gpu
