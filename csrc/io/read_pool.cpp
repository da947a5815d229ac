#include "io/read_pool.hpp"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>

#include "common/errors.hpp"
#include "io/crc32.hpp"

namespace colibri {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Under a real-time policy (SCHED_FIFO / SCHED_RR, e.g. a process started with chrt -f),
// a worker inherits the compute team's priority, and a thread woken by its read's
// completion then waits for a core until a matmul region ends: with one read in flight
// the device idles that long. One step above the creating thread, the worker hands the
// device its next read at once (it needs little CPU: a pread, bookkeeping, the crc32
// check). Under SCHED_OTHER nothing changes (the scheduler favours sleepers anyway);
// where the call is not permitted it is ignored.
void raise_above_creator() {
  int policy = 0;
  sched_param param{};
  if (pthread_getschedparam(pthread_self(), &policy, &param) != 0) return;
  if (policy != SCHED_FIFO && policy != SCHED_RR) return;
  if (param.sched_priority >= sched_get_priority_max(policy)) return;
  ++param.sched_priority;
  (void)pthread_setschedparam(pthread_self(), policy, &param);
}

}  // namespace

ReadPool::ReadPool(const std::vector<std::string>& paths, int workers, bool direct, IoFault fault)
    : reader_(paths, direct, fault) {
  if (workers < 0 || workers > kMaxIoWorkers)
    fail(ErrorKind::InvalidArgument,
         "I/O workers must be in [0, " + std::to_string(kMaxIoWorkers) + "], got " + std::to_string(workers));
  threads_.reserve(static_cast<std::size_t>(workers));
  try {
    for (int i = 0; i < workers; ++i) threads_.emplace_back([this] { worker_loop(); });
  } catch (...) {
    shutdown();  // std::system_error from thread creation: join the ones that started
    throw;
  }
}

ReadPool::~ReadPool() { shutdown(); }

void ReadPool::shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stop_) {
      stop_ = true;
      for (auto& [ticket, slot] : slots_) {
        if (slot.state != State::Queued) continue;
        slot.state = State::Dropped;
        --unfinished_;
        ++stats_.cancelled;
        slot.cv.notify_all();
      }
      queue_.clear();
    }
  }
  work_cv_.notify_all();
  for (auto& t : threads_)
    if (t.joinable()) t.join();
}

Ticket ReadPool::submit(const ReadRequest& r) {
  const Extent& e = r.extent;
  reader_.path(e.file);  // range check now rather than in a worker
  if (reinterpret_cast<uintptr_t>(r.slab) % kDirectAlign != 0 || r.slab == nullptr)
    fail(ErrorKind::InvalidArgument, "read slab must be a non-null " + std::to_string(kDirectAlign) +
                                         "-byte aligned buffer");
  if (r.capacity < slab_bytes(e))
    fail(ErrorKind::InvalidArgument, "read slab of " + std::to_string(r.capacity) + " bytes cannot hold " +
                                         std::to_string(e.length) + " bytes at offset " +
                                         std::to_string(e.offset) + " (needs " + std::to_string(slab_bytes(e)) + ")");
  Ticket t;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) fail(ErrorKind::InvalidArgument, "read pool is shut down");
    t = next_++;
    Slot& s = slots_[t];
    s.req = r;
    if (trace_max_ > 0) s.submitted = std::chrono::steady_clock::now();
    ++stats_.submitted;
    ++unfinished_;
    // With no workers nothing would ever pop the queue: the read runs in wait().
    if (threads_.empty()) return t;
    queue_.push(t, r.urgent);  // a demand read goes ahead of every queued prefetch
  }
  work_cv_.notify_one();
  return t;
}

void ReadPool::run(Slot& slot, std::unique_lock<std::mutex>& lock) {
  const ReadRequest req = slot.req;
  enter_device();
  lock.unlock();
  std::exception_ptr error;
  ReadOutcome outcome;
  bool crc_failed = false;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    outcome = reader_.read(req.extent, req.slab, req.capacity);
  } catch (...) {
    // Error(Io) mostly; bad_alloc from building a message too. Never let it escape a
    // worker (std::terminate): the waiter rethrows it.
    error = std::current_exception();
  }
  lock.lock();
  // The device is free for the next read before the crc32 pass: with a cap, another
  // worker starts it while this one checks (a worker with nothing to check goes on to
  // the next read itself, no wake-up needed; a waiter's inline read wakes one).
  const bool check = req.check_crc32 && !error;
  leave_device(check || slot.inline_read);
  if (check) {
    lock.unlock();
    try {
      const uint32_t got = crc32(0, req.slab + data_offset(req.extent), req.extent.length);
      if (got != req.crc32) {
        crc_failed = true;
        char hex[48];
        std::snprintf(hex, sizeof hex, "expected crc32 %08x, got %08x", req.crc32, got);
        fail(ErrorKind::Io, "checksum mismatch in " + reader_.path(req.extent.file) + " at offset " +
                                std::to_string(req.extent.offset) + " (" + std::to_string(req.extent.length) +
                                " bytes): " + hex + "; the file is damaged: re-convert or re-download it");
      }
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
  }
  const double secs = seconds_since(t0);
  stats_.read_seconds += secs;
  if (error) {
    ++stats_.errors;
    if (crc_failed) ++stats_.checksum_failures;
  } else {
    ++stats_.reads;
    stats_.bytes += req.extent.length;
    ++(outcome.direct ? stats_.direct_reads : stats_.buffered_reads);
  }
  if (trace_max_ > 0 && trace_.size() < trace_max_) {
    const auto since = [](std::chrono::steady_clock::time_point t) {
      return std::chrono::duration<double>(t.time_since_epoch()).count();
    };
    ReadTraceRecord rec;
    rec.submitted = since(slot.submitted);
    rec.started = since(t0);
    rec.finished = rec.started + secs;
    rec.offset = req.extent.offset;
    rec.bytes = req.extent.length;
    rec.file = req.extent.file;
    rec.urgent = req.urgent;
    rec.inline_read = slot.inline_read;
    rec.failed = static_cast<bool>(error);
    trace_.push_back(rec);
  }
  slot.error = error;
  slot.state = State::Done;
  --unfinished_;
  slot.cv.notify_all();
}

void ReadPool::worker_loop() {
  raise_above_creator();
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    // Sleep, not spin, while there is nothing to read (see the header).
    work_cv_.wait(lock, [this] { return stop_ || (!queue_.empty() && worker_may_start()); });
    if (stop_) return;  // shutdown() already dropped every queued read
    const Ticket t = queue_.pop();
    auto it = slots_.find(t);
    if (it == slots_.end() || it->second.state != State::Queued) continue;  // cancelled / stolen
    it->second.state = State::Running;
    run(it->second, lock);
  }
}

void ReadPool::wait(Ticket t) {
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(mu_);
  auto it = slots_.find(t);
  if (it == slots_.end())
    fail(ErrorKind::InvalidArgument, "read ticket " + std::to_string(t) +
                                         " is not pending (never submitted, already waited for, or cancelled)");
  Slot& slot = it->second;
  if (slot.waited)
    fail(ErrorKind::InvalidArgument, "read ticket " + std::to_string(t) + " is already being waited for");
  slot.waited = true;
  if (slot.state == State::Queued && cap_ > 0 && on_device_ >= cap_) {
    // The device cap is full: wait for a place, ahead of every worker (worker_may_start
    // counts this waiter), unless a worker starts this very read meanwhile.
    slot.cap_blocked = true;
    ++cap_waiters_;
    ++stats_.cap_waits;
    slot.cv.wait(lock, [&] { return slot.state != State::Queued || cap_ == 0 || on_device_ < cap_; });
    slot.cap_blocked = false;
    --cap_waiters_;
  }
  if (slot.state == State::Queued) {
    // Nobody has started it: read it here instead of waiting behind queued prefetches.
    slot.state = State::Running;
    slot.inline_read = true;
    ++stats_.inline_reads;
    run(slot, lock);
  } else {
    slot.cv.wait(lock, [&] { return slot.state == State::Done || slot.state == State::Dropped; });
  }
  const bool dropped = slot.state == State::Dropped;
  std::exception_ptr error = slot.error;
  slots_.erase(it);
  ++stats_.waits;
  stats_.wait_seconds += seconds_since(t0);
  lock.unlock();
  if (dropped) fail(ErrorKind::InvalidArgument, "read ticket " + std::to_string(t) + " was dropped: the read pool shut down before it started");
  if (error) std::rethrow_exception(error);
}

bool ReadPool::cancel(Ticket t) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = slots_.find(t);
  if (it == slots_.end() || it->second.state != State::Queued) return false;
  slots_.erase(it);  // its queue entry becomes stale; a worker skips it
  --unfinished_;
  ++stats_.cancelled;
  return true;
}

bool ReadPool::done(Ticket t) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = slots_.find(t);
  return it != slots_.end() && (it->second.state == State::Done || it->second.state == State::Dropped);
}

std::size_t ReadPool::pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  return slots_.size();
}

std::size_t ReadPool::in_flight() const {
  std::lock_guard<std::mutex> lock(mu_);
  return unfinished_;
}

bool ReadPool::worker_may_start() const { return cap_ <= 0 || on_device_ + cap_waiters_ < cap_; }

void ReadPool::enter_device() {
  if (on_device_++ == 0) {
    busy_since_ = std::chrono::steady_clock::now();
    if (activity_) activity_->set_disk(true);
  }
}

void ReadPool::leave_device(bool wake_worker) {
  if (--on_device_ == 0) {
    stats_.busy_seconds += seconds_since(busy_since_);
    if (activity_) activity_->set_disk(false);
  }
  if (cap_ <= 0) return;
  if (cap_waiters_ > 0) {
    for (auto& [ticket, slot] : slots_)
      if (slot.cap_blocked) slot.cv.notify_all();
  } else if (wake_worker) {
    work_cv_.notify_one();  // a crc32 check or an inline read ends here: a worker takes the place
  }
}

void ReadPool::set_max_in_flight(int cap) {
  if (cap < 0 || cap > kMaxIoWorkers)
    fail(ErrorKind::InvalidArgument, "reads in flight must be in [0, " + std::to_string(kMaxIoWorkers) +
                                         "] (0: no cap), got " + std::to_string(cap));
  {
    std::lock_guard<std::mutex> lock(mu_);
    cap_ = cap;
    for (auto& [ticket, slot] : slots_)
      if (slot.cap_blocked) slot.cv.notify_all();
  }
  work_cv_.notify_all();
}

void ReadPool::set_activity(ActivityClock* clock) {
  std::lock_guard<std::mutex> lock(mu_);
  activity_ = clock;
  if (activity_) activity_->set_disk(on_device_ > 0);
}

int ReadPool::max_in_flight() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cap_;
}

ReadPoolStats ReadPool::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  ReadPoolStats s = stats_;
  s.fallbacks = reader_.fallbacks();
  return s;
}

void ReadPool::reset_stats() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_ = ReadPoolStats{};
}

void ReadPool::start_trace(std::size_t max_records) {
  std::lock_guard<std::mutex> lock(mu_);
  trace_.clear();
  trace_.shrink_to_fit();
  trace_max_ = max_records;
  // Reads queued before the trace started count from its start.
  const auto now = std::chrono::steady_clock::now();
  for (auto& [ticket, slot] : slots_) slot.submitted = std::max(slot.submitted, now);
  trace_.reserve(std::min<std::size_t>(max_records, 1 << 16));
}

std::vector<ReadTraceRecord> ReadPool::trace() const {
  std::lock_guard<std::mutex> lock(mu_);
  return trace_;
}

}  // namespace colibri
