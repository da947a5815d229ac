#include "model/kv_cache.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include "common/errors.hpp"
#include "quant/kernels.hpp"

namespace colibri {

namespace {

void check_type(DType type, const std::vector<KvLayerLayout>& layers) {
  if (type != DType::F32 && type != DType::F16 && type != DType::BF16 && type != DType::Q8_0)
    fail(ErrorKind::Unsupported, "KV cache type " + dtype_name(type) + " is not supported (f32, f16, bf16, q8_0)");
  if (type != DType::Q8_0) return;
  for (const auto& l : layers)
    for (int64_t dim : {l.k_dim, l.v_heads ? l.v_dim : int64_t{0}})
      if (dim % 32 != 0)
        fail(ErrorKind::Unsupported, "KV cache type q8_0 stores heads in blocks of 32 values, but this model's "
                                     "heads have " + std::to_string(dim) + "; use f16 or bf16");
}

}  // namespace

int64_t kv_ring_positions(int64_t window, int64_t context) {
  if (window <= 0) return 0;
  const int64_t block = 64;  // attn::kBlockKeys
  const int64_t ring = (window + kRingSlack + block - 1) / block * block;
  return ring < context ? ring : 0;
}

std::size_t kv_bytes_per_position(const std::vector<KvLayerLayout>& layers, DType type) {
  std::size_t n = 0;
  for (const auto& l : layers) {
    n += row_bytes(type, l.k_width());
    if (l.v_width() > 0) n += row_bytes(type, l.v_width());
  }
  return n;
}

KvCache::KvCache(std::vector<KvLayerLayout> layers, int64_t context_length, DType type)
    : context_(context_length), layout_(std::move(layers)), type_(type), k_(layout_.size()), v_(layout_.size()) {
  if (context_ <= 0) fail(ErrorKind::InvalidArgument, "KV cache: context_length must be > 0");
  check_type(type_, layout_);
  for (const auto& l : layout_) {
    if (l.window < 0) fail(ErrorKind::InvalidArgument, "KV cache: a layer's window must be >= 0");
    k_row_.push_back(row_bytes(type_, l.k_width()));
    v_row_.push_back(l.v_width() > 0 ? row_bytes(type_, l.v_width()) : 0);
    ring_.push_back(kv_ring_positions(l.window, context_));
    if (ring_.back() > 0) max_window_ = std::max(max_window_, l.window);
  }
  per_position_ = kv_bytes_per_position(layout_, type_);
  for (const auto& l : layout_) {
    if (l.state_floats < 0 || l.comp_rate < 0 || l.comp_floats < 0)
      fail(ErrorKind::InvalidArgument, "KV cache: a negative state size");
    const int64_t floats = l.state_floats_at(context_);
    state_.emplace_back(static_cast<std::size_t>(floats), 0.0f);
    state_tokens_.push_back(floats > 0 ? 0 : -1);
    state_bytes_ += static_cast<std::size_t>(floats) * sizeof(float);
  }
}

int64_t KvCache::state_tokens() const {
  int64_t n = -2;  // none seen yet
  for (std::size_t i = 0; i < layout_.size(); ++i) {
    if (state_[i].empty()) continue;
    if (n == -2) n = state_tokens_[i];
    else if (state_tokens_[i] != n) return -1;
  }
  return n == -2 ? -1 : n;
}

void KvCache::forget_state() {
  for (std::size_t i = 0; i < layout_.size(); ++i)
    if (!state_[i].empty()) state_tokens_[i] = -1;
}

int64_t KvCache::rows_at(std::size_t i, int64_t n) const { return ring_[i] > 0 ? std::min(n, ring_[i]) : n; }

int64_t KvCache::state_rows(std::size_t i, int64_t n) const {
  return ring_[i] > 0 ? std::min(n, layout_[i].window) : n;
}

std::size_t KvCache::bytes_for(int64_t n) const {
  std::size_t b = 0;
  for (std::size_t i = 0; i < layout_.size(); ++i)
    b += static_cast<std::size_t>(state_rows(i, n)) * (k_row_[i] + v_row_[i]);
  return b;
}

std::size_t KvCache::bytes_at(int64_t n) const {
  std::size_t b = state_bytes_;  // linear-attention layers' state: the same at any n
  for (std::size_t i = 0; i < layout_.size(); ++i)
    b += static_cast<std::size_t>(rows_at(i, n)) * (k_row_[i] + v_row_[i]);
  return b;
}

std::size_t KvCache::bytes() const { return bytes_at(capacity_); }

// Continuing from L positions needs each ring layer's window before L: [L - window + 1, L).
bool KvCache::holds_rollback(int64_t L) const {
  if (L <= 0 || lost_below_ == 0) return true;
  for (std::size_t i = 0; i < layout_.size(); ++i)
    if (ring_[i] > 0 && std::max<int64_t>(0, L - layout_[i].window + 1) < lost_below_) return false;
  return true;
}

// The state of n positions keeps a ring layer's [n - window, n).
bool KvCache::holds_prefix(int64_t n) const {
  if (n <= 0 || lost_below_ == 0) return true;
  for (std::size_t i = 0; i < layout_.size(); ++i)
    if (ring_[i] > 0 && std::max<int64_t>(0, n - layout_[i].window) < lost_below_) return false;
  return true;
}

void KvCache::require_rollback(int64_t L, const char* what) const {
  if (holds_rollback(L)) return;
  int64_t ring = 0;
  for (int64_t r : ring_) ring = std::max(ring, r);
  fail(ErrorKind::InvalidArgument,
       std::string(what) + ": the sliding-window layers keep only their last " + std::to_string(ring) +
           " positions (window " + std::to_string(max_window_) + " + " + std::to_string(kRingSlack) +
           ", in blocks of 64), and positions before " + std::to_string(lost_below_) + " are gone; going back to " +
           std::to_string(L) + " tokens needs the window before it (reset the session and prefill again)");
}

KvCache::RingState KvCache::save_rings() const {
  RingState st;
  st.lost_below = lost_below_;
  st.k.resize(layout_.size());
  st.v.resize(layout_.size());
  for (std::size_t i = 0; i < layout_.size(); ++i)
    if (ring_[i] > 0) {
      st.k[i] = k_[i];
      st.v[i] = v_[i];
    }
  return st;
}

void KvCache::restore_rings(RingState st) {
  for (std::size_t i = 0; i < layout_.size() && i < st.k.size(); ++i)
    if (ring_[i] > 0) {
      // reserve() may have grown the ring since (a short cache): keep the new size.
      st.k[i].resize(k_[i].size());
      st.v[i].resize(v_[i].size());
      k_[i] = std::move(st.k[i]);
      v_[i] = std::move(st.v[i]);
    }
  lost_below_ = st.lost_below;
}

void KvCache::reserve(int64_t n) {
  if (n <= capacity_) return;
  const int64_t cap = std::min(context_, std::max<int64_t>(n, std::max<int64_t>(64, 2 * capacity_)));
  for (std::size_t i = 0; i < layout_.size(); ++i) {
    k_[i].resize(static_cast<std::size_t>(rows_at(i, cap)) * k_row_[i]);
    v_[i].resize(static_cast<std::size_t>(rows_at(i, cap)) * v_row_[i]);
  }
  capacity_ = cap;
}

void KvCache::store_k(int64_t layer, int64_t pos, const float* row) {
  const int64_t r = ring_[static_cast<std::size_t>(layer)];
  if (r > 0) lost_below_ = std::max(lost_below_, pos + 1 - r);
  kernels(type_).quantize_row(row, k(layer, pos), layout(layer).k_width());
}

void KvCache::store_v(int64_t layer, int64_t pos, const float* row) {
  kernels(type_).quantize_row(row, v(layer, pos), layout(layer).v_width());
}

void KvCache::export_to(int64_t n, uint8_t* out) const {
  if (n < 0 || n > capacity_)
    fail(ErrorKind::InvalidArgument, "KV export: " + std::to_string(n) + " positions requested, " +
                                         std::to_string(capacity_) + " allocated");
  if (!holds_prefix(n))
    fail(ErrorKind::InvalidArgument, "KV export: the state of " + std::to_string(n) +
                                         " positions is no longer in the sliding-window layers' rings");
  for (std::size_t i = 0; i < layout_.size(); ++i) {
    const int64_t rows = state_rows(i, n);
    for (int64_t p = n - rows; p < n; ++p) {
      std::memcpy(out, k(static_cast<int64_t>(i), p), k_row_[i]);
      out += k_row_[i];
    }
    for (int64_t p = n - rows; p < n && v_row_[i]; ++p) {
      std::memcpy(out, v(static_cast<int64_t>(i), p), v_row_[i]);
      out += v_row_[i];
    }
  }
}

void KvCache::import_from(int64_t n, const uint8_t* in, std::size_t size) {
  if (n < 0 || n > context_)
    fail(ErrorKind::InvalidArgument, "KV import: " + std::to_string(n) + " positions do not fit a context of " +
                                         std::to_string(context_));
  if (size != bytes_for(n))
    fail(ErrorKind::InvalidArgument, "KV import: " + std::to_string(n) + " positions at " + dtype_name(type_) +
                                         " take " + std::to_string(bytes_for(n)) + " bytes, got " +
                                         std::to_string(size) + " (another model or KV type?)");
  reserve(n);
  int64_t lost = 0;
  for (std::size_t i = 0; i < layout_.size(); ++i) {
    const int64_t rows = state_rows(i, n);
    if (ring_[i] > 0) lost = std::max(lost, n - rows);
    for (int64_t p = n - rows; p < n; ++p) {
      std::memcpy(k(static_cast<int64_t>(i), p), in, k_row_[i]);
      in += k_row_[i];
    }
    for (int64_t p = n - rows; p < n && v_row_[i]; ++p) {
      std::memcpy(v(static_cast<int64_t>(i), p), in, v_row_[i]);
      in += v_row_[i];
    }
  }
  lost_below_ = lost;
  forget_state();
}

bool KvCache::same_format(const KvCache& o) const {
  if (type_ != o.type_ || layout_.size() != o.layout_.size()) return false;
  for (std::size_t i = 0; i < layout_.size(); ++i) {
    const KvLayerLayout &a = layout_[i], &b = o.layout_[i];
    if (a.k_heads != b.k_heads || a.k_dim != b.k_dim || a.v_heads != b.v_heads || a.v_dim != b.v_dim ||
        ring_[i] != o.ring_[i] || a.window != b.window ||
        a.state_floats != b.state_floats || a.comp_rate != b.comp_rate || a.comp_floats != b.comp_floats ||
        state_[i].size() != o.state_[i].size())
      return false;
  }
  return true;
}

void KvCache::copy_prefix(const KvCache& other, int64_t n) {
  if (!same_format(other))
    fail(ErrorKind::InvalidArgument, "KV copy: the caches differ in layout or type (" + dtype_name(type_) + " vs " +
                                         dtype_name(other.type_) + ")");
  if (n < 0 || n > other.capacity_ || n > context_)
    fail(ErrorKind::InvalidArgument, "KV copy: " + std::to_string(n) + " positions requested; the source holds " +
                                         std::to_string(other.capacity_) + ", the context is " +
                                         std::to_string(context_));
  if (!other.holds_prefix(n))
    fail(ErrorKind::InvalidArgument, "KV copy: the state of " + std::to_string(n) +
                                         " positions is no longer in the sliding-window layers' rings");
  if (&other == this) return;
  reserve(n);
  int64_t lost = 0;
  for (std::size_t i = 0; i < layout_.size(); ++i) {
    const auto layer = static_cast<int64_t>(i);
    if (ring_[i] == 0) {
      if (k_row_[i]) std::memcpy(k_[i].data(), other.k_[i].data(), static_cast<std::size_t>(n) * k_row_[i]);
      if (v_row_[i]) std::memcpy(v_[i].data(), other.v_[i].data(), static_cast<std::size_t>(n) * v_row_[i]);
      continue;
    }
    const int64_t rows = state_rows(i, n);
    lost = std::max(lost, n - rows);
    for (int64_t p = n - rows; p < n; ++p) {
      std::memcpy(k(layer, p), other.k(layer, p), k_row_[i]);
      if (v_row_[i]) std::memcpy(v(layer, p), other.v(layer, p), v_row_[i]);
    }
  }
  lost_below_ = lost;
  // The source's state is the state after exactly its consumed tokens: usable only then.
  if (has_state() && other.state_tokens() == n) {
    state_ = other.state_;
    state_tokens_ = other.state_tokens_;
  } else {
    forget_state();
  }
}

void KvCache::truncate(int64_t L) {
  require_rollback(L, "rollback");
  if (L == 0) lost_below_ = 0;  // a fresh start: nothing before it is needed
}

}  // namespace colibri
