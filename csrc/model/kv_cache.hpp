// Per-session attention state: keys and values for every layer and position, F32 so that
// the exact path matches the oracle. Layout per layer: [position][kv_head * head_dim].
#pragma once
#include <cstdint>
#include <vector>

namespace colibri {

class KvCache {
 public:
  KvCache(int64_t n_layers, int64_t context_length, int64_t kv_dim)
      : n_layers_(n_layers), context_(context_length), kv_dim_(kv_dim),
        k_(static_cast<std::size_t>(n_layers * context_length * kv_dim)),
        v_(static_cast<std::size_t>(n_layers * context_length * kv_dim)) {}

  int64_t context_length() const { return context_; }
  int64_t kv_dim() const { return kv_dim_; }
  std::size_t bytes() const { return (k_.size() + v_.size()) * sizeof(float); }

  float* k(int64_t layer, int64_t pos) { return k_.data() + (layer * context_ + pos) * kv_dim_; }
  float* v(int64_t layer, int64_t pos) { return v_.data() + (layer * context_ + pos) * kv_dim_; }

 private:
  int64_t n_layers_, context_, kv_dim_;
  std::vector<float> k_, v_;
};

}  // namespace colibri
