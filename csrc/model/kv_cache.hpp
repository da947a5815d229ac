// Per-session attention state: what each layer's attention unit keeps per position (keys
// and values for GQA), F32 so that the exact path matches the oracle. Layout per layer and
// side: [position][head * dim].
//
// The context length is the session's limit, not its allocation: storage grows (doubling,
// capped at the limit) as positions are used, so a session that holds a short chat does not
// reserve (and zero) the whole context up front — a 4096-position SmolLM2 cache is 188 MB.
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

namespace colibri {

// What one layer stores per position: k_heads rows of k_dim keys and v_heads rows of v_dim
// values. v_heads == 0 means the layer stores no separate values (MLA: the value is a
// prefix of the key row).
struct KvLayerLayout {
  int64_t k_heads = 0, k_dim = 0;
  int64_t v_heads = 0, v_dim = 0;
  int64_t k_width() const { return k_heads * k_dim; }
  int64_t v_width() const { return v_heads * v_dim; }
};

class KvCache {
 public:
  KvCache(std::vector<KvLayerLayout> layers, int64_t context_length)
      : context_(context_length), layout_(std::move(layers)),
        k_(layout_.size()), v_(layout_.size()) {}

  int64_t context_length() const { return context_; }
  int64_t n_layers() const { return static_cast<int64_t>(layout_.size()); }
  const KvLayerLayout& layout(int64_t layer) const { return layout_[static_cast<std::size_t>(layer)]; }
  std::size_t bytes() const {
    std::size_t per_position = 0;
    for (const auto& l : layout_) per_position += static_cast<std::size_t>(l.k_width() + l.v_width());
    return per_position * static_cast<std::size_t>(capacity_) * sizeof(float);
  }

  // Makes positions [0, n) addressable (n <= context_length). Existing entries are kept.
  void reserve(int64_t n) {
    if (n <= capacity_) return;
    const int64_t cap = std::min(context_, std::max<int64_t>(n, std::max<int64_t>(64, 2 * capacity_)));
    for (std::size_t i = 0; i < layout_.size(); ++i) {
      k_[i].resize(static_cast<std::size_t>(cap * layout_[i].k_width()));
      v_[i].resize(static_cast<std::size_t>(cap * layout_[i].v_width()));
    }
    capacity_ = cap;
  }

  float* k(int64_t layer, int64_t pos) {
    const auto i = static_cast<std::size_t>(layer);
    return k_[i].data() + pos * layout_[i].k_width();
  }
  float* v(int64_t layer, int64_t pos) {
    const auto i = static_cast<std::size_t>(layer);
    return v_[i].data() + pos * layout_[i].v_width();
  }

 private:
  int64_t context_;
  std::vector<KvLayerLayout> layout_;
  int64_t capacity_ = 0;  // positions currently allocated in every layer
  std::vector<std::vector<float>> k_, v_;
};

}  // namespace colibri
