// The expert store: routed experts stay on disk and come into a RAM-budgeted cache when a
// layer routes to them (docs/streaming.md: one RAM budget, placement never changes tokens).
//
// Memory: one anonymous mapping of `slots x slot_bytes`, sized by the engine's budget.
// Each slot holds one expert (gate, up, down) exactly as its reads put it there: the slots
// are the O_DIRECT slabs, so no byte is copied after a read and nothing else is allocated
// per read. Pages of slots never used are never touched (not resident).
//
// Reads: one per expert where the bytes are contiguous (the native container's blob; a
// Hugging Face shard usually keeps an expert's three matrices close together), otherwise
// one per matrix (a GGUF stacks each projection over all experts). They go through the
// ReadPool (io/read_pool.hpp): with workers > 0 they run while the compute team works on
// experts already in RAM; with workers = 0 they run on the compute thread when needed.
//
// The protocol of one MoE layer (Engine::moe_block, caller thread only):
//   settle(layer, routed)        bookkeeping of the lookahead made for this layer
//   request(layer, e) ...        for each routed expert while there is room: hits hold
//                                their slot, misses get a slot and start their reads
//   prefetch(layer', e) ...      predicted experts of the next MoE layer (best effort)
//   wait(layer, e) -> views      the compute waits only for the expert it needs next
//   release(layer, e)            after computing with it
// abort() after an exception puts the store back in a consistent state (every read
// waited for or cancelled, no holds), so the model keeps serving.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "io/depth_curve.hpp"
#include "io/read_pool.hpp"
#include "model/expert_cache.hpp"
#include "model/matmul.hpp"
#include "model/model_spec.hpp"
#include "model/prefetch_governor.hpp"

namespace colibri {

enum class ChecksumMode : int {
  Off = 0,     // never verify
  First = 1,   // verify each blob's first read, and again after its file changed

  Always = 2,  // verify every read
};

constexpr int kAutoWorkers = -1;
constexpr int kAutoInFlight = -1;

struct StoreSettings {
  int64_t cache_bytes = 0;  // slots = cache_bytes / slot_bytes (at least 1 is needed)
  int workers = 2;          // I/O threads; 0 = synchronous reads on the compute thread;
                            // kAutoWorkers = the knee of a queue-depth curve measured at configure
  // Reads on the device at once (ReadPool::set_max_in_flight), apart from the workers:
  // 0 = no cap (workers + an inline demand read); kAutoInFlight = the depth of the
  // queue-depth curve measured at configure with the best bandwidth (ties within 3% go to
  // the smaller depth).
  int max_in_flight = 0;
  bool direct = true;       // O_DIRECT with fallback to buffered reads
  bool prefetch = true;     // lookahead: next layer's router on this layer's input
  bool first_layer_guess = true;  // with prefetch: the first MoE layer's experts guessed
                                  // just before its attention (Engine::guess_first_layer)
  // Both prefetch governors' threshold: a lookahead (or first-layer guess) pauses while
  // its window's accuracy is below it and resumes at it + PrefetchGovernor::kHysteresis
  // (at most 1). 0: never pauses.
  double prefetch_min_accuracy = PrefetchGovernor::kOffBelow;
  CachePolicy policy = CachePolicy::Lfru;
  double pin_fraction = 0.5;  // Pinned: share of the slots learned pins may hold
  ChecksumMode checksums = ChecksumMode::First;
};

// Where one expert's bytes are, as the source describes it (Python builds these).
struct ExpertSource {
  int64_t layer = 0;
  int64_t expert = 0;
  TensorSpec gate, up, down;  // one extent each
  Extent blob{};              // the native container's blob holding all three (length 0: none)
  bool has_crc32 = false;     // blob's crc32 (native container)
  uint32_t crc32 = 0;
};

struct ExpertViews {
  WeightView gate, up, down;
};

struct ExpertStoreStats {
  uint64_t hits = 0, misses = 0;
  uint64_t ready_hits = 0;  // hits whose read had finished (not waiting on a prefetch)
  uint64_t reads = 0, bytes_read = 0, read_errors = 0, checksum_failures = 0;
  double read_seconds = 0, stall_seconds = 0;
  uint64_t prefetch_issued = 0, prefetch_used = 0, prefetch_wasted = 0, prefetch_cancelled = 0;
  // Candidates: predicted experts not cached when predicted (what a prefetch would read);
  // candidates_used: of those, the ones the layer routed to (the governor's accuracy).
  uint64_t prefetch_candidates = 0, prefetch_candidates_used = 0;
  uint64_t prefetch_throttled = 0;   // candidates not read: no idle I/O capacity in time
  uint64_t prefetch_suppressed = 0;  // candidates not read: the governor had prefetch off
  uint64_t prefetch_switched_off = 0, prefetch_switched_on = 0;  // governor decisions
  uint64_t predicted_routed = 0, routed_after_prediction = 0;
  // The first-layer guess (Engine: the first MoE layer's experts guessed just before that
  // layer's attention). A subset of the prefetch_* counters above, with its
  // own governor: candidates (not cached when guessed), of those routed to, reads issued,
  // issued reads the layer routed to, and guesses it did not route to.
  uint64_t first_candidates = 0, first_candidates_used = 0;
  uint64_t first_issued = 0, first_used = 0, first_wasted = 0;
  uint64_t evictions = 0;
  uint64_t direct_reads = 0, buffered_reads = 0, inline_reads = 0;
  // ReadPoolStats: demand reads that waited for a place under the device cap, and wall
  // seconds with at least one read on the device.
  uint64_t cap_waits = 0;
  double busy_seconds = 0;
  // Wall time split by what ran (io/activity_clock.hpp): a read on the device and the
  // forward thread computing, only the read, only the compute, neither. Their sum is the
  // wall time since load (or reset_stats); a forward's delta, that forward's wall time.
  double io_and_compute_seconds = 0, io_only_seconds = 0, compute_only_seconds = 0, neither_seconds = 0;
};

class ExpertStore {
 public:
  ExpertStore(int64_t n_layers, int64_t n_experts, std::vector<ExpertSource> experts,
              const std::vector<std::string>& files);
  ~ExpertStore();
  ExpertStore(const ExpertStore&) = delete;
  ExpertStore& operator=(const ExpertStore&) = delete;

  bool empty() const { return n_streamed_ == 0; }
  int64_t n_streamed() const { return n_streamed_; }     // experts with a source
  std::size_t slot_bytes() const { return slot_bytes_; }  // one slot (4 KiB multiple)
  uint64_t expert_bytes() const { return expert_bytes_; } // all experts' wanted bytes
  int32_t slots() const { return cache_.slots(); }
  int32_t cached() const { return cache_.cached_count(); }
  int32_t pinned() const { return cache_.pinned_count(); }
  const StoreSettings& settings() const { return settings_; }
  int io_workers() const { return pool_ ? pool_->workers() : 0; }  // reads in flight (workers)
  // The device cap in use (0: none).
  int io_max_in_flight() const { return pool_ ? pool_->max_in_flight() : 0; }
  // workers = auto or max_in_flight = auto: the curve measured at configure (empty otherwise).
  const std::vector<DepthSample>& depth_curve() const { return depth_curve_; }

  // (Re)builds the cache and the I/O pool. Drops every cached expert. Not during a forward.
  void configure(const StoreSettings& settings);

  // Whether the expert is in the cache (ready or being read).
  bool cached(int64_t layer, int64_t expert) const { return cache_.find(key(layer, expert)) >= 0; }
  // Whether wait() would return without blocking.
  bool ready(int64_t layer, int64_t expert) const;
  bool request(int64_t layer, int64_t expert);
  const ExpertViews& wait(int64_t layer, int64_t expert);
  void release(int64_t layer, int64_t expert);
  // Predicted experts of `layer`: the candidates (not cached) are read as idle I/O
  // capacity allows (fewer reads in flight than workers), while the governor has prefetch
  // on; pump_prefetch() issues more of them as reads finish. Never blocks.
  // `first`: the engine's first-layer guess (counted in first_*, judged by its own
  // governor, so a poor guess there never turns the lookahead off, nor the reverse).
  void prefetch(int64_t layer, const std::vector<int32_t>& predicted, bool first = false);
  void pump_prefetch();
  bool prefetch_active() const { return governor_.active(); }
  double prefetch_accuracy() const { return governor_.accuracy(); }
  bool first_guess_active() const { return first_governor_.active(); }
  double first_guess_accuracy() const { return first_governor_.accuracy(); }
  // `routed`: the distinct experts layer `layer` routes to in this forward.
  void settle(int64_t layer, const std::vector<int32_t>& routed);
  void abort() noexcept;
  // Reads experts in key order until the cache is full (or all are cached).
  void preload();

  // Pinned policy: keys (layer * n_experts + expert) in priority order.
  void set_pins(const std::vector<int64_t>& keys);
  // How often each key was routed since load (the routing history).
  const std::vector<uint64_t>& route_counts() const { return route_counts_; }

  ExpertStoreStats stats() const;
  void reset_stats();
  // The read pool's trace of finished reads (ReadPool::start_trace); configure() starts a
  // new pool, whose trace is off.
  void start_io_trace(std::size_t max_records);
  std::vector<ReadTraceRecord> io_trace() const;
  int64_t io_fallbacks() const;
  // What the forward thread marks its compute on (the read pool marks the disk).
  ActivityClock& activity() { return activity_; }
  // Test hook: make the reader fail the way `fault` says (io/direct_reader.hpp).
  void set_fault(IoFault fault);

 private:
  struct Read {
    Extent extent;
    std::size_t slab_offset = 0;  // in the slot
  };
  struct Part {
    DType type = DType::F32;
    int64_t rows = 0, cols = 0;
    int read = 0;               // which read holds it
    uint64_t offset = 0;        // bytes from that read's first wanted byte
    int64_t block_rows = 0, block_cols = 0;  // F8_E4M3 weights: their scales are part 3 + i
  };
  struct Layout {
    std::vector<Read> reads;
    Part parts[6];              // gate, up, down, then the block scales of FP8 ones
    int n_parts = 3;
    int scale_part[3] = {-1, -1, -1};  // the part holding weight i's scales (-1: none)
    bool has_crc32 = false;
    uint32_t crc32 = 0;
  };
  enum class State : uint8_t { Empty, Loading, Ready };
  struct Slot {
    State state = State::Empty;
    std::vector<Ticket> tickets;
    bool checked = false;      // its read verifies the checksum
    uint64_t epoch = 0;        // ExpertStore::epoch_ when the read started
    bool prefetched = false;   // read started by a prefetch, not routed since
    bool first = false;        // that prefetch was the first-layer guess
    bool doomed = false;       // a prefetch partly cancelled: drop when its reads end
    ExpertViews views;
  };

  int64_t key(int64_t layer, int64_t expert) const;
  void start_read(int32_t slot, int64_t key, bool prefetched);
  bool verified(int64_t key, const Layout& lay);  // "first": verified and file unchanged
  void take_stamps();
  // Waits for the slot's reads; false (and the slot freed) when one failed, with the error
  // in *error.
  bool finish_read(int32_t slot, std::exception_ptr* error);
  void reap();
  int32_t insert_after_prefetches(int64_t key, int64_t* evicted);
  std::string label(int64_t key) const;

  int64_t n_layers_, n_experts_;
  std::vector<std::string> files_;
  std::vector<std::unique_ptr<Layout>> layouts_;  // per key, null: not a streamed expert
  int64_t n_streamed_ = 0;
  std::size_t slot_bytes_ = 0;
  uint64_t expert_bytes_ = 0;

  StoreSettings settings_;
  std::unique_ptr<ReadPool> pool_;
  ExpertCache cache_;
  uint8_t* arena_ = nullptr;
  std::size_t arena_bytes_ = 0;
  std::vector<Slot> slots_;
  std::vector<int32_t> loading_;          // slots in Loading that no request holds
  std::vector<std::vector<int64_t>> predicted_;  // per layer: keys predicted for it
  std::vector<std::vector<int64_t>> candidates_; // per layer: of those, not cached then
  std::vector<int64_t> prefetch_queue_;   // candidates waiting for idle I/O capacity
  std::size_t prefetch_next_ = 0;         // next of prefetch_queue_ to issue
  int64_t prefetch_layer_ = -1;           // the layer prefetch_queue_ is for
  bool prefetch_first_ = false;           // prefetch_queue_ is the first-layer guess
  std::vector<uint8_t> candidates_first_; // per layer: candidates_ are the first-layer guess's
  PrefetchGovernor governor_;
  PrefetchGovernor first_governor_;       // the first-layer guess's own outcomes
  std::vector<DepthSample> depth_curve_;
  void measure_workers(bool set_workers, bool set_cap);
  std::vector<uint8_t> verified_;         // per key: checksum seen good since stamps_
  std::vector<FileStamp> stamps_;         // per file, as verified_ saw it
  uint64_t epoch_ = 0;                    // bumped whenever verified_ is cleared
  std::vector<uint64_t> route_counts_;    // per key
  std::vector<int64_t> pins_;
  ExpertStoreStats stats_;
  mutable ActivityClock activity_;        // lives as long as the store: every pool marks it
  ActivitySeconds activity_base_;         // at the last reset_stats
  ReadPoolStats pool_base_;               // pool counters at the last reset
  IoFault fault_ = IoFault::None;
};

}  // namespace colibri
