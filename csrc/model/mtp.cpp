// The MTP layer's forward (Engine::mtp_forward) and a session's MTP state (model/mtp.hpp).
#include "model/mtp.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>

#include "common/errors.hpp"
#include "model/ops.hpp"

namespace colibri {

void Engine::mtp_forward(int64_t j, KvCache& kv, int64_t slot0, const float* hidden, const int32_t* ids,
                         int64_t n, float* logits_out, float* hidden_out, const CancelCheck* cancelled,
                         ForwardStats* stats_out) {
  const ModelSpec& s = spec_;
  if (j < 0 || j >= static_cast<int64_t>(mtp_.size()))
    fail(ErrorKind::InvalidArgument, "the model has no MTP layer " + std::to_string(j));
  if (n <= 0) fail(ErrorKind::InvalidArgument, "an MTP forward needs at least one row");
  for (int64_t t = 0; t < n; ++t)
    if (ids[t] < 0 || ids[t] >= s.vocab_size)
      fail(ErrorKind::TokenOutOfRange, "token id " + std::to_string(ids[t]) + " is outside the vocabulary");
  if (slot0 < 0 || slot0 + n > kv.context_length())
    fail(ErrorKind::ContextOverflow, "the MTP forward runs past the context length");
  const MtpLayerWeights& M = mtp_[static_cast<std::size_t>(j)];
  kv.reserve(slot0 + n);
  std::lock_guard<std::mutex> lock(mu_);
  if (!store_->empty() && store_->slots() == 0)
    fail(ErrorKind::InvalidArgument, "the expert cache is not configured (Engine.configure_store)");
  // The expert and phase counters of the MTP forward go to the session's figures (not its
  // forward count: that counts trunk forwards).
  const CounterDeltaScope delta(stats_out, *store_, phase_, /*count_forward=*/false);
  const std::function<void()> stop_if_cancelled = [&] {
    if (cancelled && *cancelled && (*cancelled)()) {
      store_->abort();
      fail(ErrorKind::Cancelled, "the forward was interrupted");
    }
  };
  stop_if_cancelled();
  ThreadPool::ComputeScope scope(pool_);
  attn_ws_.dsa_keys.clear();
  const int64_t d = s.hidden_size;
  const auto nd = static_cast<std::size_t>(n * d);
  ws_.x.resize(nd);
  ws_.h.resize(nd);
  ws_.proj.resize(nd);
  ws_.mtp_cat.resize(2 * nd);
  // [enorm(embedding of the next token) | hnorm(hidden state)] per row, the order of
  // DeepSeek-V3's and transformers' MtpLayer.
  get_rows(M.embed->view(), ids, n, ws_.h.data());
  for (int64_t t = 0; t < n; ++t) {
    float* row = ws_.mtp_cat.data() + t * 2 * d;
    rms_norm_row(ws_.h.data() + t * d, M.enorm->f32(), d, s.rms_norm_eps, row);
    rms_norm_row(hidden + t * d, M.hnorm->f32(), d, s.rms_norm_eps, row + d);
  }
  mm(*M.eh_proj, ws_.mtp_cat.data(), n, ws_.x.data());
  AttentionContext actx{pool_, ws_.matmul, precision_, attn_ws_};
  FfnContext fctx{pool_, ws_.matmul, precision_, *store_, phase_};
  decoder_layer(M.block, s.n_layers + j, {AttnSegment{&kv, slot0, n}}, 0, n, actx, fctx, nullptr, stop_if_cancelled);

  const auto t0 = std::chrono::steady_clock::now();
  const float* last = ws_.x.data() + (n - 1) * d;
  rms_norm_row(last, M.shared_head_norm->f32(), d, s.rms_norm_eps, ws_.h.data());
  if (hidden_out) std::memcpy(hidden_out, ws_.h.data(), static_cast<std::size_t>(d) * sizeof(float));
  if (logits_out) mm(*M.head, ws_.h.data(), 1, logits_out);
  phase_[kLmHead] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

MtpState::MtpState(const Engine& engine, int64_t context_length, DType kv_type)
    : d_(engine.spec().hidden_size), vocab_(engine.spec().vocab_size) {
  if (engine.mtp_layers().empty())
    fail(ErrorKind::Unsupported, "the model has no multi-token-prediction layers (num_nextn_predict_layers)");
  kv_ = std::make_unique<KvCache>(std::vector<KvLayerLayout>{engine.mtp_kv_layout(0)}, context_length, kv_type);
}

void MtpState::restart(int64_t held) {
  origin_ = rows_from_ = end_ = held;
  valid_ = 0;
  hidden_.clear();
}

void MtpState::record(int64_t pos0, const float* hidden, int64_t n) {
  if (pos0 != end_) restart(pos0);
  hidden_.insert(hidden_.end(), hidden, hidden + n * d_);
  end_ = pos0 + n;
  // Nobody drafting (generations with MTP off on this session, or a very long prompt): the
  // states wait for the MTP layer; past kMaxPending its context restarts over the latest.
  if (end_ - (origin_ + valid_) > kMaxPending) {
    const int64_t from = end_ - kMaxPending;
    hidden_.erase(hidden_.begin(), hidden_.begin() + (from - rows_from_) * d_);
    origin_ = rows_from_ = from;
    valid_ = 0;
  }
}

void MtpState::truncate(int64_t held) {
  if (held >= end_) return;
  // Slot p joins h_p with x_{p+1}: committed slots must keep their token, p + 1 < held.
  const int64_t keep_to = std::min(origin_ + valid_, held - 1);
  if (keep_to < origin_ || keep_to < rows_from_) {
    restart(held);
    return;
  }
  valid_ = keep_to - origin_;
  end_ = held;
  hidden_.resize(static_cast<std::size_t>((end_ - rows_from_) * d_));
}

void MtpState::trim() {
  const int64_t from = std::max(rows_from_, origin_ + valid_ - kKeepRows);
  if (from <= rows_from_) return;
  hidden_.erase(hidden_.begin(), hidden_.begin() + (from - rows_from_) * d_);
  rows_from_ = from;
}

namespace {

int32_t argmax(const float* v, int64_t n) {
  return static_cast<int32_t>(std::max_element(v, v + n) - v);  // the first of equal maxima
}

}  // namespace

std::vector<int32_t> MtpState::draft(Engine& engine, const std::vector<int32_t>& ids, int32_t next, int64_t k,
                                     float* logits_out, const CancelCheck* cancelled, ForwardStats* stats) {
  const auto held = static_cast<int64_t>(ids.size());
  if (held != end_) restart(held);  // tokens forwarded while MTP was off
  std::vector<int32_t> out;
  const int64_t start = origin_ + valid_;  // the first uncommitted position
  if (k <= 0 || held == 0 || start >= held || start < rows_from_) return out;
  // Rows for positions [start, held): the trunk state and the token after it.
  const int64_t n = held - start;
  std::vector<int32_t> toks(static_cast<std::size_t>(n));
  for (int64_t t = 0; t + 1 < n; ++t) toks[static_cast<std::size_t>(t)] = ids[static_cast<std::size_t>(start + t + 1)];
  toks.back() = next;
  logits_.resize(static_cast<std::size_t>(vocab_));
  g_.resize(static_cast<std::size_t>(d_));
  const float* rows = hidden_.data() + (start - rows_from_) * d_;
  engine.mtp_forward(0, *kv_, start - origin_, rows, toks.data(), n, logits_.data(), g_.data(), cancelled, stats);
  valid_ = held - 1 - origin_;  // all but the slot of the token not in the session yet
  trim();
  for (int64_t depth = 0;; ++depth) {
    if (logits_out) std::memcpy(logits_out + depth * vocab_, logits_.data(), static_cast<std::size_t>(vocab_) * sizeof(float));
    out.push_back(argmax(logits_.data(), vocab_));
    const int64_t slot = held - origin_ + depth;  // the next depth's scratch slot
    if (depth + 1 >= k || slot >= kv_->context_length()) break;
    const std::vector<float> g(g_);
    engine.mtp_forward(0, *kv_, slot, g.data(), &out.back(), 1, logits_.data(), g_.data(), cancelled, stats);
  }
  return out;
}

}  // namespace colibri
