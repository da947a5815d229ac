#include "model/session.hpp"

#include <algorithm>
#include <chrono>
#include <thread>

#include "common/errors.hpp"

namespace colibri {

namespace {

const char* const kClosed = "the model is closed; load it again to use it";
constexpr std::chrono::milliseconds kPoll{5};

}  // namespace

// Marks the session in use for the lifetime of one call; a second call (another thread, or
// a progress callback re-entering the session) is refused instead of interleaving its
// tokens with the first one's.
class Session::Busy {
 public:
  explicit Busy(Session& s) : s_(s) {
    std::lock_guard<std::mutex> lock(s_.mu_);
    s_.require_open();
    if (s_.busy_)
      fail(ErrorKind::InvalidArgument,
           "this session is in use by another call (one call at a time per session: give "
           "each thread its own session; sessions share the model)");
    s_.busy_ = true;
    s_.busy_thread_ = std::this_thread::get_id();
  }
  ~Busy() {
    {
      std::lock_guard<std::mutex> lock(s_.mu_);
      s_.busy_ = false;
      if (s_.closing_.load() && !s_.closed_) s_.release();  // close() was called meanwhile
    }
    s_.idle_.notify_all();
  }
  Busy(const Busy&) = delete;
  Busy& operator=(const Busy&) = delete;

 private:
  Session& s_;
};

Session::Session(std::shared_ptr<Engine> engine, int64_t context_length, DType kv_type)
    : engine_(std::move(engine)),
      spec_(engine_->spec()),
      kv_(std::make_unique<KvCache>(engine_->kv_layouts(), context_length, kv_type)),
      context_length_(context_length),
      kv_type_(kv_type) {}

void Session::require_open() const {
  if (closed_ || closing_.load()) fail(ErrorKind::InvalidArgument, kClosed);
}

void Session::forward(const int32_t* ids, int64_t n, bool all_logits, float* logits_out,
                      const ForwardHooks& hooks) {
  Busy busy(*this);
  if (n <= 0) fail(ErrorKind::InvalidArgument, "forward needs at least one token");
  for (int64_t t = 0; t < n; ++t)  // all of them before the first chunk runs
    if (ids[t] < 0 || ids[t] >= spec_.vocab_size)
      fail(ErrorKind::TokenOutOfRange, "token id " + std::to_string(ids[t]) + " at index " + std::to_string(t) +
                                           " is outside the vocabulary [0, " + std::to_string(spec_.vocab_size) + ")");
  const int64_t pos0 = n_tokens();
  if (pos0 + n > context_length_)  // checked here too: a chunk must not be the first to see it
    fail(ErrorKind::ContextOverflow,
         "context overflow: the session holds " + std::to_string(pos0) + " tokens and " +
             std::to_string(n) + " more would exceed the context length of " +
             std::to_string(context_length_) + " (raise EngineConfig.context_length or start a new session)");
  const int64_t k = spec_.n_experts_per_tok, layers = spec_.n_layers, vocab = spec_.vocab_size;
  std::vector<int32_t> routing(k > 0 ? static_cast<std::size_t>(n * layers * k) : 0);
  // The caller's check may be costly (the binding takes the GIL): it is asked at most every
  // kPoll between layers, so a decode step of a few ms asks it once, before the commit.
  auto next_poll = std::chrono::steady_clock::now() + kPoll;
  const CancelCheck stop = [&] {
    if (closing_.load(std::memory_order_relaxed)) return true;  // close() from another thread
    if (!hooks.cancelled) return false;
    const auto now = std::chrono::steady_clock::now();
    if (now < next_poll) return false;
    next_poll = now + kPoll;
    return hooks.cancelled();
  };
  const int64_t chunk = hooks.chunk > 0 ? hooks.chunk : n;
  // This call's share of the engine's counters, added to the session's whether the call
  // commits or not (the work was done either way).
  struct StatsScope {
    Session& s;
    ForwardStats delta;
    ~StatsScope() {
      std::lock_guard<std::mutex> lock(s.mu_);
      add_delta(s.stats_.experts, delta.experts, ExpertStoreStats{});
      add_delta(s.stats_.phases, delta.phases, PhaseSeconds{});
      s.stats_.forwards += delta.forwards;
    }
  } stats{*this, {}};
  // With MTP on, every position's trunk state (after the final norm) is kept for it.
  std::vector<float> hidden(mtp_ ? static_cast<std::size_t>(n * spec_.hidden_size) : 0);
  kv_->require_rollback(pos0, "forward");  // the sliding layers' windows are intact
  // More new positions than the rings' slack overwrite windows the session still needs:
  // keep the rings to put back if the forward fails (all or nothing, as above).
  const bool keep_rings = kv_->has_ring() && n > kRingSlack + 1;
  KvCache::RingState rings = keep_rings ? kv_->save_rings() : KvCache::RingState{};
  try {
    replay_state(&stop, &stats.delta, chunk);
    for (int64_t done = 0; done < n;) {
      const int64_t len = std::min(chunk, n - done);
      const bool last = done + len == n;
      float* out = all_logits ? logits_out + done * vocab : (last ? logits_out : nullptr);
      engine_->forward(*kv_, pos0 + done, ids + done, len, all_logits, out,
                       k > 0 ? routing.data() + done * layers * k : nullptr, &stop, &stats.delta,
                       mtp_ ? hidden.data() + done * spec_.hidden_size : nullptr);
      done += len;
      if (hooks.progress) hooks.progress(done, n);
      if (!last && stop()) fail(ErrorKind::Cancelled, "the forward was interrupted");
    }
    // Unthrottled, before the commit: Ctrl-C during the last stretch still undoes the call.
    if (closing_.load() || (hooks.cancelled && hooks.cancelled()))
      fail(ErrorKind::Cancelled, "the forward was interrupted");
  } catch (const Error& e) {
    if (keep_rings) kv_->restore_rings(std::move(rings));
    if (kv_ && kv_->has_state()) kv_->forget_state();  // part of it ran: replayed next time
    if (e.kind() == ErrorKind::Cancelled && closing_.load())
      fail(ErrorKind::InvalidArgument, "the model was closed during this forward");
    throw;
  } catch (...) {
    if (keep_rings) kv_->restore_rings(std::move(rings));
    if (kv_ && kv_->has_state()) kv_->forget_state();
    throw;
  }
  std::lock_guard<std::mutex> lock(mu_);  // commit: the tokens, their ids and routing at once
  ids_.insert(ids_.end(), ids, ids + n);
  last_routing_ = std::move(routing);
  last_routing_tokens_ = n;
  if (mtp_) mtp_->record(pos0, hidden.data(), n);
}

void Session::enable_mtp() {
  Busy busy(*this);
  std::lock_guard<std::mutex> lock(mu_);
  if (mtp_) return;
  mtp_ = std::make_unique<MtpState>(*engine_, context_length_, kv_type_);
  mtp_->restart(static_cast<int64_t>(ids_.size()));
}

bool Session::mtp_enabled() const {
  std::lock_guard<std::mutex> lock(mu_);
  return mtp_ != nullptr;
}

int64_t Session::mtp_committed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return mtp_ ? mtp_->committed() : 0;
}

int64_t Session::mtp_origin() const {
  std::lock_guard<std::mutex> lock(mu_);
  return mtp_ ? mtp_->origin() : 0;
}

std::size_t Session::mtp_kv_allocated_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return mtp_ ? mtp_->kv_bytes() : 0;
}

std::vector<int32_t> Session::mtp_draft(int32_t next, int64_t k, float* logits_out) {
  Busy busy(*this);
  if (!mtp_) fail(ErrorKind::InvalidArgument, "MTP drafting is not enabled on this session (enable_mtp)");
  if (next < 0 || next >= spec_.vocab_size)
    fail(ErrorKind::TokenOutOfRange, "token id " + std::to_string(next) + " is outside the vocabulary [0, " +
                                         std::to_string(spec_.vocab_size) + ")");
  std::vector<int32_t> ids;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ids = ids_;
  }
  const CancelCheck stop = [&] { return closing_.load(std::memory_order_relaxed); };
  ForwardStats delta;
  struct StatsScope {
    Session& s;
    ForwardStats& delta;
    ~StatsScope() {
      std::lock_guard<std::mutex> lock(s.mu_);
      add_delta(s.stats_.experts, delta.experts, ExpertStoreStats{});
      add_delta(s.stats_.phases, delta.phases, PhaseSeconds{});
    }
  } scope{*this, delta};
  // Busy keeps every other call out, so the state is changed outside mu_ (as forward's KV).
  return mtp_->draft(*engine_, ids, next, k, logits_out, &stop, &delta);
}

void Session::forward_batch(const std::vector<SessionStep>& steps, const CancelCheck& cancelled) {
  if (steps.empty()) fail(ErrorKind::InvalidArgument, "forward_batch needs at least one session");
  std::vector<std::unique_ptr<Busy>> busy;  // every session marked in use, or none
  busy.reserve(steps.size());
  for (std::size_t i = 0; i < steps.size(); ++i) {
    Session* s = steps[i].session;
    if (!s) fail(ErrorKind::InvalidArgument, "forward_batch: a step has no session");
    for (std::size_t j = 0; j < i; ++j)
      if (steps[j].session == s)
        fail(ErrorKind::InvalidArgument, "forward_batch: a session appears twice (one step per session)");
    busy.push_back(std::make_unique<Busy>(*s));
  }
  Engine* engine = steps[0].session->engine_.get();
  std::vector<BatchRow> rows(steps.size());
  std::vector<std::vector<int32_t>> routing(steps.size());
  std::vector<std::vector<float>> hidden(steps.size());  // sessions with MTP on: the trunk's states
  std::vector<int64_t> pos0(steps.size());
  for (std::size_t i = 0; i < steps.size(); ++i) {
    const SessionStep& st = steps[i];
    Session& s = *st.session;
    if (s.engine_.get() != engine)
      fail(ErrorKind::InvalidArgument, "forward_batch: the sessions belong to different models");
    const int64_t k = s.spec_.n_experts_per_tok;
    routing[i].resize(k > 0 && st.n > 0 ? static_cast<std::size_t>(st.n * s.spec_.n_layers * k) : 0);
    BatchRow& r = rows[i];
    r.kv = s.kv_.get();
    r.pos0 = s.n_tokens();
    r.ids = st.ids;
    r.n = st.n;
    r.all_logits = st.all_logits;
    r.logits_out = st.logits_out;
    r.routing_out = routing[i].empty() ? nullptr : routing[i].data();
    pos0[i] = r.pos0;
    s.kv_->require_rollback(r.pos0, "forward_batch");
    if (s.mtp_) {
      hidden[i].resize(static_cast<std::size_t>(st.n * s.spec_.hidden_size));
      r.hidden_out = hidden[i].data();
    }
  }
  // As in forward(): the caller's check is asked at most every kPoll; a session closed
  // from another thread stops the step at its next layer.
  auto next_poll = std::chrono::steady_clock::now() + kPoll;
  auto closing = [&] {
    return std::any_of(steps.begin(), steps.end(),
                       [](const SessionStep& st) { return st.session->closing_.load(std::memory_order_relaxed); });
  };
  const CancelCheck stop = [&] {
    if (closing()) return true;
    if (!cancelled) return false;
    const auto now = std::chrono::steady_clock::now();
    if (now < next_poll) return false;
    next_poll = now + kPoll;
    return cancelled();
  };
  ForwardStats delta;
  struct StatsScope {  // the step's counters, added to every session of it (see the header)
    const std::vector<SessionStep>& steps;
    ForwardStats& delta;
    ~StatsScope() {
      for (const SessionStep& st : steps) {
        std::lock_guard<std::mutex> lock(st.session->mu_);
        add_delta(st.session->stats_.experts, delta.experts, ExpertStoreStats{});
        add_delta(st.session->stats_.phases, delta.phases, PhaseSeconds{});
        st.session->stats_.forwards += delta.forwards;
      }
    }
  } stats{steps, delta};
  // As in forward(): the rings of the sessions whose step is longer than their slack.
  std::vector<KvCache::RingState> rings(steps.size());
  for (std::size_t i = 0; i < steps.size(); ++i)
    if (steps[i].session->kv_->has_ring() && steps[i].n > kRingSlack + 1) rings[i] = steps[i].session->kv_->save_rings();
  auto restore = [&] {
    for (std::size_t i = 0; i < steps.size(); ++i)
      if (!rings[i].k.empty()) steps[i].session->kv_->restore_rings(std::move(rings[i]));
  };
  try {
    for (const SessionStep& st : steps) st.session->replay_state(&stop, &delta, 0);
    engine->forward_batch(rows, &stop, &delta);
    if (closing() || (cancelled && cancelled())) fail(ErrorKind::Cancelled, "the forward was interrupted");
  } catch (const Error& e) {
    restore();
    for (const SessionStep& st : steps)
      if (st.session->kv_ && st.session->kv_->has_state()) st.session->kv_->forget_state();
    if (e.kind() == ErrorKind::Cancelled && closing())
      fail(ErrorKind::InvalidArgument, "the model was closed during this forward");
    throw;
  } catch (...) {
    restore();
    for (const SessionStep& st : steps)
      if (st.session->kv_ && st.session->kv_->has_state()) st.session->kv_->forget_state();
    throw;
  }
  for (std::size_t i = 0; i < steps.size(); ++i) {  // commit: every session, each at once
    Session& s = *steps[i].session;
    std::lock_guard<std::mutex> lock(s.mu_);
    s.ids_.insert(s.ids_.end(), steps[i].ids, steps[i].ids + steps[i].n);
    s.last_routing_ = std::move(routing[i]);
    s.last_routing_tokens_ = steps[i].n;
    if (s.mtp_) s.mtp_->record(pos0[i], hidden[i].data(), steps[i].n);
  }
}

ForwardStats Session::forward_stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

std::vector<int32_t> Session::last_routing() const {
  std::lock_guard<std::mutex> lock(mu_);
  require_open();
  return last_routing_;
}

int64_t Session::last_routing_tokens() const {
  std::lock_guard<std::mutex> lock(mu_);
  require_open();
  return last_routing_tokens_;
}

int64_t Session::n_tokens() const {
  std::lock_guard<std::mutex> lock(mu_);
  require_open();
  return static_cast<int64_t>(ids_.size());
}

std::vector<int32_t> Session::token_ids() const {
  std::lock_guard<std::mutex> lock(mu_);
  require_open();
  return ids_;
}

int64_t Session::context_length() const {
  std::lock_guard<std::mutex> lock(mu_);
  require_open();
  return context_length_;
}

void Session::reset() {
  Busy busy(*this);
  std::lock_guard<std::mutex> lock(mu_);
  ids_.clear();
  kv_->truncate(0);
  last_routing_.clear();
  last_routing_tokens_ = 0;
  if (mtp_) mtp_->restart(0);
}

void Session::rollback(int64_t n) {
  Busy busy(*this);
  std::lock_guard<std::mutex> lock(mu_);
  const auto held = static_cast<int64_t>(ids_.size());
  if (n < 0 || n > held)
    fail(ErrorKind::InvalidArgument,
         "cannot roll back " + std::to_string(n) + " tokens: the session holds " + std::to_string(held));
  kv_->truncate(held - n);  // refuses going back past what a sliding layer's ring holds
  ids_.resize(static_cast<std::size_t>(held - n));
  if (mtp_) mtp_->truncate(held - n);
}

void Session::close() {
  std::unique_lock<std::mutex> lock(mu_);
  if (closed_) return;
  closing_.store(true);
  if (!busy_) {
    release();
    return;
  }
  // A forward is running: it stops at its next layer and its Busy releases the session.
  // From its own thread (a progress callback closing the model) there is nothing to wait for.
  if (busy_thread_ == std::this_thread::get_id()) return;
  idle_.wait(lock, [&] { return closed_; });
}

void Session::release() {
  closed_ = true;
  kv_.reset();
  mtp_.reset();
  engine_.reset();
  std::vector<int32_t>().swap(ids_);
  std::vector<int32_t>().swap(last_routing_);
  last_routing_tokens_ = 0;
}

std::size_t Session::kv_bytes_for(int64_t n) const {
  std::lock_guard<std::mutex> lock(mu_);
  require_open();
  return kv_->bytes_for(n);
}

bool Session::holds_prefix(int64_t n) const {
  std::lock_guard<std::mutex> lock(mu_);
  require_open();
  return n >= 0 && n <= static_cast<int64_t>(ids_.size()) && kv_->holds_prefix(n) && kv_->holds_rollback(n);
}

std::size_t Session::kv_allocated_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  require_open();
  return kv_->bytes();
}

std::vector<uint8_t> Session::export_kv(int64_t n) {
  Busy busy(*this);
  std::lock_guard<std::mutex> lock(mu_);
  const auto held = static_cast<int64_t>(ids_.size());
  if (n < 0 || n > held)
    fail(ErrorKind::InvalidArgument, "cannot export " + std::to_string(n) + " positions: the session holds " +
                                         std::to_string(held));
  std::vector<uint8_t> out(kv_->bytes_for(n));
  kv_->export_to(n, out.data());
  return out;
}

void Session::import_kv(const uint8_t* data, std::size_t size, const std::vector<int32_t>& ids) {
  Busy busy(*this);
  const auto n = static_cast<int64_t>(ids.size());
  for (int32_t t : ids)
    if (t < 0 || t >= spec_.vocab_size)
      fail(ErrorKind::TokenOutOfRange, "imported token id " + std::to_string(t) + " is outside the vocabulary");
  std::lock_guard<std::mutex> lock(mu_);
  kv_->import_from(n, data, size);  // validates before changing anything
  ids_ = ids;
  last_routing_.clear();
  last_routing_tokens_ = 0;
  if (mtp_) mtp_->restart(n);
}

void Session::copy_prefix_from(Session& other, int64_t n) {
  if (&other == this) {  // keep the first n
    const int64_t held = n_tokens();
    if (n < 0 || n > held)
      fail(ErrorKind::InvalidArgument, "cannot keep " + std::to_string(n) + " tokens: the session holds " +
                                           std::to_string(held));
    rollback(held - n);
    return;
  }
  Busy busy(*this);
  Busy other_busy(other);
  std::unique_lock<std::mutex> a(mu_, std::defer_lock), b(other.mu_, std::defer_lock);
  std::lock(a, b);
  const auto held = static_cast<int64_t>(other.ids_.size());
  if (n < 0 || n > held)
    fail(ErrorKind::InvalidArgument, "cannot copy " + std::to_string(n) + " tokens: the source session holds " +
                                         std::to_string(held));
  kv_->copy_prefix(*other.kv_, n);
  ids_.assign(other.ids_.begin(), other.ids_.begin() + n);
  last_routing_.clear();
  last_routing_tokens_ = 0;
  if (mtp_) mtp_->restart(n);
}

void Session::replay_state(const CancelCheck* cancelled, ForwardStats* stats, int64_t chunk) {
  if (!kv_->has_state()) return;
  std::vector<int32_t> ids;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ids = ids_;
  }
  const auto held = static_cast<int64_t>(ids.size());
  if (held == 0 || kv_->state_tokens() == held) return;  // a forward at 0 starts from zeros
  const int64_t step = chunk > 0 ? chunk : held;
  for (int64_t done = 0; done < held; done += step)
    engine_->forward(*kv_, done, ids.data() + done, std::min(step, held - done), false, nullptr, nullptr,
                     cancelled, stats, nullptr);
}

bool Session::closed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return closed_;
}

}  // namespace colibri
