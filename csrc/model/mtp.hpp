// A session's multi-token-prediction state: the MTP layer's own KV cache, kept in step with
// the tokens the session holds, and the trunk's hidden states it has not consumed yet.
//
// DeepSeek-V3 / GLM's MTP module predicts the token after next: for the trunk's output
// h_p at position p (its last hidden state after the final norm: transformers'
// hidden_states[-1], what its MTPCandidateGenerator, vLLM and SGLang feed the MTP layer)
// and the token x_{p+1} that followed,
//   g_p = shared_head_norm(layer(eh_proj([enorm(embed(x_{p+1})) | hnorm(h_p)])))
// and head(g_p) are the logits for x_{p+2}. The layer attends over its own cache, one entry
// per pair (slot p - origin); RoPE is relative, so the slot numbering only has to be
// consistent. Deeper drafts chain the layer on its own output: g replaces h, the drafted
// token replaces x (as transformers' MtpModel passes one depth's output to the next).
//
// Slots [0, valid) are committed: built from trunk hidden states and tokens the session
// holds. A draft computes the pending slots (up to the one that joins the last trunk state
// with the token chosen after it, which is not in the session yet) and commits all but that
// last one; the chained slots after it are scratch, overwritten by the next draft. Rolling
// the session back uncommits the slots whose token went; a rollback deeper than the hidden
// states kept (kKeepRows) restarts the MTP's context at the rollback point (its drafts then
// see a shorter history: slower acceptance, never different output).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "model/engine.hpp"
#include "model/forward_stats.hpp"
#include "model/kv_cache.hpp"

namespace colibri {

class MtpState {
 public:
  // Trunk hidden states kept before the first uncommitted slot (for rollbacks).
  static constexpr int64_t kKeepRows = 64;
  // Trunk states kept at most ahead of the MTP layer (hidden floats each).
  static constexpr int64_t kMaxPending = 4096;

  MtpState(const Engine& engine, int64_t context_length, DType kv_type);

  // The trunk forwarded n tokens at positions [pos0, pos0 + n); hidden: their [n][hidden]
  // normed states. A gap (tokens forwarded while MTP was off) restarts the context.
  void record(int64_t pos0, const float* hidden, int64_t n);
  // The session now holds `held` tokens (a rollback).
  void truncate(int64_t held);
  // The session's tokens were replaced (import, copy, reset): `held` tokens without states.
  void restart(int64_t held);

  // Up to k greedy drafts (fewer when the context ends) to follow `ids` (the session's
  // tokens) and `next` (the token chosen after them, not forwarded yet). Writes each
  // depth's logits to logits_out ([k][vocab]) when not null. Empty when no trunk state is
  // available yet (right after a restart).
  std::vector<int32_t> draft(Engine& engine, const std::vector<int32_t>& ids, int32_t next, int64_t k,
                             float* logits_out, const CancelCheck* cancelled, ForwardStats* stats);

  int64_t origin() const { return origin_; }
  int64_t committed() const { return valid_; }
  std::size_t kv_bytes() const { return kv_->bytes(); }

 private:
  void trim();

  int64_t d_;
  int64_t vocab_;
  std::unique_ptr<KvCache> kv_;
  int64_t origin_ = 0;     // the session position of slot 0
  int64_t valid_ = 0;      // committed slots
  int64_t rows_from_ = 0;  // the session position of hidden_'s first row
  int64_t end_ = 0;        // positions recorded (the session's token count)
  std::vector<float> hidden_;  // trunk states of positions [rows_from_, end_)
  std::vector<float> logits_, g_;
};

}  // namespace colibri
