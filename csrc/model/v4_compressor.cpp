#include "model/v4_compressor.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "common/errors.hpp"
#include "model/ops.hpp"

namespace colibri {

V4Compressor::V4Compressor(const WeightStore& store, const std::string& prefix, int64_t hidden, int64_t dim,
                           int64_t rate, bool overlap, float eps)
    : hidden_(hidden), dim_(dim), rate_(rate), width_(overlap ? 2 * dim : dim), overlap_(overlap), eps_(eps) {
  if (rate_ <= 0 || dim_ <= 0) fail(ErrorKind::InvalidArgument, "model spec: a V4 compressor needs rate > 0 and dim > 0");
  auto req = [&](const std::string& name, int64_t rows, int64_t cols) {
    const Tensor* t = &store.get(name);
    check_shape(t, rows, cols);
    return t;
  };
  kv_ = req(prefix + "kv", width_, hidden_);
  gate_ = req(prefix + "gate", width_, hidden_);
  ape_ = req(prefix + "ape", rate_, width_);
  norm_ = req(prefix + "norm", 1, dim_);
  for (const Tensor* t : {ape_, norm_}) t->f32();  // refuses other types at load
}

void V4Compressor::project(AttentionContext& ctx, const float* x, int64_t n, std::vector<float>& kv,
                           std::vector<float>& gate) const {
  kv.resize(static_cast<std::size_t>(n * width_));
  gate.resize(static_cast<std::size_t>(n * width_));
  const WeightView w[2] = {kv_->view(), gate_->view()};
  float* const out[2] = {kv.data(), gate.data()};
  matmul_multi(ctx.pool, w, out, 2, x, n, ctx.matmul, ctx.precision);
}

void V4Compressor::consume(const float* kv, const float* gate, int64_t n, int64_t pos0, float* pending,
                           float* entries, int64_t stride, const std::vector<float>& inv_freq, float factor) const {
  const int64_t row = 2 * width_;  // a pending slot: [kv | gate]
  for (int64_t t = 0; t < n; ++t) {
    const int64_t p = pos0 + t;
    float* slot = pending + (p % slots()) * row;
    std::memcpy(slot, kv + t * width_, static_cast<std::size_t>(width_) * sizeof(float));
    std::memcpy(slot + width_, gate + t * width_, static_cast<std::size_t>(width_) * sizeof(float));
    if ((p + 1) % rate_ == 0) {
      const int64_t w = (p + 1) / rate_ - 1;
      close_window(w, pending, entries + w * stride, inv_freq, factor);
    }
  }
}

// Entry w from the pending slots of window w (and w - 1 when overlapping), channel by
// channel: the softmax over the slots, in float as transformers computes it.
void V4Compressor::close_window(int64_t w, const float* pending, float* entry, const std::vector<float>& inv_freq,
                                float factor) const {
  const int64_t row = 2 * width_, m = rate_, d = dim_;
  const float* ape = ape_->f32();
  std::vector<float> logit(static_cast<std::size_t>(2 * m)), value(static_cast<std::size_t>(2 * m));
  for (int64_t c = 0; c < d; ++c) {
    int64_t k = 0;
    // The overlapping form: window w - 1's first dim values, then window w's last dim.
    if (overlap_ && w > 0)
      for (int64_t j = 0; j < m; ++j, ++k) {
        const float* slot = pending + (((w - 1) * m + j) % slots()) * row;
        value[static_cast<std::size_t>(k)] = slot[c];
        logit[static_cast<std::size_t>(k)] = slot[width_ + c] + ape[j * width_ + c];
      }
    const int64_t off = overlap_ ? d : 0;
    for (int64_t j = 0; j < m; ++j, ++k) {
      const float* slot = pending + ((w * m + j) % slots()) * row;
      value[static_cast<std::size_t>(k)] = slot[off + c];
      logit[static_cast<std::size_t>(k)] = slot[width_ + off + c] + ape[j * width_ + off + c];
    }
    float mx = -std::numeric_limits<float>::infinity();
    for (int64_t i = 0; i < k; ++i) mx = std::max(mx, logit[static_cast<std::size_t>(i)]);
    float sum = 0.0f;
    for (int64_t i = 0; i < k; ++i) {
      logit[static_cast<std::size_t>(i)] = std::exp(logit[static_cast<std::size_t>(i)] - mx);
      sum += logit[static_cast<std::size_t>(i)];
    }
    float acc = 0.0f;
    for (int64_t i = 0; i < k; ++i)
      acc += value[static_cast<std::size_t>(i)] * (logit[static_cast<std::size_t>(i)] / sum);
    entry[c] = acc;
  }
  rms_norm_row(entry, norm_->f32(), d, eps_, entry);
  const auto half = static_cast<int64_t>(inv_freq.size());
  std::vector<float> cos_sin(static_cast<std::size_t>(2 * half));
  rope_cos_sin(w * m, inv_freq.data(), half, factor, cos_sin.data());
  rope_head_interleaved(entry + d - 2 * half, cos_sin.data(), 2 * half);
}

}  // namespace colibri
