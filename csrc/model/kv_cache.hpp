// Per-session attention state: for every layer, one or more planes of float rows, one row
// per position. F32 so that the exact path matches the oracle. The layout comes from the
// layer's attention kind (Engine::kv_layout):
//   GQA: plane 0 = keys, plane 1 = values, each [kv_heads * head_dim]
//   MLA: plane 0 = [latent c_kv (kv_lora_rank) | shared rope key (qk_rope_head_dim)]: the
//        key row of absorbed attention, whose first kv_lora_rank values are the value row
//   DSA: MLA's plane 0, plus plane 1 = the lightning indexer's key [index_head_dim] on layers
//        that run their own indexer
//
// The context length is the session's limit, not its allocation: storage grows (doubling,
// capped at the limit) as positions are used, so a session that holds a short chat does not
// reserve (and zero) the whole context up front — a 4096-position SmolLM2 cache is 188 MB.
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

namespace colibri {

// Row widths (floats per position) of each layer's planes.
using KvLayout = std::vector<std::vector<int64_t>>;

class KvCache {
 public:
  KvCache(KvLayout layout, int64_t context_length) : context_(context_length), layout_(std::move(layout)) {
    planes_.resize(layout_.size());
    for (std::size_t l = 0; l < layout_.size(); ++l) planes_[l].resize(layout_[l].size());
  }
  // GQA everywhere: keys and values of kv_dim floats per layer.
  KvCache(int64_t n_layers, int64_t context_length, int64_t kv_dim)
      : KvCache(KvLayout(static_cast<std::size_t>(n_layers), {kv_dim, kv_dim}), context_length) {}

  int64_t context_length() const { return context_; }
  const KvLayout& layout() const { return layout_; }
  // Floats per position over all layers and planes.
  int64_t row_floats() const {
    int64_t n = 0;
    for (const auto& l : layout_)
      for (int64_t w : l) n += w;
    return n;
  }
  std::size_t bytes() const { return static_cast<std::size_t>(capacity_ * row_floats()) * sizeof(float); }

  // Makes positions [0, n) addressable (n <= context_length). Existing entries are kept.
  void reserve(int64_t n) {
    if (n <= capacity_) return;
    const int64_t cap = std::min(context_, std::max<int64_t>(n, std::max<int64_t>(64, 2 * capacity_)));
    for (std::size_t l = 0; l < layout_.size(); ++l)
      for (std::size_t p = 0; p < layout_[l].size(); ++p)
        planes_[l][p].resize(static_cast<std::size_t>(cap * layout_[l][p]));
    capacity_ = cap;
  }

  float* plane(int64_t layer, int plane, int64_t pos) {
    const auto l = static_cast<std::size_t>(layer);
    return planes_[l][static_cast<std::size_t>(plane)].data() + pos * layout_[l][static_cast<std::size_t>(plane)];
  }
  float* k(int64_t layer, int64_t pos) { return plane(layer, 0, pos); }
  float* v(int64_t layer, int64_t pos) { return plane(layer, 1, pos); }

 private:
  int64_t context_;
  KvLayout layout_;
  int64_t capacity_ = 0;  // positions currently allocated in every plane
  std::vector<std::vector<std::vector<float>>> planes_;  // [layer][plane] -> rows
};

}  // namespace colibri
