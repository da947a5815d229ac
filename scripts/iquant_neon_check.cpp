// A standalone check of the i-quant and MXFP4 dot kernels of one build target against the
// scalar reference, without Python: for cross-compiled targets run under an emulator, e.g.
// the NEON kernels on an x86 host (scripts/check_iquants_arm64_qemu.sh). On random blocks
// (finite scales), all-zero blocks and extreme activations, with odd row counts, the best
// ISA's vec_dot and vec_dot_rows must equal the scalar vec_dot BIT FOR BIT (the kernels'
// contract, quant/iquants_ref.hpp), and its activation quantizer must write the scalar's
// bytes. Exit status 0 when every check passes.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "quant/dtype.hpp"
#include "quant/kernels.hpp"

using namespace colibri;

namespace {

int failures = 0;
int checks = 0;

uint16_t half_bits(float v) {
  // Small positive normal halves only (the tests' scales): exponent and 10 mantissa bits.
  int e;
  const float m = std::frexp(v, &e);  // v = m 2^e, m in [0.5, 1)
  return static_cast<uint16_t>(((e - 1 + 15) << 10) | static_cast<uint16_t>(std::lround((2 * m - 1) * 1024)));
}

// Random blocks of `type` whose scale fields are finite: a half d in bytes 0..1 (every type
// but IQ1_M and MXFP4), IQ1_M's half assembled from its scale words' top nibbles, MXFP4's
// e8m0 exponent near 1. `zero_every` > 0 zeroes every that-many-th block.
std::vector<uint8_t> random_row(DType type, int64_t n, std::mt19937& rng, int zero_every) {
  const TypeTraits& t = type_traits(type);
  const int64_t nb = n / t.block_size;
  std::vector<uint8_t> row(static_cast<std::size_t>(nb * t.type_size));
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale(0.002f, 0.05f);
  for (auto& b : row) b = static_cast<uint8_t>(byte(rng));
  for (int64_t i = 0; i < nb; ++i) {
    uint8_t* blk = row.data() + i * t.type_size;
    if (zero_every > 0 && i % zero_every == 0) {
      std::memset(blk, 0, t.type_size);
      continue;
    }
    const uint16_t h = half_bits(scale(rng));
    if (type == DType::MXFP4) {
      blk[0] = static_cast<uint8_t>(120 + byte(rng) % 14);
    } else if (type == DType::IQ1_M) {
      uint16_t sc[4];
      std::memcpy(sc, blk + t.type_size - 8, 8);
      for (int k = 0; k < 4; ++k) sc[k] = static_cast<uint16_t>((sc[k] & 0x0fff) | (((h >> (4 * k)) & 15) << 12));
      std::memcpy(blk + t.type_size - 8, sc, 8);
    } else {
      std::memcpy(blk, &h, 2);
    }
  }
  return row;
}

std::vector<float> activations(int64_t n, std::mt19937& rng, bool extreme) {
  std::normal_distribution<float> nd;
  std::vector<float> a(static_cast<std::size_t>(n));
  for (int64_t j = 0; j < n; ++j) a[j] = nd(rng);
  if (extreme)  // one huge value per 256 (the block max), the rest tiny or exactly zero
    for (int64_t j = 0; j < n; ++j) a[j] = j % 256 == 7 ? -3.0e4f : (j % 3 == 0 ? 0.0f : a[j] * 1e-3f);
  return a;
}

bool same_bits(float x, float y) { return std::memcmp(&x, &y, sizeof x) == 0; }

void check_type(DType type, Isa isa) {
  const TypeKernels* ref = kernels_for(type, Isa::Scalar);
  const TypeKernels* simd = kernels_for(type, isa);
  if (!ref || !simd) {
    std::printf("FAIL %s: no %s kernels\n", type_traits(type).name, simd ? "scalar" : isa_name(isa));
    ++failures;
    return;
  }
  std::mt19937 rng(static_cast<unsigned>(type) * 7919u + 1u);
  const TypeTraits& at = type_traits(ref->act_type);
  int bad = 0;
  for (int64_t n : {256, 512, 2048, 4096}) {
    for (int variant = 0; variant < 3; ++variant) {
      const int64_t rows = 7;  // odd: the row-group kernels' tail
      const std::size_t stride = row_bytes(type, n);
      std::vector<uint8_t> w;
      for (int64_t r = 0; r < rows; ++r) {
        const auto row = random_row(type, n, rng, variant == 1 ? 3 : 0);
        w.insert(w.end(), row.begin(), row.end());
      }
      const auto a = activations(n, rng, variant == 2);
      std::vector<uint8_t> qa_ref(static_cast<std::size_t>(n / at.block_size * at.type_size));
      std::vector<uint8_t> qa_simd(qa_ref.size());
      ref->quantize_act(a.data(), qa_ref.data(), n);
      simd->quantize_act(a.data(), qa_simd.data(), n);
      ++checks;
      if (qa_ref != qa_simd) {
        std::printf("FAIL %s n=%lld variant %d: %s activation quantizer differs from scalar\n", type_traits(type).name,
                    static_cast<long long>(n), variant, isa_name(isa));
        ++bad;
      }
      std::vector<float> rows_out(static_cast<std::size_t>(rows));
      simd->vec_dot_rows(n, w.data(), stride, rows, qa_ref.data(), rows_out.data());
      for (int64_t r = 0; r < rows; ++r) {
        const float want = ref->vec_dot(n, w.data() + r * stride, qa_ref.data());
        const float got = simd->vec_dot(n, w.data() + r * stride, qa_ref.data());
        checks += 2;
        if (!same_bits(want, got) || !same_bits(want, rows_out[r]) || !std::isfinite(want)) {
          if (bad < 5)
            std::printf("FAIL %s n=%lld variant %d row %lld: scalar %.9g, %s vec_dot %.9g, vec_dot_rows %.9g\n",
                        type_traits(type).name, static_cast<long long>(n), variant, static_cast<long long>(r), want,
                        isa_name(isa), got, rows_out[r]);
          ++bad;
        }
      }
    }
  }
  failures += bad;
  std::printf("%-8s %s: %s\n", type_traits(type).name, isa_name(isa), bad ? "MISMATCH" : "bit-identical to scalar");
}

}  // namespace

int main() {
  const Isa isa = best_isa();
  std::printf("best ISA: %s\n", isa_name(isa));
  if (isa == Isa::Scalar) {
    std::printf("FAIL: no SIMD ISA available\n");
    return 1;
  }
  for (DType t : {DType::IQ4_NL, DType::MXFP4, DType::IQ4_XS, DType::IQ2_XXS, DType::IQ2_XS, DType::IQ2_S,
                  DType::IQ3_XXS, DType::IQ3_S, DType::IQ1_S, DType::IQ1_M})
    check_type(t, isa);
  std::printf("%d checks, %d failures\n", checks, failures);
  return failures ? 1 : 0;
}
