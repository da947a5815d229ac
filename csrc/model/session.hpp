// One conversation's state on a loaded model: the KV cache and the tokens in it. Many
// sessions can share one Engine (and its expert cache).
//
// The state is all or nothing: a forward that fails, is cancelled (Ctrl-C) or is stopped by
// a progress callback leaves the session exactly as before the call (its token count, ids
// and last routing; KV entries past the count may have been written, and are overwritten
// by the next forward). One call at a time: a call made while another thread's call on the
// same session runs is refused (InvalidArgument), it does not wait.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "model/engine.hpp"
#include "model/forward_stats.hpp"
#include "model/kv_cache.hpp"
#include "model/mtp.hpp"

namespace colibri {

// What a long forward reports and listens to. Every member may be empty / zero.
struct ForwardHooks {
  // Tokens per prefill chunk (0: the whole batch at once). Chunking changes no bit of the
  // result: every position's logits come from the same per-row kernels either way.
  int64_t chunk = 0;
  // Asked between layers and chunks; true stops the forward (Error(Cancelled)).
  CancelCheck cancelled;
  // After each chunk: tokens done so far and the total. It may throw to stop the forward.
  std::function<void(int64_t done, int64_t total)> progress;
};

class Session;

// One session's part of a batched step (Session::forward_batch).
struct SessionStep {
  Session* session = nullptr;
  const int32_t* ids = nullptr;
  int64_t n = 0;
  bool all_logits = false;
  float* logits_out = nullptr;  // [vocab], or [n, vocab] when all_logits
};

class Session {
 public:
  // kv_type: the KV cache's storage type (F32, F16, BF16, Q8_0).
  Session(std::shared_ptr<Engine> engine, int64_t context_length, DType kv_type = DType::F32);

  // Appends n tokens; writes logits of the last one ([vocab]) or of all ([n, vocab]).
  // On any error the session is unchanged.
  void forward(const int32_t* ids, int64_t n, bool all_logits, float* logits_out,
               const ForwardHooks& hooks = {});

  // Continuous batching: appends each step's tokens to its session in ONE engine forward
  // (Engine::forward_batch): the sessions must be distinct and share one engine. All or
  // nothing, as forward(): on any error (a row's bad id or overflow, a failed read, a
  // cancellation, one of the sessions closed meanwhile) no session changes. No chunking
  // here: the caller sizes each step (a prefill chunk is a row like a decode token).
  // Each session's forward_stats count the whole step (the step's expert reads are shared
  // by its rows: the figures of a session say what its forwards waited for).
  static void forward_batch(const std::vector<SessionStep>& steps, const CancelCheck& cancelled = {});

  // The expert cache, expert I/O and phase-time counters of this session's forwards
  // (model/forward_stats.hpp), cumulative since it was made; a failed or cancelled
  // forward's work counts too.
  ForwardStats forward_stats() const;

  // Experts selected during the last forward: [tokens][layers][top_k] (empty: dense model).
  std::vector<int32_t> last_routing() const;
  int64_t last_routing_tokens() const;

  int64_t n_tokens() const;
  std::vector<int32_t> token_ids() const;
  int64_t vocab_size() const { return spec_.vocab_size; }
  const ModelSpec& spec() const { return spec_; }
  int64_t context_length() const;
  void reset();
  // Forgets the last n tokens (their KV entries are overwritten by the next forward).
  // Error(InvalidArgument) when a sliding-window layer's ring no longer holds the window
  // before the new end (kv_cache.hpp: always fine within kRingSlack + 1 tokens).
  void rollback(int64_t n);
  // Whether the session can go back to its first n tokens (rollback, export_kv,
  // copy_prefix_from): always without sliding-window rings (kv_cache.hpp).
  bool holds_prefix(int64_t n) const;
  // Multi-token prediction (model/mtp.hpp): from now on the session records the trunk's
  // hidden states and keeps the MTP layer's KV cache in step with its tokens. Tokens it
  // already holds have no recorded states: the MTP's context starts after them.
  // Error(Unsupported) when the model has no MTP layer. Idempotent.
  void enable_mtp();
  bool mtp_enabled() const;
  // Up to k greedy MTP drafts to follow the session's tokens and `next` (the token chosen
  // after them, not forwarded yet); each depth's logits to logits_out ([k][vocab]) if set.
  std::vector<int32_t> mtp_draft(int32_t next, int64_t k, float* logits_out = nullptr);
  // The MTP's committed slots and their first session position (tests, diagnostics).
  int64_t mtp_committed() const;
  int64_t mtp_origin() const;
  // Bytes the MTP layer's own KV cache holds now (its allocation; 0 until enable_mtp).
  std::size_t mtp_kv_allocated_bytes() const;

  // Frees the KV cache and lets go of the engine; a forward running in another thread is
  // cancelled at its next layer and waited for. Every later call fails ("the model is
  // closed"). Idempotent.
  void close();
  bool closed() const;

  // The KV state, type-agnostic (Session save/load, prompt caching; see kv_cache.hpp).
  DType kv_type() const { return kv_type_; }
  std::size_t kv_bytes_for(int64_t n) const;
  std::size_t kv_allocated_bytes() const;
  // Positions [0, n) (n <= n_tokens) as kv_bytes_for(n) bytes.
  std::vector<uint8_t> export_kv(int64_t n);
  // Replaces the state by the positions of `ids` exported from a session of the same model
  // and KV type; the session then holds those tokens.
  void import_kv(const uint8_t* data, std::size_t size, const std::vector<int32_t>& ids);
  // The first n tokens of `other` (same layout and KV type), n <= other.n_tokens(); the session
  // then holds n tokens. `other` may be this session (then it keeps its first n).
  void copy_prefix_from(Session& other, int64_t n);

 private:
  class Busy;  // marks the session in use for one call (refuses a second)
  void require_open() const;  // mu_ held
  void release();             // mu_ held, not busy: frees the KV cache, drops the engine
  // Linear-attention models: brings the recurrent state up to the session's tokens when it
  // holds another count (after a rollback, an import, a partial copy or a failed forward)
  // by running them again from position 0 (model/linear_attn_gdn.hpp). Busy held.
  void replay_state(const CancelCheck* cancelled, ForwardStats* stats, int64_t chunk);

  std::shared_ptr<Engine> engine_;
  const ModelSpec spec_;  // a copy: stays readable after close()
  std::unique_ptr<KvCache> kv_;
  std::unique_ptr<MtpState> mtp_;  // null until enable_mtp()
  int64_t context_length_;
  DType kv_type_;

  // Guards everything below; held only for short sections, never during the compute.
  mutable std::mutex mu_;
  std::condition_variable idle_;
  bool busy_ = false;
  std::thread::id busy_thread_;
  bool closed_ = false;
  std::atomic<bool> closing_{false};  // read by the running forward's cancel check
  std::vector<int32_t> ids_;          // the tokens in the KV cache, in order
  std::vector<int32_t> last_routing_;
  int64_t last_routing_tokens_ = 0;
  ForwardStats stats_;
};

}  // namespace colibri
