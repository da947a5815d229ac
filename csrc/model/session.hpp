// One conversation's state on a loaded model: the KV cache and the number of tokens in it.
// Many sessions can share one Engine (and later its expert cache).
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "model/engine.hpp"
#include "model/forward_stats.hpp"
#include "model/kv_cache.hpp"

namespace colibri {

class Session {
 public:
  Session(std::shared_ptr<Engine> engine, int64_t context_length)
      : engine_(std::move(engine)), kv_(engine_->kv_layouts(), context_length) {}

  // Appends n tokens; writes logits of the last one ([vocab]) or of all ([n, vocab]).
  // On error (bad token id, context overflow) the session is unchanged.
  void forward(const int32_t* ids, int64_t n, bool all_logits, float* logits_out) {
    std::lock_guard<std::mutex> lock(mu_);  // the GIL is released: two Python threads may race
    const ModelSpec& s = engine_->spec();
    const int64_t k = s.n_experts_per_tok;
    std::vector<int32_t> routing(k > 0 ? static_cast<std::size_t>(n * s.n_layers * k) : 0);
    engine_->forward(kv_, n_tokens_, ids, n, all_logits, logits_out, k > 0 ? routing.data() : nullptr,
                     &stats_);
    n_tokens_ += n;
    last_routing_ = std::move(routing);
    last_routing_tokens_ = n;
  }

  // Experts selected during the last forward: [tokens][layers][top_k] (empty: dense model).
  const std::vector<int32_t>& last_routing() const { return last_routing_; }
  int64_t last_routing_tokens() const { return last_routing_tokens_; }

  // The expert cache, expert I/O and phase-time counters of this session's forwards
  // (model/forward_stats.hpp), cumulative since it was made.
  ForwardStats forward_stats() {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }

  int64_t n_tokens() const { return n_tokens_; }
  int64_t vocab_size() const { return engine_->spec().vocab_size; }
  const ModelSpec& spec() const { return engine_->spec(); }
  int64_t context_length() const { return kv_.context_length(); }
  void reset() {
    std::lock_guard<std::mutex> lock(mu_);
    n_tokens_ = 0;
  }
  // Forgets the last n tokens (their KV entries are overwritten by the next forward).
  void rollback(int64_t n);

  // The KV state as bytes (Session.save/load, the prompt cache). INTERIM, for the current
  // F32 KvCache only (csrc/model/kv_state_interim.cpp): the same names and meaning as the
  // type-agnostic state API of the attention branch, which replaces this block when it
  // lands. kv_type() is "f32".
  const char* kv_type() const { return "f32"; }
  std::size_t kv_bytes_for(int64_t n) const;
  std::size_t kv_allocated_bytes() const { return kv_.bytes(); }
  // Positions [0, n) (n <= n_tokens) as kv_bytes_for(n) bytes.
  std::vector<uint8_t> export_kv(int64_t n);
  // Replaces the state by n positions exported from a session of the same model and KV type;
  // the session then holds n tokens. Checks the size before changing anything.
  void import_kv(const uint8_t* data, std::size_t size, int64_t n);
  // Copies the first n tokens' KV state of `other` (same model); holds n tokens.
  void copy_prefix_from(Session& other, int64_t n);

 private:
  std::shared_ptr<Engine> engine_;
  KvCache kv_;
  std::mutex mu_;
  int64_t n_tokens_ = 0;
  std::vector<int32_t> last_routing_;
  int64_t last_routing_tokens_ = 0;
  ForwardStats stats_;
};

}  // namespace colibri
