// The compute team. The calling thread is member 0 and works too; n_threads - 1 workers
// are owned by the pool. Between two parallel regions of one computation the workers wait
// according to the WaitPolicy; when the computation ends (ComputeScope closes) every worker
// parks on a condition variable, so an idle model uses no CPU under any policy.
//
// Settings take effect at once: configure() may be called between any two calls, also on
// a loaded model. Nothing is read from the environment.
//
// Determinism: parallel_for hands out disjoint index ranges; callers make each index's
// result depend only on its inputs (one output row per index, fixed reduction order), so
// results do not depend on the team size, the policy or which thread ran what.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace colibri {

enum class WaitPolicy : int {
  Spin = 0,     // busy-wait between regions (lowest latency, burns a core per worker)
  Passive = 1,  // sleep on a condition variable between regions
  Hybrid = 2,   // spin for up to spin_us, then sleep
};

struct ThreadSettings {
  int n_threads = 1;                      // team size including the caller, >= 1
  WaitPolicy policy = WaitPolicy::Hybrid;
  int64_t spin_us = 200;                  // Hybrid: how long to spin before sleeping
};

struct ThreadPoolStats {
  uint64_t regions = 0;        // parallel_for calls that used the team
  uint64_t sleeps = 0;         // times a worker went to sleep while waiting for work
};

class ThreadPool {
 public:
  explicit ThreadPool(const ThreadSettings& settings);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Applies new settings (resizes the team if needed). Not to be called while a
  // parallel_for is running.
  void configure(const ThreadSettings& settings);
  ThreadSettings settings() const;
  int size() const;

  // Runs fn(begin, end, thread_index) over [0, n) split into chunks of about `grain`
  // indices; the caller participates and returns when every index is done. An exception
  // thrown by fn is rethrown in the caller after the region ends.
  void parallel_for(int64_t n, int64_t grain,
                    const std::function<void(int64_t begin, int64_t end, int thread)>& fn);

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

  ThreadPoolStats stats() const;

 private:
  struct Impl;
  Impl* impl_;
};

}  // namespace colibri
