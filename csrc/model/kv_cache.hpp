// Per-session attention state: keys and values for every layer and position, F32 so that
// the exact path matches the oracle. Layout per layer: [position][kv_head * head_dim].
//
// The context length is the session's limit, not its allocation: storage grows (doubling,
// capped at the limit) as positions are used, so a session that holds a short chat does not
// reserve (and zero) the whole context up front — a 4096-position SmolLM2 cache is 188 MB.
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

namespace colibri {

class KvCache {
 public:
  KvCache(int64_t n_layers, int64_t context_length, int64_t kv_dim)
      : context_(context_length), kv_dim_(kv_dim),
        k_(static_cast<std::size_t>(n_layers)), v_(static_cast<std::size_t>(n_layers)) {}

  int64_t context_length() const { return context_; }
  int64_t kv_dim() const { return kv_dim_; }
  std::size_t bytes() const { return 2 * k_.size() * static_cast<std::size_t>(capacity_ * kv_dim_) * sizeof(float); }

  // Makes positions [0, n) addressable (n <= context_length). Existing entries are kept.
  void reserve(int64_t n) {
    if (n <= capacity_) return;
    const int64_t cap = std::min(context_, std::max<int64_t>(n, std::max<int64_t>(64, 2 * capacity_)));
    for (auto* side : {&k_, &v_})
      for (auto& layer : *side) layer.resize(static_cast<std::size_t>(cap * kv_dim_));
    capacity_ = cap;
  }

  float* k(int64_t layer, int64_t pos) { return k_[static_cast<std::size_t>(layer)].data() + pos * kv_dim_; }
  float* v(int64_t layer, int64_t pos) { return v_[static_cast<std::size_t>(layer)].data() + pos * kv_dim_; }

 private:
  int64_t context_, kv_dim_;
  int64_t capacity_ = 0;  // positions currently allocated in every layer
  std::vector<std::vector<float>> k_, v_;
};

}  // namespace colibri
