#include "model/session.hpp"

#include "common/errors.hpp"

namespace colibri {

void Session::rollback(int64_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  if (n < 0 || n > n_tokens_)
    fail(ErrorKind::InvalidArgument, "cannot roll back " + std::to_string(n) + " tokens: the session holds " +
                                         std::to_string(n_tokens_));
  n_tokens_ -= n;
}

std::vector<uint8_t> Session::export_kv(int64_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  if (n < 0 || n > n_tokens_)
    fail(ErrorKind::InvalidArgument, "cannot export " + std::to_string(n) + " positions: the session holds " +
                                         std::to_string(n_tokens_));
  std::vector<uint8_t> out(kv_.bytes_for(n));
  kv_.export_to(n, out.data());
  return out;
}

void Session::import_kv(const uint8_t* data, std::size_t size, int64_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  kv_.import_from(n, data, size);  // validates before changing anything
  n_tokens_ = n;
  last_routing_.clear();
  last_routing_tokens_ = 0;
}

void Session::copy_prefix_from(Session& other, int64_t n) {
  if (&other == this) {
    std::lock_guard<std::mutex> lock(mu_);
    if (n < 0 || n > n_tokens_)
      fail(ErrorKind::InvalidArgument, "cannot keep " + std::to_string(n) + " tokens: the session holds " +
                                           std::to_string(n_tokens_));
    n_tokens_ = n;
    return;
  }
  std::unique_lock<std::mutex> a(mu_, std::defer_lock), b(other.mu_, std::defer_lock);
  std::lock(a, b);
  if (n < 0 || n > other.n_tokens_)
    fail(ErrorKind::InvalidArgument, "cannot copy " + std::to_string(n) + " tokens: the source session holds " +
                                         std::to_string(other.n_tokens_));
  kv_.copy_prefix(other.kv_, n);
  n_tokens_ = n;
  last_routing_.clear();
  last_routing_tokens_ = 0;
}

}  // namespace colibri
