// WGSL decoder of F8_E4M3 weights with their F32 block scales (quant/fp8.hpp), as
// DeepSeek-V3 / GLM checkpoints store them: one e4m3 byte per element (binding 0) and, at
// binding 4, the rows of the scale matrix S [ceil(rows / block_rows), ceil(cols /
// block_cols)] that this chunk's rows use, starting with scale row row_base / block_rows
// (Params.aux0 = block_rows, aux1 = block_cols). w = e4m3(code) * S[row / block_rows,
// col / block_cols], rounded once, as quant/fp8.cpp's fp8_dequantize_row.
//
// Exactness. Every e4m3 value is a float32 normal (4 significant bits, at least 2^-9), so
// the one rounding is the product's, which WGSL requires correctly rounded for f32 `*`.
// Where that product is below 2^-126 (a float32 subnormal, which a GPU may flush to zero)
// or the scale itself is subnormal, the value is rounded with integer operations instead
// (round to nearest, ties to even, as IEEE). The codes 0x7f / 0xff are NaN on the CPU
// (OCP e4m3fn) with the code's sign; the shader returns that NaN's bits (0x7fc00000 with
// the sign), which is what the CPU's product of a quiet NaN and a number gives.
//
// The matvec sums w * x over the dequantized values (thread t: columns t, t + 64, ...), so
// its error is that of a plain float32 sum. The CPU sums each column block's e4m3 * x and
// scales it once; both are within the same float32 bound of the exact product.
#include "gpu/matvec_wgsl_types.hpp"

namespace colibri::gpu {

namespace {

const char* kFP8 = R"WGSL(
@group(0) @binding(4) var<storage, read> scales: array<u32>;

// The float32 bits nearest P * 2^E (ties to even), for P < 2^28 and a result far below
// the float32 maximum (here: under 2^-117, the largest code times a subnormal scale):
// keep 24 significant bits, or fewer where the value is subnormal (units of 2^-149). The
// exponent field is added to the rounded significand, so a carry out of it moves the
// exponent up, and a subnormal that rounds up to 2^-126 becomes the smallest normal.
fn round_bits(P: u32, E: i32) -> u32 {
  if (P == 0u) {
    return 0u;
  }
  let top = 31 - i32(countLeadingZeros(P));
  let shift = max(top - 23, -149 - E);
  var q = P;
  if (shift <= 0) {
    q = P << u32(-shift);
  } else {
    let k = u32(shift);
    q = P >> k;
    let rem = P & ((1u << k) - 1u);
    let half = 1u << (k - 1u);
    if (rem > half || (rem == half && (q & 1u) == 1u)) {
      q += 1u;
    }
  }
  return (u32(E + shift + 149) << 23u) + q;
}

// e4m3(code) * scale, rounded once. `s` is the scale's bits.
fn fp8_scaled(code: u32, s: u32) -> f32 {
  let neg = (code & 0x80u) << 24u;
  let c = code & 0x7fu;
  if (c == 0x7fu) {
    return bitcast<f32>(neg | 0x7fc00000u);
  }
  let e = c >> 3u;
  let m = c & 7u;
  // the code's value: (8 + m) * 2^(e - 10), or m * 2^-9 when e == 0
  let v = select(bitcast<f32>(((e + 120u) << 23u) | (m << 20u)), f32(m) * 0.001953125, e == 0u);
  let prod = bitcast<f32>(neg | bitcast<u32>(v)) * bitcast<f32>(s);
  let se = (s >> 23u) & 255u;
  if (se == 255u || (se != 0u && abs(prod) >= 1.1754943508222875e-38)) {
    return prod;  // a normal or infinite product (or a scale that is not finite)
  }
  let sig = select((s & 0x7fffffu) | 0x800000u, s & 0x7fffffu, se == 0u);
  let E = select(i32(e) - 10, -9, e == 0u) + select(i32(se) - 150, -149, se == 0u);
  let sign = neg ^ (s & 0x80000000u);
  return bitcast<f32>(sign | round_bits(select(8u + m, m, e == 0u) * sig, E));
}

fn weight(row_off: u32, k: u32) -> f32 {
  let row = row_off / p.row_bytes;  // row_bytes = cols: one byte per element
  let scols = (p.cols + p.aux1 - 1u) / p.aux1;
  let srow = (p.row_base + row) / p.aux0 - p.row_base / p.aux0;
  return fp8_scaled(byte_at(row_off + k), scales[srow * scols + k / p.aux1]);
}

fn row_part(row_off: u32, t: u32) -> f32 {
  var acc = 0.0;
  for (var k = t; k < p.cols; k += WG) {
    acc += weight(row_off, k) * x[k];
  }
  return acc;
}
)WGSL";

}  // namespace

const char* wgsl_fp8_body() { return kFP8; }

}  // namespace colibri::gpu
