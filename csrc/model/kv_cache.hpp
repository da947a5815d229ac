// Per-session attention state: what each layer's attention unit keeps per position (keys
// and values for GQA), stored at the cache's type: F32 (the exact path, matches the
// oracle), F16 (the default elsewhere, as llama.cpp), BF16 or Q8_0 (blocks of 32 per head:
// head dims must be multiples of 32). Layout per layer and side: [position][head][dim],
// each position's row `row_bytes(type, heads * dim)` bytes.
//
// The context length is the session's limit, not its allocation: storage grows (doubling,
// capped at the limit) as positions are used, so a session that holds a short chat does not
// reserve (and zero) the whole context up front.
//
// Type-agnostic state API (Session save/load, prompt caching): bytes_for(n), export_to /
// import_from positions [0, n) of every layer as one byte string, copy_prefix from another
// cache with the same layout and type. The byte string is, layer by layer, the K rows of
// positions 0..n-1 then the V rows, each at the cache type (docs/architecture.md).
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "quant/dtype.hpp"

namespace colibri {

// What one layer stores per position: k_heads rows of k_dim keys and v_heads rows of v_dim
// values. v_heads == 0 means the layer stores no separate values (MLA: the value is a
// prefix of the key row). An MLA layer that runs the DSA indexer keeps the indexer's key
// (one row of index_head_dim) on the V side (attn_mla.hpp).
//
// A linear-attention layer (model/linear_attn_gdn.hpp) keeps no rows per position but a
// recurrent state of a fixed size per sequence: state_floats F32 values, held here beside
// the rows (whatever the cache type) with the count of tokens it has consumed.
struct KvLayerLayout {
  int64_t k_heads = 0, k_dim = 0;
  int64_t v_heads = 0, v_dim = 0;
  int64_t state_floats = 0;
  int64_t k_width() const { return k_heads * k_dim; }
  int64_t v_width() const { return v_heads * v_dim; }
};

class KvCache {
 public:
  // Throws Error(Unsupported) for a type the cache cannot hold (or Q8_0 with a head dim that
  // is not a multiple of 32), Error(InvalidArgument) for a bad context length.
  KvCache(std::vector<KvLayerLayout> layers, int64_t context_length, DType type = DType::F32);

  DType type() const { return type_; }
  int64_t context_length() const { return context_; }
  int64_t capacity() const { return capacity_; }
  int64_t n_layers() const { return static_cast<int64_t>(layout_.size()); }
  const KvLayerLayout& layout(int64_t layer) const { return layout_[static_cast<std::size_t>(layer)]; }

  // Bytes one position takes over all layers, and n positions (what the budget counts).
  std::size_t bytes_per_position() const { return per_position_; }
  std::size_t bytes_for(int64_t n) const { return per_position_ * static_cast<std::size_t>(n); }
  std::size_t bytes() const { return bytes_for(capacity_) + state_bytes(); }  // allocated now

  // Linear-attention layers' recurrent state (see KvLayerLayout): F32, zeroed at first.
  // state_tokens(layer): the tokens it has consumed, -1 when unknown (after an import, a
  // copy or a failed forward); state_tokens(): the count all state layers agree on, else -1.
  // The positions' rows and the state are separate: export_to / import_from / copy_prefix
  // move the rows only (copy_prefix also the state when the source's holds exactly n).
  bool has_state() const { return state_bytes_ > 0; }
  std::size_t state_bytes() const { return state_bytes_; }
  float* state(int64_t layer) { return state_[static_cast<std::size_t>(layer)].data(); }
  int64_t state_tokens(int64_t layer) const { return state_tokens_[static_cast<std::size_t>(layer)]; }
  void set_state_tokens(int64_t layer, int64_t n) { state_tokens_[static_cast<std::size_t>(layer)] = n; }
  int64_t state_tokens() const;
  void forget_state();  // every layer's count to -1 (the state must be recomputed)

  // Makes positions [0, n) addressable (n <= context_length). Existing entries are kept.
  void reserve(int64_t n);

  // Row bytes of one position, and the row itself (valid until the next reserve).
  std::size_t k_row_bytes(int64_t layer) const { return k_row_[static_cast<std::size_t>(layer)]; }
  std::size_t v_row_bytes(int64_t layer) const { return v_row_[static_cast<std::size_t>(layer)]; }
  uint8_t* k(int64_t layer, int64_t pos) { return k_[static_cast<std::size_t>(layer)].data() + pos * k_row_bytes(layer); }
  uint8_t* v(int64_t layer, int64_t pos) { return v_[static_cast<std::size_t>(layer)].data() + pos * v_row_bytes(layer); }
  const uint8_t* k(int64_t layer, int64_t pos) const {
    return k_[static_cast<std::size_t>(layer)].data() + pos * k_row_bytes(layer);
  }
  const uint8_t* v(int64_t layer, int64_t pos) const {
    return v_[static_cast<std::size_t>(layer)].data() + pos * v_row_bytes(layer);
  }

  // Converts float rows to the cache type: k_width (v_width) floats of position pos.
  void store_k(int64_t layer, int64_t pos, const float* row);
  void store_v(int64_t layer, int64_t pos, const float* row);

  // Positions [0, n) of every layer as bytes (bytes_for(n) of them), and back: import makes
  // positions [0, n) hold exactly what was exported. n <= capacity (export) / context (import).
  void export_to(int64_t n, uint8_t* out) const;
  void import_from(int64_t n, const uint8_t* in, std::size_t size);
  // Positions [0, n) copied from another cache of the same layout and type.
  void copy_prefix(const KvCache& other, int64_t n);
  bool same_format(const KvCache& other) const;

 private:
  int64_t context_;
  std::vector<KvLayerLayout> layout_;
  DType type_;
  std::vector<std::size_t> k_row_, v_row_;  // bytes of one position per layer
  std::size_t per_position_ = 0;
  int64_t capacity_ = 0;  // positions currently allocated in every layer
  std::vector<std::vector<uint8_t>> k_, v_;
  std::vector<std::vector<float>> state_;
  std::vector<int64_t> state_tokens_;
  std::size_t state_bytes_ = 0;
};

// Bytes of one position's keys and values at `type` for these layouts (the Python budget's
// mirror is colibri.engine.budget.kv_bytes; a test checks they agree).
std::size_t kv_bytes_per_position(const std::vector<KvLayerLayout>& layers, DType type);

}  // namespace colibri
