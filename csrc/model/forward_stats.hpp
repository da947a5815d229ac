// What one forward did to the engine's cumulative counters (expert cache, expert I/O, time
// per phase), measured inside the engine lock, so that a session's own figures stay its own
// when several sessions share one engine from different threads. A session accumulates
// the deltas of its forwards; a generation's figures are two snapshots of its session's.
//
// Reads the I/O workers are still doing when a forward returns (prefetches of experts the
// next layer did not route to) are counted by the forward during which they finish.
#pragma once
#include <cstdint>

#include "model/engine.hpp"
#include "model/expert_store.hpp"

namespace colibri {

struct ForwardStats {
  ExpertStoreStats experts;
  PhaseSeconds phases{};
  int64_t forwards = 0;  // forward calls counted
};

// out += after - before, field by field.
inline void add_delta(ExpertStoreStats& out, const ExpertStoreStats& after, const ExpertStoreStats& before) {
  out.hits += after.hits - before.hits;
  out.misses += after.misses - before.misses;
  out.ready_hits += after.ready_hits - before.ready_hits;
  out.reads += after.reads - before.reads;
  out.bytes_read += after.bytes_read - before.bytes_read;
  out.read_errors += after.read_errors - before.read_errors;
  out.checksum_failures += after.checksum_failures - before.checksum_failures;
  out.read_seconds += after.read_seconds - before.read_seconds;
  out.stall_seconds += after.stall_seconds - before.stall_seconds;
  out.prefetch_issued += after.prefetch_issued - before.prefetch_issued;
  out.prefetch_used += after.prefetch_used - before.prefetch_used;
  out.prefetch_wasted += after.prefetch_wasted - before.prefetch_wasted;
  out.prefetch_cancelled += after.prefetch_cancelled - before.prefetch_cancelled;
  out.prefetch_candidates += after.prefetch_candidates - before.prefetch_candidates;
  out.prefetch_candidates_used += after.prefetch_candidates_used - before.prefetch_candidates_used;
  out.prefetch_throttled += after.prefetch_throttled - before.prefetch_throttled;
  out.prefetch_suppressed += after.prefetch_suppressed - before.prefetch_suppressed;
  out.prefetch_switched_off += after.prefetch_switched_off - before.prefetch_switched_off;
  out.prefetch_switched_on += after.prefetch_switched_on - before.prefetch_switched_on;
  out.first_candidates += after.first_candidates - before.first_candidates;
  out.first_candidates_used += after.first_candidates_used - before.first_candidates_used;
  out.first_issued += after.first_issued - before.first_issued;
  out.first_used += after.first_used - before.first_used;
  out.first_wasted += after.first_wasted - before.first_wasted;
  out.predicted_routed += after.predicted_routed - before.predicted_routed;
  out.routed_after_prediction += after.routed_after_prediction - before.routed_after_prediction;
  out.evictions += after.evictions - before.evictions;
  out.direct_reads += after.direct_reads - before.direct_reads;
  out.buffered_reads += after.buffered_reads - before.buffered_reads;
  out.inline_reads += after.inline_reads - before.inline_reads;
  out.cap_waits += after.cap_waits - before.cap_waits;
  out.busy_seconds += after.busy_seconds - before.busy_seconds;
  out.io_and_compute_seconds += after.io_and_compute_seconds - before.io_and_compute_seconds;
  out.io_only_seconds += after.io_only_seconds - before.io_only_seconds;
  out.compute_only_seconds += after.compute_only_seconds - before.compute_only_seconds;
  out.neither_seconds += after.neither_seconds - before.neither_seconds;
}

inline void add_delta(PhaseSeconds& out, const PhaseSeconds& after, const PhaseSeconds& before) {
  for (int i = 0; i < kPhases; ++i) out[i] += after[i] - before[i];
}

// Adds to *out what the store's and phase counters did between construction and destruction,
// so a forward counts its share even when it throws (a failed read). Nothing when out is null.
// count_forward: trunk forwards count themselves; an MTP draft forward adds only its
// expert and phase figures.
class CounterDeltaScope {
 public:
  CounterDeltaScope(ForwardStats* out, const ExpertStore& store, const PhaseSeconds& phases, bool count_forward)
      : out_(out), store_(store), phases_(phases), count_forward_(count_forward),
        experts0_(out ? store.stats() : ExpertStoreStats{}), phases0_(phases) {}
  ~CounterDeltaScope() {
    if (!out_) return;
    add_delta(out_->experts, store_.stats(), experts0_);
    add_delta(out_->phases, phases_, phases0_);
    if (count_forward_) ++out_->forwards;
  }
  CounterDeltaScope(const CounterDeltaScope&) = delete;
  CounterDeltaScope& operator=(const CounterDeltaScope&) = delete;

 private:
  ForwardStats* out_;
  const ExpertStore& store_;
  const PhaseSeconds& phases_;
  bool count_forward_;
  ExpertStoreStats experts0_;
  PhaseSeconds phases0_;
};

}  // namespace colibri
