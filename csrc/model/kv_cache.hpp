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
//
// Sliding-window layers (KvLayerLayout::window > 0) keep a ring instead: the last
// kv_ring_positions(window) positions, position p in slot p % ring, so their memory is
// bounded whatever the context. What the rest of a session can do with them:
//  - a forward of n tokens from position p needs the window before p intact; the attention
//    runs a sliding layer in passes of at most ring - window + 1 queries (attn_gqa.cpp,
//    attn_v4.cpp);
//  - rolling back to L tokens needs positions [L - window + 1, L) still in the ring
//    (holds_rollback): always within the last kRingSlack + 1 tokens (a speculative
//    draft), refused (Error(InvalidArgument)) beyond what the ring still holds;
//  - the state of n positions (export, import, copy_prefix) keeps a sliding layer's last
//    min(n, window) positions only (holds_prefix says whether they are still there).
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
//
// A DeepSeek-V4 compressed layer (model/attn_v4_compressed.hpp) keeps, in that same F32
// state, its compressors' pending inputs (state_floats) and one entry of comp_floats values
// per comp_rate positions of the context: its state is state_floats +
// ceil(context / comp_rate) * comp_floats values (state_floats_at).
struct KvLayerLayout {
  int64_t k_heads = 0, k_dim = 0;
  int64_t v_heads = 0, v_dim = 0;
  // A sliding-window layer's window (its queries see the last `window` positions, their
  // own included): the layer keeps a ring of kv_ring_positions(window) positions. 0: all.
  int64_t window = 0;
  int64_t state_floats = 0;
  int64_t comp_rate = 0, comp_floats = 0;
  int64_t k_width() const { return k_heads * k_dim; }
  // The F32 state of this layer in a cache of `context` positions.
  int64_t state_floats_at(int64_t context) const {
    return state_floats + (comp_rate > 0 ? (context + comp_rate - 1) / comp_rate * comp_floats : 0);
  }
  int64_t v_width() const { return v_heads * v_dim; }
};

// Positions a sliding layer's ring holds beyond its window: how far a session can roll
// back past its last forward (speculative drafts) and, plus one, the most queries one
// attention pass of the layer takes.
constexpr int64_t kRingSlack = 64;

// Positions a layer with this window keeps in a cache of `context` positions: window +
// kRingSlack rounded up to whole blocks of 64 keys (the attention's unit: a block never
// wraps), or 0 (keeps every position) without a window or when the ring would not be
// smaller than the context. colibri.engine.budget.kv_ring_positions mirrors it.
int64_t kv_ring_positions(int64_t window, int64_t context);

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

  // Bytes one position's rows take over all layers (ring layers included).
  std::size_t bytes_per_position() const { return per_position_; }
  // Bytes of the state of n positions (export_to / import_from): a ring layer's last
  // min(n, window) positions, every position of the others.
  std::size_t bytes_for(int64_t n) const;
  // Bytes the cache allocates to hold n positions (what the budget counts), and now.
  std::size_t bytes_at(int64_t n) const;
  std::size_t bytes() const;

  // A ring layer's positions (0: the layer keeps all of them).
  int64_t ring(int64_t layer) const { return ring_[static_cast<std::size_t>(layer)]; }
  bool has_ring() const { return max_window_ > 0; }
  // Whether rolling back to L positions leaves every ring layer the window before L.
  bool holds_rollback(int64_t L) const;
  // Whether the state of the first n positions (export, copy) is still in every ring.
  bool holds_prefix(int64_t n) const;
  // Throws Error(InvalidArgument) unless holds_rollback(L) (what = the caller's words).
  void require_rollback(int64_t L, const char* what) const;
  // The session now holds L positions (a rollback, a reset): require_rollback(L).
  void truncate(int64_t L);

  // Linear-attention layers' recurrent state (see KvLayerLayout): F32, zeroed at first.
  // state_tokens(layer): the tokens it has consumed, -1 when unknown (after an import, a
  // copy or a failed forward); state_tokens(): the count all state layers agree on, else -1.
  // The positions' rows and the state are separate: export_to / import_from / copy_prefix
  // move the rows only (copy_prefix also the state when the source's holds exactly n).
  // bytes_at() and bytes() count the state too; bytes_for() (an export's size) does not.
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
  // (A ring layer's position p is its slot p % ring.)
  uint8_t* k(int64_t layer, int64_t pos) {
    return k_[static_cast<std::size_t>(layer)].data() + slot(layer, pos) * k_row_bytes(layer);
  }
  uint8_t* v(int64_t layer, int64_t pos) {
    return v_[static_cast<std::size_t>(layer)].data() + slot(layer, pos) * v_row_bytes(layer);
  }
  const uint8_t* k(int64_t layer, int64_t pos) const {
    return k_[static_cast<std::size_t>(layer)].data() + slot(layer, pos) * k_row_bytes(layer);
  }
  const uint8_t* v(int64_t layer, int64_t pos) const {
    return v_[static_cast<std::size_t>(layer)].data() + slot(layer, pos) * v_row_bytes(layer);
  }

  // Converts float rows to the cache type: k_width (v_width) floats of position pos. A
  // ring layer's store overwrites position pos - ring (tracked: lost_below).
  void store_k(int64_t layer, int64_t pos, const float* row);
  void store_v(int64_t layer, int64_t pos, const float* row);

  // Positions [0, n) of every layer as bytes (bytes_for(n) of them), and back: import makes
  // positions [0, n) hold exactly what was exported. n <= capacity (export) / context (import).
  // A ring layer: its last min(n, window) positions; export and copy_prefix throw
  // Error(InvalidArgument) unless holds_prefix(n).
  void export_to(int64_t n, uint8_t* out) const;
  void import_from(int64_t n, const uint8_t* in, std::size_t size);
  // Positions [0, n) copied from another cache of the same layout and type.
  void copy_prefix(const KvCache& other, int64_t n);
  bool same_format(const KvCache& other) const;

  // The ring layers' slots as they are now, and back (Session: a failed forward that wrote
  // more positions than the slack leaves the session as it was). Empty without rings.
  struct RingState {
    std::vector<std::vector<uint8_t>> k, v;
    int64_t lost_below = 0;
  };
  RingState save_rings() const;
  void restore_rings(RingState state);
  // Positions below this are overwritten in some ring (0: none lost).
  int64_t lost_below() const { return lost_below_; }

 private:
  std::size_t slot(int64_t layer, int64_t pos) const {
    const int64_t r = ring_[static_cast<std::size_t>(layer)];
    return static_cast<std::size_t>(r > 0 ? pos % r : pos);
  }
  int64_t rows_at(std::size_t layer, int64_t n) const;  // rows allocated to hold n positions
  int64_t state_rows(std::size_t layer, int64_t n) const;  // rows of the state of n positions

  int64_t context_;
  std::vector<KvLayerLayout> layout_;
  DType type_;
  std::vector<std::size_t> k_row_, v_row_;  // bytes of one position per layer
  std::size_t per_position_ = 0;
  int64_t capacity_ = 0;  // positions currently allocated in every layer
  std::vector<std::vector<uint8_t>> k_, v_;
  std::vector<int64_t> ring_;  // per layer: ring positions (0: all)
  int64_t max_window_ = 0;     // the widest ring layer's window (0: no ring)
  int64_t lost_below_ = 0;     // positions below were overwritten in a ring
  std::vector<std::vector<float>> state_;
  std::vector<int64_t> state_tokens_;
  std::size_t state_bytes_ = 0;
};

// Bytes of one position's keys and values at `type` for these layouts (the Python budget's
// mirror is colibri.engine.budget.kv_bytes; a test checks they agree).
std::size_t kv_bytes_per_position(const std::vector<KvLayerLayout>& layers, DType type);

}  // namespace colibri
