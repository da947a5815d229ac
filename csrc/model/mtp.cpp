// A session's MTP state (model/mtp.hpp); the MTP layer's forward is
// Engine::mtp_forward (model/engine_forward.cpp).
#include "model/mtp.hpp"

#include <algorithm>
#include <cstring>

#include "common/errors.hpp"

namespace colibri {

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
