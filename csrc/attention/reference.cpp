// The naive reference the kernels are tested against: per query head, every score, a
// two-pass softmax and the weighted sum of the values, in double. No blocks, no chunks.
// A sliding window drops the keys before it; a sink is one more softmax term with no value.
#include <algorithm>
#include <cmath>
#include <vector>

#include "attention/attention.hpp"
#include "quant/kernels.hpp"

namespace colibri::attn {

namespace {

std::vector<float> row(const KvSide& side, int64_t head, int64_t pos, int64_t dim) {
  std::vector<float> out(static_cast<std::size_t>(dim));
  const auto* base = static_cast<const unsigned char*>(side.data);
  kernels(side.type).dequantize_row(
      base + static_cast<std::size_t>(pos) * side.pos_stride + static_cast<std::size_t>(head) * side.head_stride,
      out.data(), dim);
  return out;
}

}  // namespace

void reference(const Problem& p) {
  for (int64_t t = 0; t < p.n_queries; ++t) {
    std::vector<int64_t> keys;
    if (p.key_index) {
      for (int64_t i = p.key_offsets[t]; i < p.key_offsets[t + 1]; ++i) keys.push_back(p.key_index[i]);
    } else {
      const int64_t j0 = p.window > 0 ? std::max<int64_t>(0, p.pos0 + t + 1 - p.window) : 0;
      for (int64_t j = j0; j <= p.pos0 + t; ++j) keys.push_back(j);
    }
    for (int64_t h = 0; h < p.n_kv_heads * p.group; ++h) {
      const int64_t g = h / p.group;
      const float* q = p.q + t * p.q_stride + h * p.q_head_stride;
      std::vector<double> s(keys.size());
      double mx = -INFINITY;
      for (std::size_t j = 0; j < keys.size(); ++j) {
        const std::vector<float> k = row(p.k, g, keys[j], p.dk);
        double dot = 0.0;
        for (int64_t i = 0; i < p.dk; ++i) dot += static_cast<double>(q[i]) * k[static_cast<std::size_t>(i)];
        s[j] = dot * p.scale;
        mx = std::max(mx, s[j]);
      }
      if (p.sinks) mx = std::max(mx, static_cast<double>(p.sinks[h]));
      double sum = p.sinks ? std::exp(static_cast<double>(p.sinks[h]) - mx) : 0.0;
      for (double& x : s) sum += (x = std::exp(x - mx));
      std::vector<double> o(static_cast<std::size_t>(p.dv), 0.0);
      for (std::size_t j = 0; j < keys.size(); ++j) {
        const std::vector<float> v = row(p.v, g, keys[j], p.dv);
        for (int64_t i = 0; i < p.dv; ++i) o[static_cast<std::size_t>(i)] += s[j] / sum * v[static_cast<std::size_t>(i)];
      }
      float* out = p.out + t * p.out_stride + h * p.out_head_stride;
      for (int64_t i = 0; i < p.dv; ++i) out[i] = static_cast<float>(o[static_cast<std::size_t>(i)]);
    }
  }
}

}  // namespace colibri::attn
