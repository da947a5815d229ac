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

}  // namespace colibri
