#include "model/expert_store.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>

#include "common/clock.hpp"
#include "common/errors.hpp"

namespace colibri {

namespace {

// Two extents of one expert closer than this are read as one range: reading the gap costs
// less than a second request.
constexpr uint64_t kMergeGap = 64 * 1024;

// Lookahead reads queued or running, per I/O worker (pump_prefetch).
constexpr std::size_t kPrefetchDepth = 2;

void add_pool(ExpertStoreStats& s, const ReadPoolStats& now, const ReadPoolStats& base) {
  s.reads += now.reads - base.reads;
  s.bytes_read += now.bytes - base.bytes;
  s.read_errors += now.errors - base.errors;
  s.checksum_failures += now.checksum_failures - base.checksum_failures;
  s.read_seconds += now.read_seconds - base.read_seconds;
  s.direct_reads += now.direct_reads - base.direct_reads;
  s.buffered_reads += now.buffered_reads - base.buffered_reads;
  s.inline_reads += now.inline_reads - base.inline_reads;
  s.cap_waits += now.cap_waits - base.cap_waits;
  s.busy_seconds += now.busy_seconds - base.busy_seconds;
}

}  // namespace

ExpertStore::ExpertStore(int64_t n_layers, int64_t n_experts, std::vector<ExpertSource> experts,
                         const std::vector<std::string>& files)
    : n_layers_(n_layers), n_experts_(n_experts), files_(files) {
  const int64_t n_keys = n_layers * std::max<int64_t>(n_experts, 0);
  layouts_.resize(static_cast<std::size_t>(n_keys));
  verified_.assign(static_cast<std::size_t>(n_keys), 0);
  route_counts_.assign(static_cast<std::size_t>(n_keys), 0);
  predicted_.resize(static_cast<std::size_t>(n_layers));
  candidates_.resize(static_cast<std::size_t>(n_layers));
  candidates_first_.assign(static_cast<std::size_t>(n_layers), 0);
  for (auto& src : experts) {
    if (src.layer < 0 || src.layer >= n_layers || src.expert < 0 || src.expert >= n_experts)
      fail(ErrorKind::Format, "expert " + std::to_string(src.expert) + " of layer " + std::to_string(src.layer) +
                                  " is outside the model's " + std::to_string(n_layers) + " layers x " +
                                  std::to_string(n_experts) + " experts");
    const int64_t k = key(src.layer, src.expert);
    auto lay = std::make_unique<Layout>();
    const TensorSpec* specs[3] = {&src.gate, &src.up, &src.down};
    Extent ext[6];
    for (int i = 0; i < 3; ++i) {
      const TensorSpec& t = *specs[i];
      if (t.shape.size() != 2)
        fail(ErrorKind::Format, "expert tensor '" + t.name + "' must be a matrix");
      if (t.extents.size() != 1)
        fail(ErrorKind::Format, "expert tensor '" + t.name + "' is split over " + std::to_string(t.extents.size()) +
                                    " extents; a streamed expert matrix must be contiguous in its file");
      ext[i] = t.extents[0];
      const uint64_t want = row_bytes(t.type, t.shape[1]) * static_cast<uint64_t>(t.shape[0]);
      if (ext[i].length != want)
        fail(ErrorKind::Format, "expert tensor '" + t.name + "' needs " + std::to_string(want) +
                                    " bytes but its extent holds " + std::to_string(ext[i].length));
      if (ext[i].file < 0 || static_cast<std::size_t>(ext[i].file) >= files.size())
        fail(ErrorKind::Format, "expert tensor '" + t.name + "' names file " + std::to_string(ext[i].file) +
                                    " of " + std::to_string(files.size()));
      lay->parts[i] = Part{t.type, t.shape[0], t.shape[1], 0, 0, t.scale_block_rows, t.scale_block_cols};
      expert_bytes_ += ext[i].length;
    }
    // FP8 weights bring their block-scale matrix: one more part each, read like the others.
    for (int i = 0; i < 3; ++i) {
      const TensorSpec& t = *specs[i];
      if (t.type != DType::F8_E4M3) continue;
      if (t.scale_extents.size() != 1 || t.scale_extents[0].length != scale_bytes(t) || scale_bytes(t) == 0)
        fail(ErrorKind::Format, "expert tensor '" + t.name + "' (F8_E4M3) needs one extent of " +
                                    std::to_string(scale_bytes(t)) + " bytes for its block scales");
      const Extent& se = t.scale_extents[0];
      if (se.file < 0 || static_cast<std::size_t>(se.file) >= files.size())
        fail(ErrorKind::Format, "the block scales of '" + t.name + "' name a file that does not exist");
      ext[lay->n_parts] = se;
      lay->parts[lay->n_parts] = Part{DType::F32, 1, static_cast<int64_t>(se.length / 4), 0, 0, 0, 0};
      lay->parts[i].read = lay->n_parts;  // until the reads are planned: the index of its scale part
      ++lay->n_parts;
      expert_bytes_ += se.length;
    }
    int scale_part[3] = {-1, -1, -1};
    for (int i = 0; i < 3; ++i)
      if (specs[i]->type == DType::F8_E4M3) {
        scale_part[i] = lay->parts[i].read;
        lay->parts[i].read = 0;  // set by the read plan below
      }
    const int np = lay->n_parts;
    if (src.blob.length > 0) {
      for (int i = 0; i < np; ++i) {
        if (ext[i].file != src.blob.file || ext[i].offset < src.blob.offset ||
            ext[i].offset + ext[i].length > src.blob.offset + src.blob.length)
          fail(ErrorKind::Format, "expert tensor '" + specs[i < 3 ? i : 0]->name + "' lies outside its blob");
        lay->parts[i].offset = ext[i].offset - src.blob.offset;
      }
      lay->reads.push_back(Read{src.blob, 0});
      lay->has_crc32 = src.has_crc32;
      lay->crc32 = src.crc32;
    } else {
      int order[6] = {0, 1, 2, 3, 4, 5};
      std::sort(order, order + np, [&](int a, int b) {
        return ext[a].file != ext[b].file ? ext[a].file < ext[b].file : ext[a].offset < ext[b].offset;
      });
      for (int n = 0; n < np; ++n) {
        const int oi = order[n];
        const Extent& e = ext[oi];
        if (!lay->reads.empty()) {
          Extent& last = lay->reads.back().extent;
          const uint64_t end = last.offset + last.length;
          if (last.file == e.file && e.offset >= end && e.offset - end <= kMergeGap) {
            lay->parts[oi].read = static_cast<int>(lay->reads.size()) - 1;
            lay->parts[oi].offset = e.offset - last.offset;
            last.length = std::max(end, e.offset + e.length) - last.offset;
            continue;
          }
        }
        lay->parts[oi].read = static_cast<int>(lay->reads.size());
        lay->parts[oi].offset = 0;
        lay->reads.push_back(Read{e, 0});
      }
    }
    for (int i = 0; i < 3; ++i) lay->scale_part[i] = scale_part[i];
    std::size_t at = 0;
    for (auto& r : lay->reads) {
      r.slab_offset = at;
      at += slab_bytes(r.extent);
    }
    slot_bytes_ = std::max(slot_bytes_, at);
    if (layouts_[static_cast<std::size_t>(k)])
      fail(ErrorKind::Format, "expert " + std::to_string(src.expert) + " of layer " + std::to_string(src.layer) +
                                  " is listed twice");
    layouts_[static_cast<std::size_t>(k)] = std::move(lay);
    ++n_streamed_;
  }
}

ExpertStore::~ExpertStore() {
  abort();
  pool_.reset();  // joins the workers before the slots' memory goes
  if (arena_) ::munmap(arena_, arena_bytes_);
}

int64_t ExpertStore::key(int64_t layer, int64_t expert) const { return layer * n_experts_ + expert; }

std::string ExpertStore::label(int64_t k) const {
  return "layer " + std::to_string(k / n_experts_) + " expert " + std::to_string(k % n_experts_);
}

void ExpertStore::configure(const StoreSettings& settings) {
  if (settings.cache_bytes < 0) fail(ErrorKind::InvalidArgument, "expert cache bytes must be >= 0");
  if (!(settings.pin_fraction >= 0.0 && settings.pin_fraction <= 1.0))
    fail(ErrorKind::InvalidArgument, "pin_fraction must be in [0, 1]");
  if (!(settings.prefetch_min_accuracy >= 0.0 && settings.prefetch_min_accuracy <= 1.0))
    fail(ErrorKind::InvalidArgument, "prefetch_min_accuracy must be in [0, 1]");
  int64_t n_slots = 0;
  if (n_streamed_ > 0) {
    n_slots = std::min<int64_t>(settings.cache_bytes / static_cast<int64_t>(slot_bytes_), n_streamed_);
    if (n_slots < 1)
      fail(ErrorKind::InvalidArgument, "an expert cache of " + std::to_string(settings.cache_bytes) +
                                           " bytes holds no expert: one needs " + std::to_string(slot_bytes_) +
                                           " bytes");
  }
  if (settings.workers != kAutoWorkers && (settings.workers < 0 || settings.workers > kMaxIoWorkers))
    fail(ErrorKind::InvalidArgument, "I/O workers must be in [0, " + std::to_string(kMaxIoWorkers) + "] or auto");
  if (settings.max_in_flight != kAutoInFlight && (settings.max_in_flight < 0 || settings.max_in_flight > kMaxIoWorkers))
    fail(ErrorKind::InvalidArgument, "reads in flight must be in [0, " + std::to_string(kMaxIoWorkers) +
                                         "] (0: no cap) or auto");
  const bool auto_workers = settings.workers == kAutoWorkers;
  const bool auto_cap = settings.max_in_flight == kAutoInFlight;
  // may throw: nothing changed yet. Auto starts with 2 and measures below.
  auto pool = std::make_unique<ReadPool>(files_, auto_workers ? 2 : settings.workers, settings.direct, fault_);
  pool->set_activity(&activity_);
  abort();
  if (pool_) add_pool(stats_, pool_->stats(), pool_base_);
  pool_ = std::move(pool);
  pool_base_ = ReadPoolStats{};
  take_stamps();
  if (arena_) ::munmap(arena_, arena_bytes_);
  arena_ = nullptr;
  arena_bytes_ = static_cast<std::size_t>(n_slots) * slot_bytes_;
  if (arena_bytes_ > 0) {
    void* p = ::mmap(nullptr, arena_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      arena_bytes_ = 0;
      fail(ErrorKind::InvalidArgument, "cannot reserve " + std::to_string(n_slots * static_cast<int64_t>(slot_bytes_)) +
                                           " bytes for the expert cache; lower ram_budget");
    }
    arena_ = static_cast<uint8_t*>(p);
#if defined(MADV_HUGEPAGE)
    (void)::madvise(arena_, arena_bytes_, MADV_HUGEPAGE);  // fewer TLB misses in expert matmuls
#endif
  }
  settings_ = settings;
  cache_ = ExpertCache(static_cast<int32_t>(n_slots), n_layers_ * n_experts_, settings.policy);
  slots_.assign(static_cast<std::size_t>(n_slots), Slot{});
  loading_.clear();
  for (auto& p : predicted_) p.clear();
  for (auto& c : candidates_) c.clear();
  const double off = settings.prefetch_min_accuracy;
  governor_ = PrefetchGovernor(PrefetchGovernor::kWindow, PrefetchGovernor::kMinSamples, off,
                               std::min(1.0, off + PrefetchGovernor::kHysteresis));
  first_governor_ = governor_;
  set_pins(pins_);
  depth_curve_.clear();
  if ((auto_workers || auto_cap) && n_slots > 0) measure_workers(auto_workers, auto_cap);
  if (!auto_cap) pool_->set_max_in_flight(settings.max_in_flight);
}

// workers = auto or max_in_flight = auto: time cold reads of this model's own experts into the cache's own slots
// (still empty) at 1, 2, 4, 8 reads in flight, twice in opposite orders (best of the two
// per depth: a shared disk has slow moments). Workers: the knee (the smallest depth within
// 90% of the best). The device cap: the best depth (ties within 3% to the smaller one), so
// a disk that is fastest with one read in flight gets one.
// About 4 x 2 x 24 MiB: a fraction of a second on a disk that streams a model.
void ExpertStore::measure_workers(bool set_workers, bool set_cap) {
  constexpr uint64_t kBytesPerDepth = 24ull << 20;
  std::vector<int> depths;
  for (int d : {1, 2, 4, 8})
    if (d <= cache_.slots()) depths.push_back(d);
  std::vector<uint8_t*> slabs;
  for (int i = 0; i < depths.back(); ++i) slabs.push_back(arena_ + static_cast<std::size_t>(i) * slot_bytes_);
  // Reads spread over the model (a fixed stride through the keys), each expert's first read.
  std::vector<Extent> extents;
  const std::size_t n = layouts_.size();
  const std::size_t stride = 7919;  // a prime: visits every key once when n is not a multiple
  for (std::size_t i = 0, k = 0; i < n; ++i, k = (k + stride) % n)
    if (layouts_[k]) extents.push_back(layouts_[k]->reads.front().extent);
  const uint64_t per_depth = std::min<uint64_t>(kBytesPerDepth, expert_bytes_);
  std::vector<DepthSample> a = measure_depth_curve(files_, settings_.direct, extents, slabs, slot_bytes_, depths, per_depth);
  std::vector<int> reversed(depths.rbegin(), depths.rend());
  std::vector<DepthSample> b = measure_depth_curve(files_, settings_.direct, extents, slabs, slot_bytes_, reversed, per_depth);
  for (auto& s : a)
    for (const auto& t : b)
      if (t.depth == s.depth) s.gbps = std::max(s.gbps, t.gbps);
  depth_curve_ = a;
  const int workers = knee_depth(depth_curve_);
  if (set_workers && workers != pool_->workers()) {
    pool_ = std::make_unique<ReadPool>(files_, workers, settings_.direct, fault_);
    pool_->set_activity(&activity_);
    pool_base_ = ReadPoolStats{};
    take_stamps();
  }
  pool_->set_max_in_flight(set_cap ? knee_depth(depth_curve_, 0.97) : settings_.max_in_flight);
}

void ExpertStore::set_pins(const std::vector<int64_t>& keys) {
  pins_ = keys;
  const auto max_pinned = static_cast<int32_t>(std::floor(settings_.pin_fraction * cache_.slots()));
  cache_.set_pins(pins_, max_pinned);
}

// "first": a blob verified once is trusted while its file is unchanged. A write, a
// truncation or a replacement changes the file's stamp (size, inode, mtime, ctime; one
// fstat, about a microsecond per read); then every blob is verified again on its next read
// (a new epoch). A change the file system does not see (bit rot on the device) needs
// "always".
bool ExpertStore::verified(int64_t k, const Layout& lay) {
  if (!verified_[static_cast<std::size_t>(k)]) return false;
  const auto file = static_cast<std::size_t>(lay.reads.front().extent.file);
  const FileStamp now = pool_->reader().files().stamp(static_cast<int32_t>(file));
  if (now == stamps_[file]) return true;
  stamps_[file] = now;
  std::fill(verified_.begin(), verified_.end(), 0);
  ++epoch_;  // reads started before the change do not mark their blob verified
  return false;
}

void ExpertStore::take_stamps() {
  std::vector<FileStamp> now(files_.size());
  for (std::size_t f = 0; f < files_.size(); ++f) now[f] = pool_->reader().files().stamp(static_cast<int32_t>(f));
  if (now != stamps_) {
    std::fill(verified_.begin(), verified_.end(), 0);
    ++epoch_;
  }
  stamps_ = std::move(now);
}

void ExpertStore::start_read(int32_t s, int64_t k, bool prefetched) {
  const Layout& lay = *layouts_[static_cast<std::size_t>(k)];
  Slot& slot = slots_[static_cast<std::size_t>(s)];
  uint8_t* base = arena_ + static_cast<std::size_t>(s) * slot_bytes_;
  slot.checked = lay.has_crc32 && (settings_.checksums == ChecksumMode::Always ||
                                   (settings_.checksums == ChecksumMode::First && !verified(k, lay)));
  slot.epoch = epoch_;
  slot.tickets.clear();
  slot.prefetched = prefetched;
  slot.first = false;
  slot.doomed = false;
  slot.state = State::Loading;
  cache_.hold(s);  // the load's hold, dropped when the reads end
  loading_.push_back(s);
  WeightView* views[3] = {&slot.views.gate, &slot.views.up, &slot.views.down};
  auto at = [&](const Part& p) {
    const Read& r = lay.reads[static_cast<std::size_t>(p.read)];
    return base + r.slab_offset + data_offset(r.extent) + p.offset;
  };
  for (int i = 0; i < 3; ++i) {
    const Part& p = lay.parts[i];
    *views[i] = WeightView{p.type, p.rows, p.cols, at(p)};
    if (lay.scale_part[i] >= 0)
      views[i]->scales = BlockScales{at(lay.parts[lay.scale_part[i]]), p.block_rows, p.block_cols};
  }
  try {
    for (const Read& r : lay.reads) {
      ReadRequest req;
      req.extent = r.extent;
      req.slab = base + r.slab_offset;
      req.capacity = slot_bytes_ - r.slab_offset;
      req.check_crc32 = slot.checked;
      req.crc32 = lay.crc32;
      req.urgent = !prefetched;  // a read the compute needs now goes ahead of guesses
      slot.tickets.push_back(pool_->submit(req));
    }
  } catch (...) {
    std::exception_ptr ignored;
    finish_read(s, &ignored);  // waits for the reads already queued, frees the slot
    throw;
  }
}

bool ExpertStore::finish_read(int32_t s, std::exception_ptr* error) {
  Slot& slot = slots_[static_cast<std::size_t>(s)];
  for (Ticket t : slot.tickets) {
    try {
      pool_->wait(t);
    } catch (...) {
      if (!*error) *error = std::current_exception();
    }
  }
  slot.tickets.clear();
  loading_.erase(std::remove(loading_.begin(), loading_.end(), s), loading_.end());
  const int64_t k = cache_.key_of(s);
  if (*error || slot.doomed) {
    slot.state = State::Empty;
    slot.prefetched = slot.doomed = false;
    cache_.remove(s);
    return !*error;
  }
  cache_.release(s);
  slot.state = State::Ready;
  if (slot.checked && slot.epoch == epoch_) verified_[static_cast<std::size_t>(k)] = 1;
  return true;
}

void ExpertStore::reap() {
  // Finish prefetch reads that are done and that no request holds, so their slots can be
  // evicted again. Never blocks (done() is checked first).
  const std::vector<int32_t> loading = loading_;
  for (int32_t s : loading) {
    if (cache_.holds(s) != 1) continue;
    const Slot& slot = slots_[static_cast<std::size_t>(s)];
    bool all_done = true;
    for (Ticket t : slot.tickets) all_done = all_done && pool_->done(t);
    if (!all_done) continue;
    std::exception_ptr ignored;  // a failed prefetch frees its slot; a later need re-reads
    finish_read(s, &ignored);
  }
}

bool ExpertStore::request(int64_t layer, int64_t expert) {
  const int64_t k = key(layer, expert);
  if (!layouts_[static_cast<std::size_t>(k)])
    fail(ErrorKind::Internal, label(k) + " has no source to stream from");
  int32_t s = cache_.find(k);
  if (s >= 0 && slots_[static_cast<std::size_t>(s)].doomed) {
    std::exception_ptr ignored;  // a cancelled prefetch still reading: let it end, read again
    finish_read(s, &ignored);
    s = -1;
  }
  if (s >= 0) {
    Slot& slot = slots_[static_cast<std::size_t>(s)];
    ++stats_.hits;
    if (slot.state == State::Ready) ++stats_.ready_hits;
    if (slot.prefetched) {
      ++stats_.prefetch_used;
      if (slot.first) ++stats_.first_used;
      slot.prefetched = slot.first = false;
    }
    ++route_counts_[static_cast<std::size_t>(k)];
    cache_.count(k);
    cache_.touch(k);
    cache_.hold(s);
    return true;
  }
  int64_t evicted = -1;
  s = cache_.insert(k, &evicted);
  if (s < 0) {
    reap();
    s = cache_.insert(k, &evicted);
  }
  if (s < 0) s = insert_after_prefetches(k, &evicted);
  if (s < 0) return false;
  if (evicted >= 0) ++stats_.evictions;
  ++stats_.misses;
  ++route_counts_[static_cast<std::size_t>(k)];
  cache_.count(k);
  start_read(s, k, false);
  cache_.hold(s);
  return true;
}

// Every slot that is not held by a request is pinned or being read by a prefetch (the
// first-layer guess can take every unpinned slot before a forward holds any): a demand
// read must not fail for want of a slot that a guess holds only until its read ends. Wait
// for those reads, oldest first, until a slot can be taken; -1 when none is left to wait
// for (every slot held by requests: the layer runs in waves).
int32_t ExpertStore::insert_after_prefetches(int64_t k, int64_t* evicted) {
  const auto t0 = std::chrono::steady_clock::now();
  int32_t s = -1;
  while (s < 0) {
    const auto it = std::find_if(loading_.begin(), loading_.end(), [&](int32_t l) { return cache_.holds(l) == 1; });
    if (it == loading_.end()) break;
    std::exception_ptr ignored;  // a failed prefetch frees its slot; a later need re-reads
    finish_read(*it, &ignored);
    s = cache_.insert(k, evicted);
  }
  stats_.stall_seconds += seconds_since(t0);
  return s;
}

const ExpertViews& ExpertStore::wait(int64_t layer, int64_t expert) {
  const int64_t k = key(layer, expert);
  const int32_t s = cache_.find(k);
  if (s < 0 || !cache_.busy(s)) fail(ErrorKind::Internal, label(k) + " was not requested before wait");
  Slot& slot = slots_[static_cast<std::size_t>(s)];
  if (slot.state == State::Loading) {
    const auto t0 = std::chrono::steady_clock::now();
    std::exception_ptr error;
    const bool ok = finish_read(s, &error);
    stats_.stall_seconds += seconds_since(t0);
    if (!ok) {
      try {
        std::rethrow_exception(error);
      } catch (const Error& e) {
        throw Error(e.kind(), label(k) + ": " + e.what());
      }
    }
  }
  return slot.views;
}

bool ExpertStore::ready(int64_t layer, int64_t expert) const {
  const int32_t s = cache_.find(key(layer, expert));
  if (s < 0) return false;
  const Slot& slot = slots_[static_cast<std::size_t>(s)];
  if (slot.state == State::Ready) return true;
  for (Ticket t : slot.tickets)
    if (!pool_->done(t)) return false;
  return slot.state == State::Loading;
}

void ExpertStore::release(int64_t layer, int64_t expert) {
  const int32_t s = cache_.find(key(layer, expert));
  if (s >= 0 && cache_.holds(s) > 0) cache_.release(s);
}

void ExpertStore::prefetch(int64_t layer, const std::vector<int32_t>& predicted, bool first) {
  if (layer < 0 || layer >= n_layers_ || slots_.empty()) return;
  auto& pred = predicted_[static_cast<std::size_t>(layer)];
  auto& cand = candidates_[static_cast<std::size_t>(layer)];
  pred.clear();
  cand.clear();
  candidates_first_[static_cast<std::size_t>(layer)] = first ? 1 : 0;
  prefetch_queue_.clear();
  prefetch_next_ = 0;
  prefetch_layer_ = layer;
  prefetch_first_ = first;
  const PrefetchGovernor& gov = first ? first_governor_ : governor_;
  for (int32_t e : predicted) {
    const int64_t k = key(layer, e);
    pred.push_back(k);
    if (!layouts_[static_cast<std::size_t>(k)] || cache_.find(k) >= 0) continue;
    cand.push_back(k);
    ++stats_.prefetch_candidates;
    if (first) ++stats_.first_candidates;
    if (gov.active()) prefetch_queue_.push_back(k);
    else ++stats_.prefetch_suppressed;  // still scored at settle: how prefetch comes back on
  }
  pump_prefetch();
}

void ExpertStore::pump_prefetch() {
  // Idle I/O capacity: fewer reads queued or running than kPrefetchDepth x workers (the
  // measured depth). The workers run `workers` reads at once; the rest wait in the pool's
  // queue so that a worker whose read ends takes the next guess at once, without waiting
  // for the compute thread to come back here (it is in a matmul or an attention). Demand
  // reads go ahead of every queued guess anyway (ReadQueue); the bound keeps guesses from
  // taking slots far ahead of the reads the device can do before their layer runs.
  const std::size_t depth = static_cast<std::size_t>(pool_ ? pool_->workers() : 0) * kPrefetchDepth;
  while (prefetch_next_ < prefetch_queue_.size()) {
    if (depth > 0 && pool_->in_flight() >= depth) return;
    const int64_t k = prefetch_queue_[prefetch_next_++];
    if (cache_.find(k) >= 0) continue;
    int64_t evicted = -1;
    const int32_t s = cache_.insert(k, &evicted, /*speculative=*/true);
    if (s < 0) continue;  // no room without evicting something in use: skip, never block
    if (evicted >= 0) ++stats_.evictions;
    start_read(s, k, true);
    slots_[static_cast<std::size_t>(s)].first = prefetch_first_;
    ++stats_.prefetch_issued;
    if (prefetch_first_) ++stats_.first_issued;
  }
}

void ExpertStore::settle(int64_t layer, const std::vector<int32_t>& routed) {
  reap();
  if (prefetch_layer_ == layer) {  // candidates that never found idle capacity
    stats_.prefetch_throttled += prefetch_queue_.size() - prefetch_next_;
    prefetch_queue_.clear();
    prefetch_next_ = 0;
    prefetch_layer_ = -1;
  }
  auto& cand = candidates_[static_cast<std::size_t>(layer)];
  const bool first = candidates_first_[static_cast<std::size_t>(layer)] != 0;
  PrefetchGovernor& gov = first ? first_governor_ : governor_;
  for (int64_t k : cand) {
    const bool used = std::find(routed.begin(), routed.end(), static_cast<int32_t>(k % n_experts_)) != routed.end();
    if (used) ++stats_.prefetch_candidates_used;
    if (used && first) ++stats_.first_candidates_used;
    const bool was_active = gov.active();
    gov.record(used);
    if (first) continue;  // the lookahead's switches only (the guess's: first_guess_active)
    if (was_active && !gov.active()) ++stats_.prefetch_switched_off;
    if (!was_active && gov.active()) ++stats_.prefetch_switched_on;
  }
  cand.clear();
  candidates_first_[static_cast<std::size_t>(layer)] = 0;
  auto& pred = predicted_[static_cast<std::size_t>(layer)];
  if (pred.empty()) return;
  stats_.routed_after_prediction += routed.size();
  for (int32_t e : routed)
    if (std::find(pred.begin(), pred.end(), key(layer, e)) != pred.end()) ++stats_.predicted_routed;
  for (int64_t k : pred) {
    if (std::find(routed.begin(), routed.end(), static_cast<int32_t>(k % n_experts_)) != routed.end()) continue;
    const int32_t s = cache_.find(k);
    if (s < 0) continue;
    Slot& slot = slots_[static_cast<std::size_t>(s)];
    if (!slot.prefetched) continue;
    ++stats_.prefetch_wasted;
    if (slot.first) ++stats_.first_wasted;
    slot.prefetched = slot.first = false;
    if (slot.state != State::Loading) continue;
    // Not wanted after all: drop reads that have not started (never blocks).
    std::vector<Ticket> left;
    for (Ticket t : slot.tickets)
      if (!pool_->cancel(t)) left.push_back(t);
    if (left.size() == slot.tickets.size()) continue;  // all started: let them finish
    slot.tickets = left;
    if (left.empty()) {
      ++stats_.prefetch_cancelled;
      loading_.erase(std::remove(loading_.begin(), loading_.end(), s), loading_.end());
      slot.state = State::Empty;
      cache_.remove(s);
    } else {
      slot.doomed = true;  // partly read: dropped when the rest ends
    }
  }
  pred.clear();
}

void ExpertStore::abort() noexcept {
  if (!pool_) return;
  const std::vector<int32_t> loading = loading_;
  for (int32_t s : loading) {
    std::exception_ptr ignored;
    finish_read(s, &ignored);
  }
  cache_.clear_holds();
  for (auto& p : predicted_) p.clear();
  for (auto& c : candidates_) c.clear();
  std::fill(candidates_first_.begin(), candidates_first_.end(), 0);
  prefetch_queue_.clear();
  prefetch_next_ = 0;
  prefetch_layer_ = -1;
  prefetch_first_ = false;
  for (auto& slot : slots_) slot.prefetched = slot.first = false;
}

void ExpertStore::preload() {
  std::vector<int32_t> started;
  for (int64_t k = 0; k < static_cast<int64_t>(layouts_.size()); ++k) {
    if (!layouts_[static_cast<std::size_t>(k)] || cache_.find(k) >= 0) continue;
    if (cache_.cached_count() >= cache_.slots()) break;
    int64_t evicted = -1;
    const int32_t s = cache_.insert(k, &evicted);
    if (s < 0) break;
    start_read(s, k, false);
    started.push_back(s);
  }
  std::exception_ptr first;
  for (int32_t s : started) {
    std::exception_ptr error;
    const int64_t k = cache_.key_of(s);
    if (!finish_read(s, &error) && !first) {
      try {
        std::rethrow_exception(error);
      } catch (const Error& e) {
        first = std::make_exception_ptr(Error(e.kind(), label(k) + ": " + e.what()));
      } catch (...) {
        first = error;
      }
    }
  }
  if (first) std::rethrow_exception(first);
}

ExpertStoreStats ExpertStore::stats() const {
  ExpertStoreStats s = stats_;
  if (pool_) add_pool(s, pool_->stats(), pool_base_);
  const ActivitySeconds a = activity_.seconds();
  s.io_and_compute_seconds = a.io_and_compute - activity_base_.io_and_compute;
  s.io_only_seconds = a.io_only - activity_base_.io_only;
  s.compute_only_seconds = a.compute_only - activity_base_.compute_only;
  s.neither_seconds = a.neither - activity_base_.neither;
  return s;
}

void ExpertStore::reset_stats() {
  stats_ = ExpertStoreStats{};
  activity_base_ = activity_.seconds();
  pool_base_ = pool_ ? pool_->stats() : ReadPoolStats{};
}

void ExpertStore::start_io_trace(std::size_t max_records) {
  if (pool_) pool_->start_trace(max_records);
}

std::vector<ReadTraceRecord> ExpertStore::io_trace() const { return pool_ ? pool_->trace() : std::vector<ReadTraceRecord>{}; }

int64_t ExpertStore::io_fallbacks() const { return pool_ ? static_cast<int64_t>(pool_->stats().fallbacks) : 0; }

void ExpertStore::set_fault(IoFault fault) {
  fault_ = fault;
  if (pool_) pool_->set_fault(fault);
}

}  // namespace colibri
