// The I/O workers ("PIPE"): a bounded pool of threads that read extents into caller-owned
// aligned slabs while the compute team works on experts already in RAM.
//
//   Ticket t = pool.submit({extent, slab, capacity});   // never blocks on I/O
//   ...
//   pool.wait(t);      // blocks for this read only; bytes at slab + data_offset(extent)
//   pool.cancel(t);    // a prefetch no longer wanted: drops it if not started, never blocks
//
// Why this shape:
// - Slabs are owned by the caller (the expert cache), so every byte is in its RAM budget
//   and the pool allocates nothing per read.
// - wait() on a read that no worker has started yet runs it on the waiting thread: the
//   compute side waits only for the expert it needs next, never behind queued prefetches.
//   With workers = 0 this is the only way reads run: synchronous reads on the caller, and
//   a prefetch that is cancelled before anyone waits for it costs nothing.
// - Workers sleep on a condition variable when the queue is empty (no spinning): they
//   must never take CPU from the compute team, which is the bottleneck when not disk-bound.
// - A failed read delivers its Error to the waiter (rethrown by wait()); the worker goes on
//   with the next request, so one bad extent does not stop the model serving.
//
// Contract: every ticket is either waited for once or cancelled successfully; a slab may
// be reused or freed only after that (cancel() returns false for a read already started:
// the caller must still wait() before touching the slab; done() tells without blocking).
// All methods are thread-safe.
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "io/activity_clock.hpp"
#include "io/direct_reader.hpp"

namespace colibri {

constexpr int kMaxIoWorkers = 64;

using Ticket = uint64_t;

struct ReadRequest {
  Extent extent;
  uint8_t* slab = nullptr;    // kDirectAlign-aligned, caller-owned, >= slab_bytes(extent)
  std::size_t capacity = 0;   // bytes at slab
  // When set, the worker checks zlib's crc32 of the wanted bytes after the read and
  // delivers Error(Io) on a mismatch (off the compute thread, like the read itself).
  bool check_crc32 = false;
  uint32_t crc32 = 0;
  // Queued ahead of every non-urgent read (a demand read overtakes queued prefetches).
  bool urgent = false;
};

struct ReadPoolStats {
  uint64_t submitted = 0;
  uint64_t reads = 0;          // reads finished successfully
  uint64_t bytes = 0;          // wanted bytes of those reads (not the aligned padding)
  uint64_t errors = 0;         // reads that ended in an Error (delivered to their waiter)
  uint64_t checksum_failures = 0;  // of the errors, crc32 mismatches
  double read_seconds = 0;     // summed over reads (exceeds wall time with several workers)
  uint64_t waits = 0;          // wait() calls
  double wait_seconds = 0;     // time callers spent inside wait(), inline reads included
  uint64_t inline_reads = 0;   // reads run by the waiting thread (not started when waited)
  uint64_t cancelled = 0;      // reads dropped before they started (cancel() or shutdown)
  uint64_t direct_reads = 0;   // reads whose bytes came through O_DIRECT
  uint64_t buffered_reads = 0; // reads done with buffered pread (direct off or fallback)
  uint64_t fallbacks = 0;      // files that asked for O_DIRECT and fell back (never reset)
  // The device cap (ReadPool::set_max_in_flight): reads that found it full and waited for
  // a read to end before starting (a worker's or a waiter's), and wall seconds with at
  // least one read on the device (bytes / busy_seconds: GB/s while reading).
  uint64_t cap_waits = 0;
  double busy_seconds = 0;
};

// One finished read as the pool saw it (ReadPool::start_trace): when it was queued, when a
// worker (or its waiter, inline) started it and when it ended, in seconds on the steady
// clock (CLOCK_MONOTONIC on Linux: Python's time.monotonic(), perf -k CLOCK_MONOTONIC). What benchmarks compare between a decode and the disk
// bench: reads in flight over time, gaps with none, queueing of demand reads behind others.
struct ReadTraceRecord {
  double submitted = 0, started = 0, finished = 0;
  uint64_t offset = 0, bytes = 0;  // the extent (wanted bytes, not the aligned span)
  int32_t file = 0;
  bool urgent = false;       // a demand read (ReadRequest::urgent)
  bool inline_read = false;  // run by its waiter: no worker had started it
  bool failed = false;
};

// The order in which workers take queued reads: every demand read (urgent) before any
// prefetch, first in first out within each class, so a read the compute needs now never
// queues behind guesses. Two FIFOs, O(1) push and pop. Entries may be stale (cancelled or
// run inline since): the pool skips them when popped.
class ReadQueue {
 public:
  void push(Ticket t, bool urgent) { (urgent ? demand_ : prefetch_).push_back(t); }
  bool empty() const { return demand_.empty() && prefetch_.empty(); }
  std::size_t size() const { return demand_.size() + prefetch_.size(); }
  // The next ticket to run (precondition: !empty()).
  Ticket pop() {
    std::deque<Ticket>& q = demand_.empty() ? prefetch_ : demand_;
    const Ticket t = q.front();
    q.pop_front();
    return t;
  }
  void clear() {
    demand_.clear();
    prefetch_.clear();
  }

 private:
  std::deque<Ticket> demand_, prefetch_;
};

class ReadPool {
 public:
  // workers in [0, kMaxIoWorkers]; direct asks for O_DIRECT (with fallback per file).
  ReadPool(const std::vector<std::string>& paths, int workers, bool direct, IoFault fault = IoFault::None);
  ~ReadPool();  // shutdown()
  ReadPool(const ReadPool&) = delete;
  ReadPool& operator=(const ReadPool&) = delete;

  int workers() const { return static_cast<int>(threads_.size()); }
  // Reads on the device at once (inside the reader's pread, not counting the crc32 check
  // that follows it), 0 = no cap (workers + waiters reading inline, as many as there are).
  // Separate from workers(): 2 workers with a cap of 1 keep one read on the device while
  // the other checks the last one's crc32. A waiter whose read has not started goes ahead
  // of every worker when the cap frees a place (demand first). Takes effect for reads
  // started from now on; thread-safe.
  void set_max_in_flight(int cap);
  int max_in_flight() const;
  const DirectReader& reader() const { return reader_; }
  // The clock whose "disk" bit follows this pool's reads on the device (null: none); the
  // caller keeps it alive while the pool runs. Set before reads start.
  void set_activity(ActivityClock* clock);
  void set_fault(IoFault f) { reader_.set_fault(f); }

  // Queues a read. Validates the slab (Error(InvalidArgument)) and the file index here,
  // so a bad request fails at the call that made it. Error(InvalidArgument) after shutdown.
  Ticket submit(const ReadRequest& r);
  // Blocks until the read of `t` is done (running it here if no worker has started it),
  // then retires the ticket. Rethrows the read's Error. Error(InvalidArgument) for a ticket
  // that is not pending (never submitted, already waited, cancelled) or was dropped by
  // shutdown.
  void wait(Ticket t);
  // Drops a read that has not started; true if dropped (the ticket is retired). False if
  // it is running or done (wait() for it) or unknown. Never blocks on I/O.
  bool cancel(Ticket t);
  // True when wait(t) would not block (the read finished or failed). False for unknown.
  bool done(Ticket t) const;
  // Tickets submitted and not yet retired.
  std::size_t pending() const;
  // Reads queued or running (not finished): what the device has in hand or will get next.
  // The expert store compares it with workers() to prefetch only into idle I/O capacity.
  std::size_t in_flight() const;

  ReadPoolStats stats() const;
  void reset_stats();

  // Records every read that finishes from now on (at most max_records; 0 stops
  // recording), dropping an earlier trace. Cheap: one record appended under the lock the
  // pool takes anyway. trace() returns the records so far, in finishing order.
  void start_trace(std::size_t max_records);
  std::vector<ReadTraceRecord> trace() const;

  // Stops the workers: reads not yet started are dropped (their waiters get an error),
  // reads in progress finish. Idempotent; the destructor calls it.
  void shutdown();

 private:
  enum class State { Queued, Running, Done, Dropped };
  struct Slot {
    ReadRequest req;
    State state = State::Queued;
    bool waited = false;         // a wait() is in progress (a second one is refused)
    bool inline_read = false;    // run by its waiter (trace)
    bool cap_blocked = false;    // its waiter waits for a place under the device cap
    std::chrono::steady_clock::time_point submitted, started;  // trace
    std::exception_ptr error;
    std::condition_variable cv;  // per slot, so a waiter wakes for its own read only
  };

  void worker_loop();
  // Under mu_: whether a worker may start a read now (the cap leaves a place that no
  // waiter is waiting for), and the bookkeeping when a read enters / leaves the device.
  bool worker_may_start() const;
  void enter_device();
  void leave_device(bool wake_worker);
  // Runs the read of `slot` (state already Running) without the lock; relocks to finish.
  void run(Slot& slot, std::unique_lock<std::mutex>& lock);

  DirectReader reader_;
  mutable std::mutex mu_;
  std::condition_variable work_cv_;
  // Nodes of an unordered_map are stable, so a Slot& stays valid until its ticket is
  // erased, which only the waiter (after Done/Dropped) or cancel() (while Queued) do.
  std::unordered_map<Ticket, Slot> slots_;
  // Queued tickets for the workers, demand reads first. cancel() and inline reads leave
  // stale entries behind (O(1) cancel); workers skip tickets whose slot is gone or no
  // longer Queued.
  ReadQueue queue_;
  std::size_t unfinished_ = 0;  // slots Queued or Running
  int cap_ = 0;                 // set_max_in_flight (0: none)
  int on_device_ = 0;           // reads inside reader_.read() now
  int cap_waiters_ = 0;         // waiters whose queued read waits for a place under the cap
  std::chrono::steady_clock::time_point busy_since_;  // when on_device_ went 0 -> 1
  ActivityClock* activity_ = nullptr;  // set_activity
  Ticket next_ = 1;
  bool stop_ = false;
  ReadPoolStats stats_;
  std::size_t trace_max_ = 0;  // 0: not tracing
  std::vector<ReadTraceRecord> trace_;
  std::vector<std::thread> threads_;
};

}  // namespace colibri
