// The kernels. W is bound as array<u32> holding a chunk of whole rows in their GGUF block
// bytes; each type supplies `weight(row_off, k)` (one element, for dequant) and
// `row_part(row_off, t)` (thread t's share of a row's dot product with x). F32, F16, BF16,
// Q8_0 and Q4_0 are here; Q4_1, Q5_0, Q5_1 (here) and the types in matvec_wgsl_k.cpp /
// matvec_wgsl_iq.cpp / matvec_wgsl_iq_table.cpp use the 32-element sub-block driver below
// (kSub32); F8_E4M3 is matvec_wgsl_fp8.cpp.
//
// Reduction order is fixed, so results are bit-identical run to run: one workgroup per
// row; thread t sums the elements (or blocks) t, t+64, t+128, ... in increasing order,
// then a tree over workgroup memory adds partial[t] + partial[t+s] for s = 32, 16, ..., 1.
// No atomics anywhere. f16 scales are decoded with integer operations (not
// unpack2x16float, which may flush subnormals), so dequantization is exact everywhere.
#include "gpu/matvec_wgsl.hpp"

#include "common/errors.hpp"
#include "gpu/device.hpp"
#include "gpu/matvec_wgsl_types.hpp"

namespace colibri::gpu {

namespace {

const char* kPrelude = R"WGSL(
struct Params {
  rows: u32,       // rows in this chunk
  cols: u32,
  row_base: u32,   // first row of this chunk in the whole matrix
  row_bytes: u32,
  nx_rows: u32,    // matvec: workgroups along x (rows = x + y * nx_rows)
  nx_elems: u32,   // dequant: workgroups along x
  aux0: u32,       // F8_E4M3: block_rows of its scales (matvec_wgsl_fp8.cpp)
  aux1: u32,       // F8_E4M3: block_cols
}
@group(0) @binding(0) var<storage, read> w: array<u32>;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

const WG: u32 = 64u;
alias Scales = vec4<f32>;  // a sub-block's decoded scales (see kSub32), as the type uses them
var<workgroup> partial: array<f32, 64>;

fn byte_at(off: u32) -> u32 {
  return (w[off >> 2u] >> ((off & 3u) * 8u)) & 0xffu;
}

fn i8_at(off: u32) -> f32 {
  return f32(bitcast<i32>(byte_at(off) << 24u) >> 24u);
}

// The little-endian u32 at any byte offset: one word, or two funnelled (the second read
// only when the value straddles them, so never past the end of the binding).
fn u32_at(off: u32) -> u32 {
  let i = off >> 2u;
  let s = (off & 3u) * 8u;
  if (s == 0u) {
    return w[i];
  }
  return (w[i] >> s) | (w[i + 1u] << (32u - s));
}

// The little-endian u16 at an even byte offset.
fn u16_at(off: u32) -> u32 {
  return (w[off >> 2u] >> ((off & 2u) * 8u)) & 0xffffu;
}

// IEEE half -> f32, exactly (subnormals kept). `off` is even.
fn half_at(off: u32) -> f32 {
  return half_bits(u16_at(off));
}

fn half_bits(h: u32) -> f32 {
  let s = (h & 0x8000u) << 16u;
  let e = (h >> 10u) & 0x1fu;
  let m = h & 0x3ffu;
  if (e == 0u) {
    let v = f32(m) * 5.9604644775390625e-8;  // m * 2^-24
    return select(v, -v, s != 0u);
  }
  if (e == 31u) {
    return bitcast<f32>(s | 0x7f800000u | (m << 13u));
  }
  return bitcast<f32>(s | ((e + 112u) << 23u) | (m << 13u));
}
)WGSL";

const char* kF32 = R"WGSL(
fn weight(row_off: u32, k: u32) -> f32 {
  return bitcast<f32>(w[(row_off >> 2u) + k]);
}
fn row_part(row_off: u32, t: u32) -> f32 {
  var acc = 0.0;
  for (var k = t; k < p.cols; k += WG) {
    acc += weight(row_off, k) * x[k];
  }
  return acc;
}
)WGSL";

const char* kF16 = R"WGSL(
fn weight(row_off: u32, k: u32) -> f32 {
  return half_at(row_off + 2u * k);
}
fn row_part(row_off: u32, t: u32) -> f32 {
  var acc = 0.0;
  for (var k = t; k < p.cols; k += WG) {
    acc += weight(row_off, k) * x[k];
  }
  return acc;
}
)WGSL";

// BF16: the high half of an f32, so decoding is a shift.
const char* kBF16 = R"WGSL(
fn weight(row_off: u32, k: u32) -> f32 {
  let off = row_off + 2u * k;
  return bitcast<f32>(((w[off >> 2u] >> ((off & 2u) * 8u)) & 0xffffu) << 16u);
}
fn row_part(row_off: u32, t: u32) -> f32 {
  var acc = 0.0;
  for (var k = t; k < p.cols; k += WG) {
    acc += weight(row_off, k) * x[k];
  }
  return acc;
}
)WGSL";

// Q8_0: 34-byte blocks of 32: f16 d, int8 q[32]; w = d * q. The matvec reads the quants
// four to a word (u32_at), summing them in the element order j = 0..31.
const char* kQ8_0 = R"WGSL(
fn weight(row_off: u32, k: u32) -> f32 {
  let off = row_off + (k / 32u) * 34u;
  return half_at(off) * i8_at(off + 2u + k % 32u);
}
fn row_part(row_off: u32, t: u32) -> f32 {
  var acc = 0.0;
  let nb = p.cols / 32u;
  for (var b = t; b < nb; b += WG) {
    let off = row_off + b * 34u;
    var s = 0.0;
    for (var i = 0u; i < 8u; i++) {
      let q = u32_at(off + 2u + 4u * i);
      let j = b * 32u + 4u * i;
      s += f32(bitcast<i32>(q << 24u) >> 24u) * x[j];
      s += f32(bitcast<i32>(q << 16u) >> 24u) * x[j + 1u];
      s += f32(bitcast<i32>(q << 8u) >> 24u) * x[j + 2u];
      s += f32(bitcast<i32>(q) >> 24u) * x[j + 3u];
    }
    acc += half_at(off) * s;
  }
  return acc;
}
)WGSL";

// Q4_0: 18-byte blocks of 32: f16 d, 16 bytes of nibbles; element j < 16 is the low
// nibble of byte j, element j + 16 its high nibble; w = d * (nibble - 8). The matvec reads
// the nibbles four bytes to a word.
const char* kQ4_0 = R"WGSL(
fn nibble(off: u32, j: u32) -> f32 {
  let b = byte_at(off + 2u + (j & 15u));
  let q = select(b & 15u, b >> 4u, j >= 16u);
  return f32(i32(q) - 8);
}
fn weight(row_off: u32, k: u32) -> f32 {
  let off = row_off + (k / 32u) * 18u;
  return half_at(off) * nibble(off, k % 32u);
}
fn row_part(row_off: u32, t: u32) -> f32 {
  var acc = 0.0;
  let nb = p.cols / 32u;
  for (var b = t; b < nb; b += WG) {
    let off = row_off + b * 18u;
    var s = 0.0;
    for (var i = 0u; i < 4u; i++) {
      let word = u32_at(off + 2u + 4u * i);
      for (var k = 0u; k < 4u; k++) {
        let q = (word >> (8u * k)) & 255u;
        let j = b * 32u + 4u * i + k;
        s += f32(i32(q & 15u) - 8) * x[j];
        s += f32(i32(q >> 4u) - 8) * x[j + 16u];
      }
    }
    acc += half_at(off) * s;
  }
  return acc;
}
)WGSL";

// Q4_1: 20-byte blocks of 32: f16 d, f16 m, 16 bytes of nibbles ordered as Q4_0's;
// w = nibble * d + m. nibble * d is exact in f32 (4 bits times an 11-bit significand), so
// the one rounding is the add's, with or without a fused multiply-add: the value is the
// CPU reference's whether or not the compiler contracts (WGSL does not forbid it).
const char* kQ4_1 = R"WGSL(
fn sub_scale(row_off: u32, sb: u32) -> Scales {
  let off = row_off + sb * 20u;
  return Scales(half_at(off), half_at(off + 2u), 0.0, 0.0);
}
fn sub_value(sc: Scales, row_off: u32, sb: u32, j: u32) -> f32 {
  let b = byte_at(row_off + sb * 20u + 4u + (j & 15u));
  let q = select(b & 15u, b >> 4u, j >= 16u);
  return f32(q) * sc.x + sc.y;
}
)WGSL";

// Q5_0: 22-byte blocks: f16 d, 4 bytes qh, 16 bytes of nibbles (Q4_0's order); the quant is
// the nibble plus 16 times bit j of qh (little-endian); w = d * (q - 16).
// Q5_1: 24-byte blocks: f16 d, f16 m, qh, nibbles; w = d * q + m (the product is exact:
// 5 bits times 11, so the add is the one rounding, fused or not).
const char* kQ5 = R"WGSL(
fn q5_at(off: u32, j: u32) -> u32 {  // off: the block's qh; the nibbles follow it
  let b = byte_at(off + 4u + (j & 15u));
  let lo = select(b & 15u, b >> 4u, j >= 16u);
  return lo | (((byte_at(off + j / 8u) >> (j % 8u)) & 1u) << 4u);
}
)WGSL";
const char* kQ5_0 = R"WGSL(
fn sub_scale(row_off: u32, sb: u32) -> Scales {
  return Scales(half_at(row_off + sb * 22u), 0.0, 0.0, 0.0);
}
fn sub_value(sc: Scales, row_off: u32, sb: u32, j: u32) -> f32 {
  return sc.x * f32(i32(q5_at(row_off + sb * 22u + 2u, j)) - 16);
}
)WGSL";
const char* kQ5_1 = R"WGSL(
fn sub_scale(row_off: u32, sb: u32) -> Scales {
  let off = row_off + sb * 24u;
  return Scales(half_at(off), half_at(off + 2u), 0.0, 0.0);
}
fn sub_value(sc: Scales, row_off: u32, sb: u32, j: u32) -> f32 {
  return sc.x * f32(q5_at(row_off + sb * 24u + 4u, j)) + sc.y;
}
)WGSL";

// The driver of the types decoded per 32-element sub-block: the type supplies
// `sub_scale(row_off, sb)` (its sub-block's scales, decoded once) and
// `sub_value(scales, row_off, sb, j)` (element j of it, exactly as the CPU reference
// computes it). The matvec sums w * x over the dequantized values, so its error is that of
// a plain float32 sum whatever the type's scale/min arithmetic. A type may bring its own
// row_part (reading its bytes a word at a time) that sums the same values in the same order
// (kSub32Rows is then left out).
const char* kSub32Weight = R"WGSL(
fn weight(row_off: u32, k: u32) -> f32 {
  let sb = k / 32u;
  return sub_value(sub_scale(row_off, sb), row_off, sb, k % 32u);
}
)WGSL";
const char* kSub32Rows = R"WGSL(
fn row_part(row_off: u32, t: u32) -> f32 {
  var acc = 0.0;
  let nsb = p.cols / 32u;
  for (var sb = t; sb < nsb; sb += WG) {
    let sc = sub_scale(row_off, sb);
    for (var j = 0u; j < 32u; j++) {
      acc += sub_value(sc, row_off, sb, j) * x[sb * 32u + j];
    }
  }
  return acc;
}
)WGSL";

const char* kEntries = R"WGSL(
@compute @workgroup_size(64)
fn matvec(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) t: u32) {
  let row = wid.x + wid.y * p.nx_rows;
  if (row >= p.rows) {
    return;  // the whole workgroup: row depends on the workgroup id only
  }
  partial[t] = row_part(row * p.row_bytes, t);
  workgroupBarrier();
  for (var s = WG / 2u; s > 0u; s = s / 2u) {
    if (t < s) {
      partial[t] = partial[t] + partial[t + s];
    }
    workgroupBarrier();
  }
  if (t == 0u) {
    y[p.row_base + row] = partial[0];
  }
}

@compute @workgroup_size(64)
fn dequant(@builtin(global_invocation_id) gid: vec3<u32>) {
  _ = x[0];  // x is unused here but part of the shared bind group layout
  let i = gid.x + gid.y * p.nx_elems * WG;
  if (i >= p.rows * p.cols) {
    return;
  }
  let row = i / p.cols;
  y[p.row_base * p.cols + i] = weight(row * p.row_bytes, i % p.cols);
}
)WGSL";

// The types whose body defines row_part itself (over the sub-block driver's weight()).
bool own_row_part(DType type) { return type == DType::Q4_K || type == DType::IQ2_XXS; }

}  // namespace

std::string matvec_shader(DType type) {
  const std::string sub32 = std::string(kSub32Weight) + (own_row_part(type) ? "" : kSub32Rows);
  const char* body = nullptr;
  const char* driver = sub32.c_str();  // all but the first five types and FP8
  switch (type) {
    case DType::F32: body = kF32; driver = ""; break;
    case DType::F16: body = kF16; driver = ""; break;
    case DType::BF16: body = kBF16; driver = ""; break;
    case DType::Q8_0: body = kQ8_0; driver = ""; break;
    case DType::Q4_0: body = kQ4_0; driver = ""; break;
    case DType::Q4_1: body = kQ4_1; break;
    case DType::Q5_0: return std::string(kPrelude) + kQ5 + kQ5_0 + sub32 + kEntries;
    case DType::Q5_1: return std::string(kPrelude) + kQ5 + kQ5_1 + sub32 + kEntries;
    case DType::F8_E4M3: body = wgsl_fp8_body(); driver = ""; break;
    default:
      body = wgsl_kquant_body(type);
      if (body == nullptr) body = wgsl_iquant_body(type);
      if (body == nullptr) body = wgsl_iquant_grid_body(type);
      break;
  }
  if (body == nullptr) {
    fail(ErrorKind::Unsupported, "no GPU kernel for " + dtype_name(type) +
                                     " weights yet (GPU kernels: " + gpu_kernel_type_names() + ")");
  }
  return std::string(kPrelude) + body + driver + kEntries;
}

}  // namespace colibri::gpu
