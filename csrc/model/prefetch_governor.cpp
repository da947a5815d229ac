#include "model/prefetch_governor.hpp"

#include <algorithm>
#include <string>

#include "common/errors.hpp"

namespace colibri {

PrefetchGovernor::PrefetchGovernor(int window, int min_samples, double off_below, double on_at)
    : min_samples_(min_samples), off_below_(off_below), on_at_(on_at) {
  if (window < 1 || min_samples < 1 || min_samples > window)
    fail(ErrorKind::InvalidArgument, "prefetch governor: need 1 <= min_samples <= window, got window " +
                                         std::to_string(window) + ", min_samples " + std::to_string(min_samples));
  if (!(off_below >= 0.0 && off_below <= on_at && on_at <= 1.0))
    fail(ErrorKind::InvalidArgument, "prefetch governor: need 0 <= off_below <= on_at <= 1");
  ring_.assign(static_cast<std::size_t>(window), 0);
}

void PrefetchGovernor::record(bool used) {
  const auto w = static_cast<int>(ring_.size());
  uint8_t& cell = ring_[static_cast<std::size_t>(head_)];
  if (count_ == w) used_ -= cell;  // the oldest outcome leaves the window
  else ++count_;
  cell = used ? 1 : 0;
  used_ += cell;
  head_ = (head_ + 1) % w;
  if (count_ < min_samples_) return;
  const double acc = accuracy();
  if (active_ && acc < off_below_) {
    active_ = false;
    ++offs_;
  } else if (!active_ && acc >= on_at_) {
    active_ = true;
    ++ons_;
  }
}

void PrefetchGovernor::reset() {
  std::fill(ring_.begin(), ring_.end(), 0);
  head_ = count_ = used_ = 0;
  active_ = true;
}

}  // namespace colibri
