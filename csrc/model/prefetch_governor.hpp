// Whether the next-layer lookahead is worth its reads right now (issue 14, "use the device").
//
// A prefetch that the next layer does not route to costs a read of the device's time and
// a slot; on a disk that is the bottleneck a run of wrong guesses makes decode slower than
// no prefetch at all (docs/benchmarks-log.md, 2026-11-30: 51% of reads used on *local* routing,
// a net loss). The governor keeps a rolling window of outcomes, one per *candidate*: a
// predicted expert that was not in the cache when predicted, i.e. one a prefetch would
// read. Its outcome is whether the layer then routed to it. Candidates are scored whether
// their read was issued or not (the governor off, or no idle I/O capacity), so the same
// figure says when to stop and when to start again: prefetch goes off when the window's
// accuracy falls below `off_below`, and on again once it reaches `on_at` (hysteresis, so
// one noisy token does not flip it back and forth). No decision before `min_samples`.
//
// Pure bookkeeping, deterministic, no clock: the expert store (expert_store.hpp) feeds it
// from settle(), tests drive it directly (_core.io.PrefetchGovernor). It never changes a
// logit: only which reads start early.
#pragma once
#include <cstdint>
#include <vector>

namespace colibri {

class PrefetchGovernor {
 public:
  // Defaults: break-even of this VM's disk (docs/streaming.md, "Prefetch policy"): a
  // wrong guess costs a full read, a right one saves a stall only when the device had room.
  static constexpr int kWindow = 128;
  static constexpr int kMinSamples = 32;
  static constexpr double kOffBelow = 0.55;
  static constexpr double kOnAt = 0.65;
  // What StoreSettings::prefetch_min_accuracy keeps between its off and on thresholds.
  static constexpr double kHysteresis = kOnAt - kOffBelow;

  explicit PrefetchGovernor(int window = kWindow, int min_samples = kMinSamples, double off_below = kOffBelow,
                            double on_at = kOnAt);

  // One candidate's outcome: true when the layer routed to it.
  void record(bool used);
  bool active() const { return active_; }
  // Used share of the outcomes in the window (0 when empty).
  double accuracy() const { return count_ ? static_cast<double>(used_) / count_ : 0.0; }
  int samples() const { return count_; }
  uint64_t switched_off() const { return offs_; }
  uint64_t switched_on() const { return ons_; }
  // Forgets the window and turns prefetch on (a new store configuration).
  void reset();

 private:
  std::vector<uint8_t> ring_;
  int min_samples_;
  double off_below_, on_at_;
  int head_ = 0, count_ = 0, used_ = 0;
  bool active_ = true;
  uint64_t offs_ = 0, ons_ = 0;
};

}  // namespace colibri
