// The compute team. The calling thread is member 0 and works too; n_threads - 1 workers
// are owned by the pool. Between two parallel regions of one computation the workers wait
// according to the WaitPolicy; when the computation ends (ComputeScope closes) every worker
// parks on a condition variable, so an idle model uses no CPU under any policy.
//
// Settings take effect at once: configure() may be called between any two calls, also on
// a loaded model. Nothing is read from the environment.
//
// Oversubscription: a spinning wait that finds it lost its core for over a millisecond
// sleeps instead; after three such waits in one computation (more runnable threads than
// cores) every later wait of that computation sleeps, whatever the policy: the scheduler
// favours sleepers, and a spinning team on a busy machine is many times slower than a
// sleeping one. stats().starved counts these waits.
//
// Determinism: parallel_for hands out disjoint index ranges; callers make each index's
// result depend only on its inputs (one output row per index, fixed reduction order), so
// results do not depend on the team size, the policy or which thread ran what.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

namespace colibri {

enum class WaitPolicy : int {
  Spin = 0,     // busy-wait between the regions of a computation (lowest latency, burns
                // a core per waiting thread)
  Passive = 1,  // sleep on a condition variable between regions
  Hybrid = 2,   // spin for up to spin_us, then sleep
  Auto = 3,     // chosen per forward by the engine from how disk-bound the work is
                // (model/engine.hpp); a bare ThreadPool refuses it
};

// Limits checked by ThreadPool (Error(InvalidArgument) outside them).
constexpr int kMaxThreads = 1024;
constexpr int64_t kMaxSpinUs = 1000000;   // 1 s

struct ThreadSettings {
  int n_threads = 1;                      // team size including the caller, 1..kMaxThreads
  WaitPolicy policy = WaitPolicy::Hybrid;
  int64_t spin_us = 100;                  // Hybrid: microseconds to spin before sleeping,
                                          // 0..kMaxSpinUs (0 = behaves like Passive)
};

struct ThreadPoolStats {
  uint64_t regions = 0;         // parallel_for calls that used the team (>= 2 members)
  uint64_t inline_regions = 0;  // parallel_for calls the caller ran alone (one chunk,
                                // a team of 1, or a nested call from inside a region)
  uint64_t sleeps = 0;          // times a worker went to sleep while waiting for work
  uint64_t caller_sleeps = 0;   // times the caller slept waiting for a region to finish
  uint64_t scopes = 0;          // outermost ComputeScopes opened
  uint64_t starved = 0;         // spin waits that lost their core mid-wait and slept;
                                // after 3 in one computation, the rest of its waits
                                // sleep, whatever the policy
};

// A non-owning reference to the callable a region runs: fn(begin, end, thread). Unlike a
// std::function it never allocates, whatever the lambda captures; it is only valid while
// the callable lives, which parallel_for guarantees (it returns after the region ends).
class RegionFn {
 public:
  template <typename F>
  explicit RegionFn(F& f) noexcept
      : obj_(const_cast<void*>(static_cast<const void*>(std::addressof(f)))), call_(&invoke<F>) {}
  void operator()(int64_t begin, int64_t end, int thread) const { call_(obj_, begin, end, thread); }

 private:
  template <typename F>
  static void invoke(void* obj, int64_t begin, int64_t end, int thread) {
    (*static_cast<F*>(obj))(begin, end, thread);
  }
  void* obj_;
  void (*call_)(void*, int64_t, int64_t, int);
};

class ThreadPool {
 public:
  explicit ThreadPool(const ThreadSettings& settings);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Applies new settings at once (resizes the team if needed, changes the policy).
  // Safe between any two parallel_for calls, also inside a ComputeScope; a call from
  // another thread waits for a running parallel_for to end. Calling it from inside a
  // region's fn throws Error(InvalidArgument). Bad values throw Error(InvalidArgument).
  void configure(const ThreadSettings& settings);
  ThreadSettings settings() const;
  int size() const;

  // Runs fn(begin, end, thread_index) over [0, n) split into chunks of at most `grain`
  // indices (grain <= 0: about four chunks per member); the caller participates as
  // thread 0 and returns when every index is done. Chunks are handed out dynamically, so
  // which thread runs an index is not fixed. An exception thrown by fn is rethrown in the
  // caller after the region ends (the first one wins; remaining chunks are skipped).
  // Calls from several threads are serialized; a nested call from inside fn runs inline.
  // fn is any callable taking (int64_t begin, int64_t end, int thread); a lambda is
  // referenced, not copied, so a region costs no allocation.
  template <typename F>
  void parallel_for(int64_t n, int64_t grain, F&& fn) {
    if constexpr (std::is_function_v<std::remove_reference_t<F>>) {
      auto* ptr = &fn;  // a plain function: refer to a pointer to it
      run_region(n, grain, RegionFn(ptr));
    } else {
      run_region(n, grain, RegionFn(fn));
    }
  }

  // Marks a computation (e.g. one forward call). Spinning is allowed only inside one.
  class ComputeScope {
   public:
    explicit ComputeScope(ThreadPool& pool);
    ~ComputeScope();
    ComputeScope(const ComputeScope&) = delete;
    ComputeScope& operator=(const ComputeScope&) = delete;

   private:
    ThreadPool& pool_;
  };

  // Inside a ComputeScope, a stretch where the team has nothing to do for a long time (the
  // caller waits for a disk read): the workers park as if the computation had ended, and
  // the next region wakes them. Only the thread that opened the ComputeScope may use it.
  class IdleScope {
   public:
    explicit IdleScope(ThreadPool& pool);
    ~IdleScope();
    IdleScope(const IdleScope&) = delete;
    IdleScope& operator=(const IdleScope&) = delete;

   private:
    ThreadPool& pool_;
    int depth_;
  };

  ThreadPoolStats stats() const;
  void reset_stats();

 private:
  void run_region(int64_t n, int64_t grain, RegionFn fn);
  struct Impl;
  Impl* impl_;
};

}  // namespace colibri
