#include "model/hyper_conn.hpp"

#include <algorithm>
#include <cmath>

#include "common/errors.hpp"

namespace colibri {

namespace {

float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// flat[hc * d] normed (no weight), then proj[r] = fn[r] . flat for r < rows. Double
// accumulation, as rms_norm_row; fn must be F32 (f32()).
void norm_and_project(const ModelSpec& s, const Tensor& fn, const float* streams, int64_t rows, std::vector<float>& flat,
                      float* proj) {
  const int64_t w = s.hc_mult * s.hidden_size;
  flat.resize(static_cast<std::size_t>(w));
  double ss = 0.0;
  for (int64_t i = 0; i < w; ++i) ss += static_cast<double>(streams[i]) * streams[i];
  const float inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(w) + s.rms_norm_eps));
  for (int64_t i = 0; i < w; ++i) flat[static_cast<std::size_t>(i)] = streams[i] * inv;
  const float* f = fn.f32();
  for (int64_t r = 0; r < rows; ++r) {
    double acc = 0.0;
    const float* row = f + r * w;
    for (int64_t i = 0; i < w; ++i) acc += static_cast<double>(row[i]) * flat[static_cast<std::size_t>(i)];
    proj[r] = static_cast<float>(acc);
  }
}

}  // namespace

HcWeights resolve_hc(const ModelSpec& s, const WeightStore& store, const std::string& prefix, bool head) {
  const int64_t hc = s.hc_mult, rows = head ? hc : (2 + hc) * hc;
  HcWeights w;
  w.fn = &store.get(prefix + "_fn");
  check_shape(w.fn, rows, hc * s.hidden_size);
  w.base = &store.get(prefix + "_base");
  check_shape(w.base, 1, rows);
  w.scale = &store.get(prefix + "_scale");
  check_shape(w.scale, 1, head ? 1 : 3);
  for (const Tensor* t : {w.fn, w.base, w.scale}) t->f32();  // F32 only: refused at load, not at the first forward
  return w;
}

void hc_collapse(const ModelSpec& s, const HcWeights& w, const float* streams, int64_t n, float* collapsed,
                 HcMix& mix) {
  const int64_t hc = s.hc_mult, d = s.hidden_size, rows = (2 + hc) * hc;
  const float eps = s.hc_eps;
  mix.post.resize(static_cast<std::size_t>(n * hc));
  mix.comb.resize(static_cast<std::size_t>(n * hc * hc));
  std::vector<float> proj(static_cast<std::size_t>(rows));
  const float* base = w.base->f32();
  const float* scale = w.scale->f32();
  for (int64_t t = 0; t < n; ++t) {
    const float* st = streams + t * hc * d;
    norm_and_project(s, *w.fn, st, rows, mix.flat, proj.data());
    float* post = mix.post.data() + t * hc;
    float* comb = mix.comb.data() + t * hc * hc;
    std::vector<float> pre(static_cast<std::size_t>(hc));
    for (int64_t k = 0; k < hc; ++k) {
      pre[static_cast<std::size_t>(k)] = sigmoid(proj[static_cast<std::size_t>(k)] * scale[0] + base[k]) + eps;
      post[k] = 2.0f * sigmoid(proj[static_cast<std::size_t>(hc + k)] * scale[1] + base[hc + k]);
    }
    // comb: a row-wise softmax (+ eps), a column normalization, then hc_sinkhorn_iters - 1
    // rounds of row and column normalization (rows j: input streams, columns k: outputs).
    for (int64_t j = 0; j < hc; ++j) {
      float* row = comb + j * hc;
      float mx = -INFINITY;
      for (int64_t k = 0; k < hc; ++k) {
        row[k] = proj[static_cast<std::size_t>(2 * hc + j * hc + k)] * scale[2] + base[2 * hc + j * hc + k];
        mx = std::max(mx, row[k]);
      }
      float sum = 0.0f;
      for (int64_t k = 0; k < hc; ++k) sum += (row[k] = std::exp(row[k] - mx));
      for (int64_t k = 0; k < hc; ++k) row[k] = row[k] / sum + eps;
    }
    auto norm_cols = [&] {
      for (int64_t k = 0; k < hc; ++k) {
        float sum = 0.0f;
        for (int64_t j = 0; j < hc; ++j) sum += comb[j * hc + k];
        for (int64_t j = 0; j < hc; ++j) comb[j * hc + k] /= sum + eps;
      }
    };
    norm_cols();
    for (int64_t it = 1; it < s.hc_sinkhorn_iters; ++it) {
      for (int64_t j = 0; j < hc; ++j) {
        float sum = 0.0f;
        for (int64_t k = 0; k < hc; ++k) sum += comb[j * hc + k];
        for (int64_t k = 0; k < hc; ++k) comb[j * hc + k] /= sum + eps;
      }
      norm_cols();
    }
    float* out = collapsed + t * d;
    for (int64_t i = 0; i < d; ++i) {
      float acc = 0.0f;
      for (int64_t k = 0; k < hc; ++k) acc += pre[static_cast<std::size_t>(k)] * st[k * d + i];
      out[i] = acc;
    }
  }
}

void hc_expand(const ModelSpec& s, const HcMix& mix, const float* block_out, int64_t n, float* streams,
               std::vector<float>& tmp) {
  const int64_t hc = s.hc_mult, d = s.hidden_size;
  tmp.resize(static_cast<std::size_t>(hc * d));
  for (int64_t t = 0; t < n; ++t) {
    float* st = streams + t * hc * d;
    const float* post = mix.post.data() + t * hc;
    const float* comb = mix.comb.data() + t * hc * hc;
    const float* b = block_out + t * d;
    for (int64_t k = 0; k < hc; ++k)
      for (int64_t i = 0; i < d; ++i) {
        float acc = 0.0f;
        for (int64_t j = 0; j < hc; ++j) acc += comb[j * hc + k] * st[j * d + i];
        tmp[static_cast<std::size_t>(k * d + i)] = post[k] * b[i] + acc;
      }
    std::copy(tmp.begin(), tmp.end(), st);
  }
}

void hc_head(const ModelSpec& s, const HcWeights& w, const float* streams, int64_t n, float* out,
             std::vector<float>& scratch) {
  const int64_t hc = s.hc_mult, d = s.hidden_size;
  std::vector<float> proj(static_cast<std::size_t>(hc));
  const float* base = w.base->f32();
  const float scale = w.scale->f32()[0];
  for (int64_t t = 0; t < n; ++t) {
    const float* st = streams + t * hc * d;
    norm_and_project(s, *w.fn, st, hc, scratch, proj.data());
    for (int64_t k = 0; k < hc; ++k)
      proj[static_cast<std::size_t>(k)] = sigmoid(proj[static_cast<std::size_t>(k)] * scale + base[k]) + s.hc_eps;
    for (int64_t i = 0; i < d; ++i) {
      float acc = 0.0f;
      for (int64_t k = 0; k < hc; ++k) acc += proj[static_cast<std::size_t>(k)] * st[k * d + i];
      out[t * d + i] = acc;
    }
  }
}

}  // namespace colibri
