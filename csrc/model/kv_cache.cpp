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
    k_row_.push_back(row_bytes(type_, l.k_width()));
    v_row_.push_back(l.v_width() > 0 ? row_bytes(type_, l.v_width()) : 0);
  }
  per_position_ = kv_bytes_per_position(layout_, type_);
  for (const auto& l : layout_) {
    if (l.state_floats < 0) fail(ErrorKind::InvalidArgument, "KV cache: a negative state size");
    state_.emplace_back(static_cast<std::size_t>(l.state_floats), 0.0f);
    state_tokens_.push_back(l.state_floats > 0 ? 0 : -1);
    state_bytes_ += static_cast<std::size_t>(l.state_floats) * sizeof(float);
  }
}

int64_t KvCache::state_tokens() const {
  int64_t n = -2;  // none seen yet
  for (std::size_t i = 0; i < layout_.size(); ++i) {
    if (layout_[i].state_floats == 0) continue;
    if (n == -2) n = state_tokens_[i];
    else if (state_tokens_[i] != n) return -1;
  }
  return n == -2 ? -1 : n;
}

void KvCache::forget_state() {
  for (std::size_t i = 0; i < layout_.size(); ++i)
    if (layout_[i].state_floats > 0) state_tokens_[i] = -1;
}

void KvCache::reserve(int64_t n) {
  if (n <= capacity_) return;
  const int64_t cap = std::min(context_, std::max<int64_t>(n, std::max<int64_t>(64, 2 * capacity_)));
  for (std::size_t i = 0; i < layout_.size(); ++i) {
    k_[i].resize(static_cast<std::size_t>(cap) * k_row_[i]);
    v_[i].resize(static_cast<std::size_t>(cap) * v_row_[i]);
  }
  capacity_ = cap;
}

void KvCache::store_k(int64_t layer, int64_t pos, const float* row) {
  kernels(type_).quantize_row(row, k(layer, pos), layout(layer).k_width());
}

void KvCache::store_v(int64_t layer, int64_t pos, const float* row) {
  kernels(type_).quantize_row(row, v(layer, pos), layout(layer).v_width());
}

void KvCache::export_to(int64_t n, uint8_t* out) const {
  if (n < 0 || n > capacity_)
    fail(ErrorKind::InvalidArgument, "KV export: " + std::to_string(n) + " positions requested, " +
                                         std::to_string(capacity_) + " allocated");
  for (std::size_t i = 0; i < layout_.size(); ++i) {
    for (const auto* side : {&k_[i], &v_[i]}) {
      const std::size_t b = static_cast<std::size_t>(n) * (side == &k_[i] ? k_row_[i] : v_row_[i]);
      if (b) std::memcpy(out, side->data(), b);
      out += b;
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
  for (std::size_t i = 0; i < layout_.size(); ++i) {
    for (auto* side : {&k_[i], &v_[i]}) {
      const std::size_t b = static_cast<std::size_t>(n) * (side == &k_[i] ? k_row_[i] : v_row_[i]);
      if (b) std::memcpy(side->data(), in, b);
      in += b;
    }
  }
  forget_state();
}

bool KvCache::same_format(const KvCache& o) const {
  if (type_ != o.type_ || layout_.size() != o.layout_.size()) return false;
  for (std::size_t i = 0; i < layout_.size(); ++i) {
    const KvLayerLayout &a = layout_[i], &b = o.layout_[i];
    if (a.k_heads != b.k_heads || a.k_dim != b.k_dim || a.v_heads != b.v_heads || a.v_dim != b.v_dim ||
        a.state_floats != b.state_floats)
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
  if (&other == this) return;
  reserve(n);
  for (std::size_t i = 0; i < layout_.size(); ++i) {
    if (k_row_[i]) std::memcpy(k_[i].data(), other.k_[i].data(), static_cast<std::size_t>(n) * k_row_[i]);
    if (v_row_[i]) std::memcpy(v_[i].data(), other.v_[i].data(), static_cast<std::size_t>(n) * v_row_[i]);
  }
  // The source's state is the state after exactly its consumed tokens: usable only then.
  if (has_state() && other.state_tokens() == n) {
    state_ = other.state_;
    state_tokens_ = other.state_tokens_;
  } else {
    forget_state();
  }
}

}  // namespace colibri
