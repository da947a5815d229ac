// Where the wall time of a decode goes: with a read on the device, with the forward thread
// computing, both, or neither. The I/O side flips the "disk" bit when the first read enters
// the device and when the last leaves it (ReadPool, under its own lock); the forward thread
// flips the "compute" bit on entering a forward and around each wait for an expert. Every
// flip charges the time since the previous flip to the state that held meanwhile, so the
// four buckets partition the clock's lifetime: disk-busy = io_and_compute + io_only,
// compute = io_and_compute + compute_only, and neither = the rest.
//
// Lock-free: the state bits and the time of the last flip share one atomic word (changed by
// compare-and-swap), the buckets are atomic nanosecond counters. A flip costs one clock read
// and a few uncontended atomic operations, cheap beside a read of megabytes or a layer's
// compute (a few hundred flips per token).
//
// seconds() charges the current state up to now, then reads the buckets when no flip is
// between its CAS and its add (a count of flips in progress and one of flips done tell), so
// the four add up exactly to the time of the last flip it saw.
#pragma once
#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <thread>

namespace colibri {

struct ActivitySeconds {
  double io_and_compute = 0, io_only = 0, compute_only = 0, neither = 0;
};

class ActivityClock {
 public:
  static constexpr uint64_t kCompute = 1, kDisk = 2;

  ActivityClock() : word_(now_ns() << 2) {}
  ActivityClock(const ActivityClock&) = delete;
  ActivityClock& operator=(const ActivityClock&) = delete;

  void set_disk(bool on) { flip(kDisk, on); }
  void set_compute(bool on) { flip(kCompute, on); }
  bool computing() const { return (word_.load(std::memory_order_relaxed) & kCompute) != 0; }

  ActivitySeconds seconds() {
    flip(0, false);  // charges the current state up to now, changes nothing
    std::array<uint64_t, 4> ns{};
    for (;;) {
      const uint64_t done = done_.load();
      if (busy_.load() != 0) {
        std::this_thread::yield();  // a flip between its CAS and its add: rare, short
        continue;
      }
      for (std::size_t i = 0; i < 4; ++i) ns[i] = ns_[i].load();
      if (busy_.load() == 0 && done_.load() == done) break;
    }
    const auto s = [&ns](uint64_t state) { return static_cast<double>(ns[state]) * 1e-9; };
    ActivitySeconds out;
    out.io_and_compute = s(kDisk | kCompute);
    out.io_only = s(kDisk);
    out.compute_only = s(kCompute);
    out.neither = s(0);
    return out;
  }

  // The forward thread computes for the scope's life (restoring what held before, so
  // scopes nest: a wait for an expert inside a forward is a Scope(clock, false)).
  class Scope {
   public:
    Scope(ActivityClock& c, bool computing) : c_(c), before_(c.computing()) { c_.set_compute(computing); }
    ~Scope() { c_.set_compute(before_); }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    ActivityClock& c_;
    bool before_;
  };

 private:
  static uint64_t now_ns() {
    return static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
            .count());
  }

  // bit: kDisk or kCompute (0: no change); the word is (ns of the last flip << 2) | state.
  void flip(uint64_t bit, bool on) {
    busy_.fetch_add(1);
    uint64_t old = word_.load();
    for (;;) {
      const uint64_t last = old >> 2, state = old & 3;
      uint64_t t = now_ns();
      if (t < last) t = last;  // a flip that read the clock before ours won the CAS
      const uint64_t next_state = bit == 0 ? state : (on ? (state | bit) : (state & ~bit));
      if (word_.compare_exchange_weak(old, (t << 2) | next_state)) {
        ns_[state].fetch_add(t - last);
        done_.fetch_add(1);
        busy_.fetch_sub(1);
        return;
      }
    }
  }

  std::atomic<uint64_t> word_;
  std::array<std::atomic<uint64_t>, 4> ns_{};
  std::atomic<uint32_t> busy_{0};  // flips between their CAS and their add (seconds())
  std::atomic<uint64_t> done_{0};  // flips finished
};

}  // namespace colibri
