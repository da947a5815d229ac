// A standalone check of the NEON FP8 e4m3 row kernel against the scalar reference, without
// Python, for a cross-compiled arm64 build run under qemu (scripts/check_iquants_arm64_qemu.sh).
// Random codes (NaN codes excluded: checkpoints do not hold them), block scales of the
// official 128 x 128 shape and of partial blocks, odd row counts and column counts that
// leave a tail: |neon - exact| must stay within test_fp8_direct's bound
// (n + 8) u sum |w x| of the float64 result, and so must the scalar kernel.
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "quant/fp8.hpp"

using namespace colibri;

int main() {
  int checks = 0, failures = 0;
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> code(0, 255);
  std::uniform_real_distribution<float> scale(1e-3f, 2.0f);
  std::normal_distribution<float> act(0.0f, 1.0f);
  const int64_t shapes[][4] = {{131, 296, 128, 128}, {37, 200, 32, 48}, {9, 77, 1, 8}, {16, 512, 128, 128}};
  for (const auto& sh : shapes) {
    const int64_t rows = sh[0], cols = sh[1], br = sh[2], bc = sh[3];
    std::vector<uint8_t> w(static_cast<std::size_t>(rows * cols));
    for (auto& c : w) {
      do c = static_cast<uint8_t>(code(rng));
      while ((c & 0x7f) == 0x7f);
    }
    const int64_t nsc = scale_cols(cols, bc), nsr = (rows + br - 1) / br;
    std::vector<float> sc(static_cast<std::size_t>(nsr * nsc)), x(static_cast<std::size_t>(cols));
    for (auto& v : sc) v = scale(rng);
    for (auto& v : x) v = act(rng);
    const BlockScales s{sc.data(), br, bc};
    std::vector<float> neon(static_cast<std::size_t>(rows)), ref(static_cast<std::size_t>(rows));
    fp8::dot_rows_neon(cols, w.data(), static_cast<std::size_t>(cols), rows, 0, s, x.data(), neon.data());
    fp8::dot_rows_scalar(cols, w.data(), static_cast<std::size_t>(cols), rows, 0, s, x.data(), ref.data());
    for (int64_t r = 0; r < rows; ++r) {
      double exact = 0, mag = 0;
      for (int64_t j = 0; j < cols; ++j) {
        const double wv = static_cast<double>(e4m3_to_float(w[static_cast<std::size_t>(r * cols + j)])) *
                          sc[static_cast<std::size_t>((r / br) * nsc + j / bc)];
        exact += wv * x[static_cast<std::size_t>(j)];
        mag += std::fabs(wv * x[static_cast<std::size_t>(j)]);
      }
      const double bound = static_cast<double>(cols + 8) * std::ldexp(1.0, -24) * mag + 1e-30;
      for (const float got : {neon[static_cast<std::size_t>(r)], ref[static_cast<std::size_t>(r)]}) {
        ++checks;
        if (!(std::fabs(got - exact) <= bound)) {
          ++failures;
          std::printf("FAIL fp8 %lldx%lld blocks %lldx%lld row %lld: %.9g vs exact %.9g (bound %.3g)\n",
                      static_cast<long long>(rows), static_cast<long long>(cols), static_cast<long long>(br),
                      static_cast<long long>(bc), static_cast<long long>(r), got, exact, bound);
        }
      }
    }
  }
  std::printf("fp8: %d checks, %d failures\n", checks, failures);
  return failures ? 1 : 0;
}
