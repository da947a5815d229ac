// WGSL decoders of IQ4_NL, IQ4_XS and MXFP4 (layouts in quant/blocks_iq.hpp), element for
// element the operations of quant/iquants_ref.cpp; their 16-value tables are written into
// the shader. Their products are exact in float32 (IQ4_XS: an 11-bit f16 significand, a
// 6-bit scale, a 7-bit table value), so fusing changes nothing. The i-quants with a
// lattice (IQ2_*, IQ3_*, IQ1_*) are matvec_wgsl_iq_grid.cpp.
#include "gpu/matvec_wgsl_types.hpp"

#include <string>

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

const char* wgsl_iquant_body(DType type) {
  static const std::string iq4nl = std::string(kKvaluesIq4nl) + kIQ4_NL;
  static const std::string iq4xs = std::string(kKvaluesIq4nl) + kIQ4_XS;
  switch (type) {
    case DType::IQ4_NL: return iq4nl.c_str();
    case DType::IQ4_XS: return iq4xs.c_str();
    case DType::MXFP4: return kMXFP4;
    default: return nullptr;
  }
}

}  // namespace colibri::gpu
