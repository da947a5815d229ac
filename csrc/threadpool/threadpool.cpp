// The compute team: see threadpool.hpp for the contract.
//
// How a region is handed out. The caller writes the job (fn, n, grain), resets the index
// counter and the count of workers it waits for, then publishes one 64-bit word:
// (generation << 16) | active_members. Workers wait for that word to change (spinning or
// sleeping, per the policy); a worker whose index is below active_members takes chunks
// from the shared atomic counter, the others go straight back to waiting. Packing the
// member count into the published word means a non-participating worker never reads job
// fields that the caller may already be rewriting for the next region.
//
// Sleeping uses one mutex + condition variable for "new work" and one for "region done".
// Wakeups avoid the mutex on the fast path with the classic store/load (Dekker) pairing
// on seq_cst atomics: the waker stores the word then reads the sleeper count; the sleeper
// increments the sleeper count then reads the word. At least one side sees the other, so
// no wakeup is lost, and a spinning team never touches the mutex.
#include "threadpool/threadpool.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <string>
#include <system_error>

#include "common/errors.hpp"

#if defined(__x86_64__) || defined(_M_X64) || defined(__i386__)
#include <immintrin.h>
#endif
#if defined(__linux__)
#include <pthread.h>
#endif

namespace colibri {

namespace {

// One iteration of a spin loop: tells the core we are spinning (saves power, frees the
// SMT sibling's pipeline, avoids a memory-order mis-speculation flush on exit).
inline void cpu_pause() {
#if defined(__x86_64__) || defined(_M_X64) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__) || defined(__arm__)
  __asm__ __volatile__("yield" ::: "memory");
#else
  std::this_thread::yield();
#endif
}

using Clock = std::chrono::steady_clock;
// Spin loops look at the clock, the policy and the scope only every kCheckEvery pauses:
// reading the clock costs ~20 ns, a pause ~10-40 ns, so this keeps the poll of the work
// word tight while bounding the reaction to a policy change or a closed scope to a few µs.
constexpr uint32_t kCheckEvery = 64;
// A spinner gives up its core (sched_yield, not a sleep) every kYieldEvery of spinning.
// On an idle machine this costs ~1 % of a spinning core (the yield returns at once). On a
// busy one it lets a preempted team member run: measured on the 2-core VM under load, a
// spinning team took 0.8 ms per region with the yield and 16 ms without (the caller spun
// through whole time slices while the worker it waited for sat in the run queue).
constexpr auto kYieldEvery = std::chrono::microseconds(50);
constexpr uint64_t kMembersMask = 0xffff;  // low 16 bits of the word: active members

// A spin wait that finds a check more than kStarvedGap after the previous one (normally
// a few µs apart) lost its core to another thread. That wait sleeps for the rest of its
// duration (spinning on cannot help: the thread it waits for may be the one that lost its
// core). After kStarvedStrikes such waits in one computation the machine is taken to be
// oversubscribed (more runnable threads than cores: other processes, or our own I/O
// workers) and every later wait of that computation sleeps, under every policy: the
// scheduler favours sleepers, and a spinning team is then many times slower. The next
// computation tries spinning again. Measured on the 2-core VM with three extra CPU-bound
// processes: 10-19 ms per region spinning without this rule, 0.3-1 ms with it, 0.3-0.7 ms
// passive. One stray preemption (a kernel thread, a timer) does not switch the policy.
// Counted in stats().starved.
constexpr auto kStarvedGap = std::chrono::milliseconds(1);
constexpr int kStarvedStrikes = 3;

// The clock of one spin wait. It is first read at the first check, after kCheckEvery
// pauses, so a hand-off that completes sooner (the common case) reads no clock at all.
struct SpinClock {
  Clock::time_point start{};
  Clock::time_point last{};
  Clock::time_point next_yield{};
  bool started = false;
  bool starved = false;  // a check came kStarvedGap late: this thread lost its core

  // Called every kCheckEvery pauses: yields the core every kYieldEvery and returns how
  // long this wait has spun so far.
  Clock::duration tick() {
    const Clock::time_point now = Clock::now();
    if (!started) {
      started = true;
      start = last = now;
      next_yield = now + kYieldEvery;
      return Clock::duration::zero();
    }
    if (now - last > kStarvedGap) starved = true;
    last = now;
    if (now >= next_yield) {
      std::this_thread::yield();  // a yield that returns late shows at the next tick
      next_yield = now + kYieldEvery;
    }
    return now - start;
  }
};

// The pool a thread is currently working for: set for workers for their whole life and
// for the caller during a region. A parallel_for on the same pool from such a thread is
// a nested call and runs inline (waiting on our own team would deadlock).
thread_local const void* tl_current_pool = nullptr;
// This thread's member index in tl_current_pool. A nested call passes it on, so per-thread
// scratch indexed by the member (sized pool.size()) stays private to this thread.
thread_local int tl_member = 0;

// What the job's fn refers to between regions (never called).
void no_region_fn(int64_t, int64_t, int) {}
auto no_region = no_region_fn;

void validate(const ThreadSettings& s) {
  if (s.n_threads < 1 || s.n_threads > kMaxThreads)
    fail(ErrorKind::InvalidArgument, "threads: n_threads must be between 1 and " +
                                         std::to_string(kMaxThreads) + ", got " +
                                         std::to_string(s.n_threads));
  if (s.policy != WaitPolicy::Spin && s.policy != WaitPolicy::Passive &&
      s.policy != WaitPolicy::Hybrid)
    fail(ErrorKind::InvalidArgument,
         "threads: wait policy must be spin, passive or hybrid (auto is resolved by the engine)");
  if (s.spin_us < 0 || s.spin_us > kMaxSpinUs)
    fail(ErrorKind::InvalidArgument, "threads: spin_us must be between 0 and " +
                                         std::to_string(kMaxSpinUs) + " microseconds, got " +
                                         std::to_string(s.spin_us));
}

}  // namespace

struct ThreadPool::Impl {
  // --- settings -------------------------------------------------------------------------
  // policy and spin_us are read by waiting threads on every check, so a configure() is
  // seen at once, even by a worker that is spinning right now.
  std::atomic<int> policy{static_cast<int>(WaitPolicy::Hybrid)};
  std::atomic<int64_t> spin_us{100};
  // Written only under dispatch_mu with the workers stopped; atomic so size() needs no
  // lock (it may be called from inside a region, where dispatch_mu is held).
  std::atomic<int> n_threads{1};

  // One caller at a time (and configure() excludes callers).
  std::mutex dispatch_mu;

  // --- the published job ----------------------------------------------------------------
  // The job's fields share the cache line of `word`: the one line a waiting worker polls
  // brings it the whole job. The counters the team writes during a region live on lines
  // of their own, so writing them does not evict the job line from the pollers.
  alignas(64) std::atomic<uint64_t> word{0};  // (generation << 16) | active members
  RegionFn fn{no_region};                      // plain fields, written before `word` is
  int64_t n = 0;                               // released and read after it is acquired
  int64_t grain = 1;
  std::atomic<bool> failed{false};             // an fn threw: stop claiming chunks
  alignas(64) std::atomic<int64_t> next{0};    // first index not yet claimed
  alignas(64) std::atomic<int> pending{0};     // participating workers not yet done
  std::atomic<bool> caller_sleeping{false};
  alignas(64) std::mutex error_mu;
  std::exception_ptr error;  // the first exception of the region

  alignas(64) std::atomic<int> scope_depth{0};  // open ComputeScopes
  std::atomic<int> starved_waits{0};            // in this computation
  std::atomic<bool> oversubscribed{false};      // kStarvedStrikes waits lost their core: no
                                                // spinning until the computation ends
  std::atomic<bool> stop{false};                // workers exit (resize, destruction)

  std::mutex sleep_mu;  // "new work" sleepers
  std::condition_variable sleep_cv;
  std::atomic<int> sleepers{0};
  std::mutex done_mu;  // the caller sleeping until the region is done
  std::condition_variable done_cv;

  std::vector<std::thread> workers;  // members 1 .. n_threads-1

  // --- stats (relaxed counters; only read for reporting) -----------------------------------
  std::atomic<uint64_t> st_regions{0}, st_inline{0}, st_sleeps{0}, st_caller_sleeps{0},
      st_scopes{0}, st_starved{0};

  void note_starved() {
    st_starved.fetch_add(1, std::memory_order_relaxed);
    if (starved_waits.fetch_add(1, std::memory_order_relaxed) + 1 >= kStarvedStrikes)
      oversubscribed.store(true, std::memory_order_relaxed);
  }

  WaitPolicy current_policy() const {
    return static_cast<WaitPolicy>(policy.load(std::memory_order_relaxed));
  }

  // Claims chunks until none is left (or an fn threw). Chunks are handed out dynamically
  // (not one fixed chunk per member): a worker that wakes late or is preempted then costs
  // the region nothing, since the members already running take its share.
  void run_chunks(int member) {
    const RegionFn f = fn;
    const int64_t total = n, g = grain;
    for (;;) {
      if (failed.load(std::memory_order_relaxed)) return;
      const int64_t b = next.fetch_add(g, std::memory_order_relaxed);
      if (b >= total) return;
      try {
        f(b, b + std::min(g, total - b), member);
      } catch (...) {
        std::lock_guard<std::mutex> lk(error_mu);
        if (!error) error = std::current_exception();
        failed.store(true, std::memory_order_relaxed);
        return;
      }
    }
  }

  // A worker waits for the word to move past `seen` (or for stop). Spins only inside a
  // ComputeScope and only under Spin (unbounded) or Hybrid (spin_us); otherwise sleeps.
  // The policy, spin_us and the scope are re-read at every check, so a configure() or the
  // end of the computation reaches a spinning worker within microseconds.
  uint64_t wait_for_work(uint64_t seen) {
    if (current_policy() != WaitPolicy::Passive &&
        scope_depth.load(std::memory_order_relaxed) > 0 &&
        !oversubscribed.load(std::memory_order_relaxed)) {
      SpinClock clock;
      for (uint32_t i = 1;; ++i) {
        const uint64_t w = word.load(std::memory_order_acquire);
        if (w != seen) return w;
        cpu_pause();
        if (i % kCheckEvery != 0) continue;
        if (stop.load(std::memory_order_relaxed)) return w;
        const Clock::duration spun = clock.tick();
        if (clock.starved) {
          note_starved();
          break;
        }
        if (scope_depth.load(std::memory_order_relaxed) == 0) break;  // computation over: park
        if (oversubscribed.load(std::memory_order_relaxed)) break;    // another wait starved
        const WaitPolicy pol = current_policy();
        if (pol == WaitPolicy::Passive) break;
        if (pol == WaitPolicy::Hybrid && spun >= std::chrono::microseconds(spin_us.load()))
          break;
      }
    }
    std::unique_lock<std::mutex> lk(sleep_mu);
    sleepers.fetch_add(1, std::memory_order_seq_cst);
    uint64_t w;
    bool counted = false;
    while ((w = word.load(std::memory_order_seq_cst)) == seen &&
           !stop.load(std::memory_order_relaxed)) {
      if (!counted) {
        st_sleeps.fetch_add(1, std::memory_order_relaxed);
        counted = true;
      }
      sleep_cv.wait(lk);
    }
    sleepers.fetch_sub(1, std::memory_order_relaxed);
    return w;
  }

  void worker_main(int member, uint64_t seen) {
    tl_current_pool = this;
    tl_member = member;
#if defined(__linux__)
    char name[16];
    std::snprintf(name, sizeof name, "colibri-w%d", member);
    pthread_setname_np(pthread_self(), name);
#endif
    for (;;) {
      const uint64_t w = wait_for_work(seen);
      if (stop.load(std::memory_order_relaxed)) return;
      seen = w;
      if (static_cast<uint64_t>(member) >= (w & kMembersMask)) continue;  // not needed
      run_chunks(member);
      if (pending.fetch_sub(1, std::memory_order_seq_cst) == 1 &&
          caller_sleeping.load(std::memory_order_seq_cst)) {
        std::lock_guard<std::mutex> lk(done_mu);
        done_cv.notify_one();
      }
    }
  }

  // The caller, after its own chunks, waits for the participating workers. Its wait
  // follows the policy too: a passive pool must not burn the caller's core either.
  void wait_for_team() {
    if (pending.load(std::memory_order_acquire) == 0) return;
    const WaitPolicy pol = current_policy();
    if (pol != WaitPolicy::Passive && !oversubscribed.load(std::memory_order_relaxed)) {
      const bool bounded = pol == WaitPolicy::Hybrid;
      const auto limit = std::chrono::microseconds(spin_us.load(std::memory_order_relaxed));
      SpinClock clock;
      for (uint32_t i = 1;; ++i) {
        if (pending.load(std::memory_order_acquire) == 0) return;
        cpu_pause();
        if (i % kCheckEvery != 0) continue;
        const Clock::duration spun = clock.tick();
        if (clock.starved) {
          note_starved();
          break;
        }
        if (bounded && spun >= limit) break;
      }
    }
    std::unique_lock<std::mutex> lk(done_mu);
    caller_sleeping.store(true, std::memory_order_seq_cst);
    if (pending.load(std::memory_order_seq_cst) != 0) {
      st_caller_sleeps.fetch_add(1, std::memory_order_relaxed);
      done_cv.wait(lk, [&] { return pending.load(std::memory_order_seq_cst) == 0; });
    }
    caller_sleeping.store(false, std::memory_order_relaxed);
  }

  void stop_workers() {
    {
      std::lock_guard<std::mutex> lk(sleep_mu);
      stop.store(true, std::memory_order_seq_cst);
    }
    sleep_cv.notify_all();
    for (auto& t : workers) t.join();
    workers.clear();
    stop.store(false, std::memory_order_relaxed);
  }

  void start_workers(int team) {
    const uint64_t seen = word.load(std::memory_order_relaxed);
    try {
      workers.reserve(static_cast<size_t>(team - 1));
      for (int m = 1; m < team; ++m) workers.emplace_back([this, m, seen] { worker_main(m, seen); });
    } catch (const std::system_error& e) {
      // The OS refused a thread: keep a valid pool (the caller alone) and say so.
      stop_workers();
      n_threads = 1;
      fail(ErrorKind::InvalidArgument, "threads: could not start " + std::to_string(team - 1) +
                                           " worker threads (" + e.what() +
                                           "); the pool now runs on the calling thread only");
    }
    n_threads = team;
  }

  // Runs [0, n) in grain-sized chunks on the calling thread.
  static void run_inline(int64_t total, int64_t g, RegionFn f, int member) {
    for (int64_t b = 0; b < total; b += g) f(b, b + std::min(g, total - b), member);
  }
};

ThreadPool::ThreadPool(const ThreadSettings& settings) : impl_(new Impl) {
  try {
    configure(settings);
  } catch (...) {
    delete impl_;
    throw;
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> g(impl_->dispatch_mu);
    impl_->stop_workers();
  }
  delete impl_;
}

void ThreadPool::configure(const ThreadSettings& settings) {
  validate(settings);
  Impl* p = impl_;
  if (tl_current_pool == p)
    fail(ErrorKind::InvalidArgument,
         "threads: configure() was called from inside one of this pool's parallel regions");
  std::lock_guard<std::mutex> g(p->dispatch_mu);
  p->policy.store(static_cast<int>(settings.policy), std::memory_order_relaxed);
  p->spin_us.store(settings.spin_us, std::memory_order_relaxed);
  const bool team_ok = p->workers.size() + 1 == static_cast<size_t>(p->n_threads.load());
  if (settings.n_threads != p->n_threads.load() || !team_ok) {
    p->stop_workers();
    p->n_threads = 1;
    p->start_workers(settings.n_threads);
  }
}

ThreadSettings ThreadPool::settings() const {
  ThreadSettings s;
  s.n_threads = size();
  s.policy = impl_->current_policy();
  s.spin_us = impl_->spin_us.load(std::memory_order_relaxed);
  return s;
}

int ThreadPool::size() const {
  return impl_->n_threads.load(std::memory_order_relaxed);
}

void ThreadPool::run_region(int64_t n, int64_t grain, RegionFn fn) {
  if (n <= 0) return;
  Impl* p = impl_;
  if (tl_current_pool == p) {  // nested call from inside one of our regions
    Impl::run_inline(n, grain > 0 ? std::min(grain, n) : n, fn, tl_member);
    p->st_inline.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  std::lock_guard<std::mutex> g(p->dispatch_mu);
  const int team = p->n_threads.load(std::memory_order_relaxed);
  if (grain <= 0) grain = std::max<int64_t>(1, (n + 4 * team - 1) / (4 * team));
  grain = std::min(grain, n);
  const int64_t chunks = (n + grain - 1) / grain;
  const int active = static_cast<int>(std::min<int64_t>(team, chunks));

  struct CurrentPool {  // restores tl_current_pool on every exit path (the caller may
                       // itself be a worker of another pool)
    explicit CurrentPool(const void* pool) : saved(tl_current_pool), saved_member(tl_member) {
      tl_current_pool = pool;
      tl_member = 0;
    }
    ~CurrentPool() {
      tl_current_pool = saved;
      tl_member = saved_member;
    }
    const void* saved;
    int saved_member;
  };

  if (active <= 1) {
    CurrentPool cur(p);
    Impl::run_inline(n, grain, fn, 0);
    p->st_inline.fetch_add(1, std::memory_order_relaxed);
    return;
  }

  p->fn = fn;
  p->n = n;
  p->grain = grain;
  p->next.store(0, std::memory_order_relaxed);
  p->failed.store(false, std::memory_order_relaxed);
  p->error = nullptr;
  p->pending.store(active - 1, std::memory_order_relaxed);
  const uint64_t gen = (p->word.load(std::memory_order_relaxed) >> 16) + 1;
  p->word.store((gen << 16) | static_cast<uint64_t>(active), std::memory_order_seq_cst);
  if (p->sleepers.load(std::memory_order_seq_cst) > 0) {
    { std::lock_guard<std::mutex> lk(p->sleep_mu); }  // a sleeper is in wait() or will see the word
    p->sleep_cv.notify_all();
  }
  {
    CurrentPool cur(p);
    p->run_chunks(0);  // the caller's exceptions are captured too: workers still use fn
  }
  p->wait_for_team();
  p->st_regions.fetch_add(1, std::memory_order_relaxed);
  if (p->error) {
    std::exception_ptr e = p->error;
    p->error = nullptr;
    std::rethrow_exception(e);
  }
}

ThreadPool::ComputeScope::ComputeScope(ThreadPool& pool) : pool_(pool) {
  if (pool_.impl_->scope_depth.fetch_add(1, std::memory_order_relaxed) == 0) {
    pool_.impl_->st_scopes.fetch_add(1, std::memory_order_relaxed);
    pool_.impl_->starved_waits.store(0, std::memory_order_relaxed);  // spinning may pay again
    pool_.impl_->oversubscribed.store(false, std::memory_order_relaxed);
  }
}

ThreadPool::ComputeScope::~ComputeScope() {
  // Spinning workers notice within kCheckEvery pauses and park on the condvar.
  pool_.impl_->scope_depth.fetch_sub(1, std::memory_order_release);
}

ThreadPool::IdleScope::IdleScope(ThreadPool& pool)
    : pool_(pool), depth_(pool.impl_->scope_depth.exchange(0, std::memory_order_release)) {}

ThreadPool::IdleScope::~IdleScope() {
  pool_.impl_->scope_depth.store(depth_, std::memory_order_relaxed);
}

ThreadPoolStats ThreadPool::stats() const {
  const Impl* p = impl_;
  ThreadPoolStats s;
  s.regions = p->st_regions.load(std::memory_order_relaxed);
  s.inline_regions = p->st_inline.load(std::memory_order_relaxed);
  s.sleeps = p->st_sleeps.load(std::memory_order_relaxed);
  s.caller_sleeps = p->st_caller_sleeps.load(std::memory_order_relaxed);
  s.scopes = p->st_scopes.load(std::memory_order_relaxed);
  s.starved = p->st_starved.load(std::memory_order_relaxed);
  return s;
}

void ThreadPool::reset_stats() {
  Impl* p = impl_;
  p->st_regions.store(0);
  p->st_inline.store(0);
  p->st_sleeps.store(0);
  p->st_caller_sleeps.store(0);
  p->st_scopes.store(0);
  p->st_starved.store(0);
}

}  // namespace colibri
