// INTERIM KV state export/import/copy for the F32 KvCache (see session.hpp): what
// Session.save/load and the prompt cache need until the attention branch's type-agnostic
// KvCache state API lands with the same Session methods; then this file goes away.
//
// Layout of an export of n positions: for each layer, its keys [0, n) then its values
// [0, n), rows of k_width / v_width floats, exactly as the cache stores them.
#include <cstring>
#include <string>

#include "common/errors.hpp"
#include "model/session.hpp"

namespace colibri {

namespace {

std::size_t per_position(const KvCache& kv) {
  std::size_t b = 0;
  for (int64_t l = 0; l < kv.n_layers(); ++l)
    b += static_cast<std::size_t>(kv.layout(l).k_width() + kv.layout(l).v_width()) * sizeof(float);
  return b;
}

}  // namespace

std::size_t Session::kv_bytes_for(int64_t n) const {
  return per_position(kv_) * static_cast<std::size_t>(n < 0 ? 0 : n);
}

std::vector<uint8_t> Session::export_kv(int64_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  if (n < 0 || n > n_tokens_)
    fail(ErrorKind::InvalidArgument,
         "cannot export " + std::to_string(n) + " positions: the session holds " + std::to_string(n_tokens_));
  std::vector<uint8_t> out(kv_bytes_for(n));
  uint8_t* p = out.data();
  for (int64_t l = 0; l < kv_.n_layers(); ++l) {
    const auto kb = static_cast<std::size_t>(n * kv_.layout(l).k_width()) * sizeof(float);
    const auto vb = static_cast<std::size_t>(n * kv_.layout(l).v_width()) * sizeof(float);
    if (kb) std::memcpy(p, kv_.k(l, 0), kb);
    p += kb;
    if (vb) std::memcpy(p, kv_.v(l, 0), vb);
    p += vb;
  }
  return out;
}

void Session::import_kv(const uint8_t* data, std::size_t size, int64_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  if (n < 0 || n > kv_.context_length())
    fail(ErrorKind::ContextOverflow, "cannot import " + std::to_string(n) + " positions into a context of " +
                                         std::to_string(kv_.context_length()));
  if (size != kv_bytes_for(n))
    fail(ErrorKind::InvalidArgument, "the KV state has " + std::to_string(size) + " bytes, but " +
                                         std::to_string(n) + " positions of this model take " +
                                         std::to_string(kv_bytes_for(n)) + " (another model or KV type?)");
  kv_.reserve(n);
  const uint8_t* p = data;
  for (int64_t l = 0; l < kv_.n_layers(); ++l) {
    const auto kb = static_cast<std::size_t>(n * kv_.layout(l).k_width()) * sizeof(float);
    const auto vb = static_cast<std::size_t>(n * kv_.layout(l).v_width()) * sizeof(float);
    if (kb) std::memcpy(kv_.k(l, 0), p, kb);
    p += kb;
    if (vb) std::memcpy(kv_.v(l, 0), p, vb);
    p += vb;
  }
  n_tokens_ = n;
  last_routing_.clear();
  last_routing_tokens_ = 0;
}

void Session::copy_prefix_from(Session& other, int64_t n) {
  if (&other == this) {
    std::lock_guard<std::mutex> lock(mu_);
    if (n < 0 || n > n_tokens_)
      fail(ErrorKind::InvalidArgument,
           "cannot keep " + std::to_string(n) + " tokens: the session holds " + std::to_string(n_tokens_));
    n_tokens_ = n;
    return;
  }
  if (other.engine_ != engine_)
    fail(ErrorKind::InvalidArgument, "copy_prefix_from: the sessions belong to different models");
  std::unique_lock<std::mutex> a(mu_, std::defer_lock), b(other.mu_, std::defer_lock);
  std::lock(a, b);
  if (n < 0 || n > other.n_tokens_)
    fail(ErrorKind::InvalidArgument, "cannot copy " + std::to_string(n) + " tokens: the source session holds " +
                                         std::to_string(other.n_tokens_));
  if (n > kv_.context_length())
    fail(ErrorKind::ContextOverflow, "cannot copy " + std::to_string(n) + " tokens into a context of " +
                                         std::to_string(kv_.context_length()));
  kv_.reserve(n);
  for (int64_t l = 0; l < kv_.n_layers(); ++l) {
    const auto kb = static_cast<std::size_t>(n * kv_.layout(l).k_width()) * sizeof(float);
    const auto vb = static_cast<std::size_t>(n * kv_.layout(l).v_width()) * sizeof(float);
    if (kb) std::memcpy(kv_.k(l, 0), other.kv_.k(l, 0), kb);
    if (vb) std::memcpy(kv_.v(l, 0), other.kv_.v(l, 0), vb);
  }
  n_tokens_ = n;
  last_routing_.clear();
  last_routing_tokens_ = 0;
}

}  // namespace colibri
