// colibri's own quantizers for the low-bit i-quants. llama.cpp refuses these types without
// an importance matrix; colibri quantizes without one, using llama.cpp's weighting with the
// importance set to 1: weight_j = sqrt(sigma2 + x_j^2), sigma2 = 2 * mean(x^2) over the
// super-block (what llama.cpp's i-quant quantizers compute with qw_j = 1).
//
// IQ2_XXS has its own fit below (the first one written; kept as it is so the files it wrote
// keep their bytes). The other types (IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M) share the
// lattice fit of iquant_fit.cpp and are only packed here, per format.
//
// IQ2_XXS: per 32-block, signs come from the data (with the
// smallest weighted element flipped where the count of negatives in a group of 8 is odd:
// the format stores 7 sign bits and implies even parity); the magnitudes are fitted by a
// scale search (candidate scales around max / 43), each group of 8 taking the lattice point
// of least weighted error among all 256. The block scales are then coded as 4-bit multiples of
// the super-block's half scale and every group is refitted to its final scale. Not
// byte-compatible with llama.cpp (which has no imatrix-free IQ2_XXS): checked by
// dequantizing with gguf and by running the file in llama.cpp (tests/kernels/test_iquant_quantizer.py, test_iquants_real.py).
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <cmath>
#include <cstring>
#include <vector>

#include "quant/blocks_iq.hpp"
#include "quant/fp16.hpp"
#include "quant/iquant_fit.hpp"
#include "quant/iquant_grids.hpp"
#include "quant/iquants_ref.hpp"

namespace colibri::iq {
namespace {

// The IQ2_XXS lattice as floats, transposed (element j of every point in one row) so the
// per-point sums below vectorize over the 256 points.
struct Iq2xxsLattice {
  float g[8][256];
  float g2[8][256];
  Iq2xxsLattice() {
    for (int i = 0; i < 256; ++i)
      for (int j = 0; j < 8; ++j) {
        g[j][i] = static_cast<float>(static_cast<uint8_t>(kIq2xxsGrid[i] >> (8 * j)));
        g2[j][i] = g[j][i] * g[j][i];
      }
  }
};

const Iq2xxsLattice& lattice() {
  static const Iq2xxsLattice l;
  return l;
}

// For one group of 8 (signed magnitudes a, weights w) and every lattice point i:
// c[i] = sum_j w_j a_j g_ij and e[i] = sum_j w_j g_ij^2. The weighted error of point i at
// scale s is then sum w a^2 - 2 s c[i] + s^2 e[i]: one pass serves every candidate scale.
struct GroupFit {
  float c[256], e[256];
  void compute(const float* a, const float* w) {
    const Iq2xxsLattice& L = lattice();
    for (int i = 0; i < 256; ++i) c[i] = e[i] = 0.0f;
    for (int j = 0; j < 8; ++j) {
      const float wa = w[j] * a[j], ww = w[j];
      for (int i = 0; i < 256; ++i) {
        c[i] += wa * L.g[j][i];
        e[i] += ww * L.g2[j][i];
      }
    }
  }
  int best(float s) const {
    int bi = 0;
    float be = INFINITY;
    for (int i = 0; i < 256; ++i) {
      const float err = s * (s * e[i] - 2.0f * c[i]);
      if (err < be) {
        be = err;
        bi = i;
      }
    }
    return bi;
  }
};

// Fits one 32-block (4 groups): indices and the least-squares scale of the best candidate.
void fit_block(const GroupFit* fits, const float* a, const float* w, float max, int* idx, float* scale) {
  const Iq2xxsLattice& L = lattice();
  float best_err = INFINITY;
  for (int c = 0; c < 9; ++c) {
    const float s = max / 43.0f * (0.6f + 0.075f * static_cast<float>(c));
    int cand[4];
    float sag = 0.0f, sgg = 0.0f, saa = 0.0f;
    for (int k = 0; k < 4; ++k) {
      cand[k] = fits[k].best(s);
      sag += fits[k].c[cand[k]];
      sgg += fits[k].e[cand[k]];
      for (int j = 0; j < 8; ++j) saa += w[8 * k + j] * a[8 * k + j] * a[8 * k + j];
    }
    (void)L;
    const float sopt = sgg > 0.0f ? sag / sgg : 0.0f;
    const float err = saa - sopt * sag;
    if (err < best_err) {
      best_err = err;
      *scale = sopt;
      std::memcpy(idx, cand, sizeof cand);
    }
  }
}

// 32 groups' fits (64 KiB): per thread, reused.
std::vector<GroupFit>& group_fits() {
  thread_local std::vector<GroupFit> fits(32);
  return fits;
}

void quantize_row_iq2_xxs(const float* src, void* dst, int64_t n) {
  BlockIQ2_XXS* y = static_cast<BlockIQ2_XXS*>(dst);
  for (int64_t i = 0; i < n / kQKK; ++i) {
    const float* x = src + i * kQKK;
    float sumx2 = 0.0f;
    for (int j = 0; j < kQKK; ++j) sumx2 += x[j] * x[j];
    const float sigma2 = 2.0f * sumx2 / static_cast<float>(kQKK);
    float a[kQKK], w[kQKK];
    uint8_t sign_bits[32];  // per group of 8: the 7 stored bits (the 8th is implied)
    float bscale[8];
    int bidx[8][4];
    for (int j = 0; j < kQKK; ++j) {
      w[j] = std::sqrt(sigma2 + x[j] * x[j]);
      a[j] = std::fabs(x[j]);
    }
    for (int g = 0; g < 32; ++g) {
      unsigned bits = 0;
      for (int j = 0; j < 8; ++j)
        if (x[8 * g + j] < 0.0f) bits |= 1u << j;
      if (__builtin_popcount(bits) % 2) {  // flip the element that costs least
        int jmin = 0;
        float vmin = INFINITY;
        for (int j = 0; j < 8; ++j) {
          const float v = w[8 * g + j] * x[8 * g + j] * x[8 * g + j];
          if (v < vmin) {
            vmin = v;
            jmin = j;
          }
        }
        bits ^= 1u << jmin;
        a[8 * g + jmin] = -a[8 * g + jmin];
      }
      sign_bits[g] = static_cast<uint8_t>(bits & 127);
    }
    float max_scale = 0.0f;
    std::vector<GroupFit>& fits = group_fits();
    for (int g = 0; g < 32; ++g) fits[static_cast<std::size_t>(g)].compute(a + 8 * g, w + 8 * g);
    for (int ib = 0; ib < 8; ++ib) {
      float max = 0.0f;
      for (int j = 0; j < 32; ++j) max = std::fmax(max, a[32 * ib + j]);
      bscale[ib] = 0.0f;
      for (int k = 0; k < 4; ++k) bidx[ib][k] = 0;
      if (max < 1e-25f) continue;
      fit_block(&fits[static_cast<std::size_t>(4 * ib)], a + 32 * ib, w + 32 * ib, max, bidx[ib], &bscale[ib]);
      if (bscale[ib] < 0.0f) bscale[ib] = 0.0f;
      max_scale = std::fmax(max_scale, bscale[ib]);
    }
    std::memset(&y[i], 0, sizeof y[i]);
    if (!(max_scale > 0.0f)) continue;
    // block scale = d * (0.5 + ls) / 4 with ls in 0..15: the largest maps to ls = 15.
    y[i].d = fp32_to_fp16(max_scale * 4.0f / 15.5f);
    const float d = fp16_to_fp32(y[i].d);
    for (int ib = 0; ib < 8; ++ib) {
      int ls = d > 0.0f ? static_cast<int>(std::lround(4.0f * bscale[ib] / d - 0.5f)) : 0;
      ls = ls < 0 ? 0 : (ls > 15 ? 15 : ls);
      const float s = d * (0.5f + static_cast<float>(ls)) * 0.25f;
      uint32_t idx = 0, sg = static_cast<uint32_t>(ls) << 28;
      for (int k = 0; k < 4; ++k) {
        const int p = fits[static_cast<std::size_t>(4 * ib + k)].best(s);
        idx |= static_cast<uint32_t>(p) << (8 * k);
        sg |= static_cast<uint32_t>(sign_bits[4 * ib + k]) << (7 * k);
      }
      std::memcpy(y[i].qs + 4 * ib, &idx, 4);
      std::memcpy(y[i].qs + 4 * ib + 2, &sg, 4);
    }
  }
}

// ---- the other low-bit types: the shared lattice fit (iquant_fit.hpp), packed per format ----

using fit::Lattice;
using fit::Result;
using fit::Shift;
using fit::Signs;
using fit::Spec;

const Lattice& lattice_iq2xs() {
  static const Lattice l = fit::make_lattice(kIq2xsGrid, 512, 8, false, 0.0f);
  return l;
}
const Lattice& lattice_iq2s() {
  static const Lattice l = fit::make_lattice(kIq2sGrid, 1024, 8, false, 0.0f);
  return l;
}
const Lattice& lattice_iq3xxs() {
  static const Lattice l = fit::make_lattice(kIq3xxsGrid, 256, 4, false, 0.0f);
  return l;
}
const Lattice& lattice_iq3s() {
  static const Lattice l = fit::make_lattice(kIq3sGrid, 512, 4, false, 0.0f);
  return l;
}
const Lattice& lattice_iq1s() {
  static const Lattice l = fit::make_lattice(kIq1sGrid, 2048, 8, true, 0.125f);
  return l;
}

// Runs the fit on every super-block of a row and hands each result to the format's packer.
template <typename Block, typename Pack>
void quantize_with(const Spec& spec, const float* src, void* dst, int64_t n, Pack pack) {
  Block* y = static_cast<Block*>(dst);
  Result r;
  for (int64_t i = 0; i < n / kQKK; ++i) {
    fit::fit_superblock(spec, src + i * kQKK, &r);
    std::memset(&y[i], 0, sizeof y[i]);
    if (r.d_bits != 0) pack(r, y[i]);
  }
}

// Scale codes of two 16-element blocks per byte, low nibble first (IQ2_XS, IQ2_S).
void pack_nibble_codes(const Result& r, uint8_t* scales) {
  for (int ib = 0; ib < 8; ++ib) scales[ib] = static_cast<uint8_t>(r.code[2 * ib] | (r.code[2 * ib + 1] << 4));
}

void quantize_row_iq2_xs(const float* src, void* dst, int64_t n) {
  static const Spec spec{&lattice_iq2xs(), 16, 16, 0.25f, 1.0f, Signs::EvenPer8, Shift::None, 0.0f, 3, 12, 4};
  quantize_with<BlockIQ2_XS>(spec, src, dst, n, [](const Result& r, BlockIQ2_XS& b) {
    b.d = r.d_bits;
    for (int k = 0; k < 32; ++k) b.qs[k] = static_cast<uint16_t>(r.index[k] | ((r.sign_bits[k] & 127) << 9));
    pack_nibble_codes(r, b.scales);
  });
}

void quantize_row_iq2_s(const float* src, void* dst, int64_t n) {
  static const Spec spec{&lattice_iq2s(), 16, 16, 0.25f, 2.0f, Signs::Free, Shift::None, 0.0f, 3, 12, 4};
  quantize_with<BlockIQ2_S>(spec, src, dst, n, [](const Result& r, BlockIQ2_S& b) {
    b.d = r.d_bits;
    for (int k = 0; k < 32; ++k) {
      b.qs[k] = static_cast<uint8_t>(r.index[k] & 255);
      b.qs[32 + k] = r.sign_bits[k];
      b.qh[k / 4] = static_cast<uint8_t>(b.qh[k / 4] | ((r.index[k] >> 8) << (2 * (k % 4))));
    }
    pack_nibble_codes(r, b.scales);
  });
}

void quantize_row_iq3_xxs(const float* src, void* dst, int64_t n) {
  static const Spec spec{&lattice_iq3xxs(), 32, 16, 0.5f, 2.0f, Signs::EvenPer8, Shift::None, 0.0f, 3, 12, 4};
  quantize_with<BlockIQ3_XXS>(spec, src, dst, n, [](const Result& r, BlockIQ3_XXS& b) {
    b.d = r.d_bits;
    for (int k = 0; k < 64; ++k) b.qs[k] = static_cast<uint8_t>(r.index[k]);
    for (int ib = 0; ib < 8; ++ib) {
      uint32_t sg = static_cast<uint32_t>(r.code[ib]) << 28;
      for (int l = 0; l < 4; ++l) sg |= static_cast<uint32_t>(r.sign_bits[4 * ib + l] & 127) << (7 * l);
      std::memcpy(b.qs + 64 + 4 * ib, &sg, 4);
    }
  });
}

void quantize_row_iq3_s(const float* src, void* dst, int64_t n) {
  static const Spec spec{&lattice_iq3s(), 32, 16, 2.0f, 2.0f, Signs::Free, Shift::None, 0.0f, 3, 12, 4};
  quantize_with<BlockIQ3_S>(spec, src, dst, n, [](const Result& r, BlockIQ3_S& b) {
    b.d = r.d_bits;
    for (int k = 0; k < 64; ++k) {
      b.qs[k] = static_cast<uint8_t>(r.index[k] & 255);
      b.qh[k / 8] = static_cast<uint8_t>(b.qh[k / 8] | ((r.index[k] >> 8) << (k % 8)));
    }
    std::memcpy(b.signs, r.sign_bits, sizeof b.signs);
    for (int ib = 0; ib < 8; ++ib) b.scales[ib / 2] = static_cast<uint8_t>(b.scales[ib / 2] | (r.code[ib] << (4 * (ib % 2))));
  });
}

void quantize_row_iq1_s(const float* src, void* dst, int64_t n) {
  static const Spec spec{&lattice_iq1s(), 32, 8, 2.0f, 2.0f, Signs::InGrid, Shift::PerScaleBlock, 0.125f, 3, 12, 4};
  quantize_with<BlockIQ1_S>(spec, src, dst, n, [](const Result& r, BlockIQ1_S& b) {
    b.d = r.d_bits;
    for (int ib = 0; ib < 8; ++ib) {
      unsigned h = static_cast<unsigned>(r.code[ib]) << 12;
      if (r.shift_negative[4 * ib]) h |= 0x8000u;
      for (int l = 0; l < 4; ++l) {
        b.qs[4 * ib + l] = static_cast<uint8_t>(r.index[4 * ib + l] & 255);
        h |= static_cast<unsigned>(r.index[4 * ib + l] >> 8) << (3 * l);
      }
      b.qh[ib] = static_cast<uint16_t>(h);
    }
  });
}

void quantize_row_iq1_m(const float* src, void* dst, int64_t n) {
  static const Spec spec{&lattice_iq1s(), 16, 8, 2.0f, 2.0f, Signs::InGrid, Shift::PerPoint, 0.125f, 3, 12, 4};
  quantize_with<BlockIQ1_M>(spec, src, dst, n, [](const Result& r, BlockIQ1_M& b) {
    uint16_t sc[4] = {};
    for (int m = 0; m < 16; ++m) sc[m / 4] = static_cast<uint16_t>(sc[m / 4] | (r.code[m] << (3 * (m % 4))));
    for (int q = 0; q < 4; ++q) sc[q] = static_cast<uint16_t>(sc[q] | (((r.d_bits >> (4 * q)) & 15) << 12));
    std::memcpy(b.scales, sc, sizeof sc);
    for (int k = 0; k < 32; ++k) {
      b.qs[k] = static_cast<uint8_t>(r.index[k] & 255);
      const unsigned h = static_cast<unsigned>(r.index[k] >> 8) | (r.shift_negative[k] ? 8u : 0u);
      b.qh[k / 2] = static_cast<uint8_t>(b.qh[k / 2] | (h << (4 * (k % 2))));
    }
  });
}

}  // namespace

QuantizeRowFn low_bit_quantizer(DType type) {
  switch (type) {
    case DType::IQ2_XXS: return quantize_row_iq2_xxs;
    case DType::IQ2_XS: return quantize_row_iq2_xs;
    case DType::IQ2_S: return quantize_row_iq2_s;
    case DType::IQ3_XXS: return quantize_row_iq3_xxs;
    case DType::IQ3_S: return quantize_row_iq3_s;
    case DType::IQ1_S: return quantize_row_iq1_s;
    case DType::IQ1_M: return quantize_row_iq1_m;
    default: return nullptr;
  }
}

}  // namespace colibri::iq
