// The seam between the engine's layer loop and one layer's feed-forward part, as
// model/attention_layer.hpp is for attention: the engine norms the residual stream, calls
// the unit, adds the result back. A layer's FFN is a dense SwiGLU FFN or a MoE block: the
// layer's routing rule (model/routers/), the routed experts through the expert store (the
// union of the batch's experts, demand reads and waits), the optional shared expert and its
// gate, and the two prefetches that start expert reads early (the lookahead into the next
// MoE layer, the first-layer guess). One FfnBlock serves every layer of an engine; each
// layer's weights are an FfnWeights.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "model/expert_store.hpp"
#include "model/matmul.hpp"
#include "model/model_spec.hpp"
#include "model/phases.hpp"
#include "model/remote_experts.hpp"
#include "model/routers/router.hpp"
#include "model/weights.hpp"

namespace colibri {

class ThreadPool;

struct ExpertWeights {
  const Tensor* gate = nullptr;
  const Tensor* up = nullptr;
  const Tensor* down = nullptr;

  ExpertViews views() const { return ExpertViews{gate->view(), up->view(), down->view()}; }
};

// One layer's feed-forward weights. Routed experts are not here: the store streams them.
struct FfnWeights {
  int64_t layer = -1;                     // its layer, n_layers + j for MTP layer j (the store's)
  bool is_moe = false;
  ExpertWeights dense;                    // !is_moe
  const Tensor* router = nullptr;         // is_moe: (n_experts, hidden)
  const Tensor* router_bias = nullptr;    // is_moe, optional: (n_experts,) selection bias
  const Tensor* router_logit_bias = nullptr;  // spec.router_logit_bias: (n_experts,) added to the logits
  // spec.expert_bias: per-expert biases, (n_experts, moe_ffn) for gate and up and
  // (n_experts, hidden) for down, resident (the store streams only the matrices).
  const Tensor* gate_exps_bias = nullptr;
  const Tensor* up_exps_bias = nullptr;
  const Tensor* down_exps_bias = nullptr;
  const Router* route = nullptr;          // is_moe: the routing rule (owned by the FfnBlock)
  const FfnWeights* next_moe = nullptr;   // is_moe: the next MoE layer's (lookahead), null if none
  ExpertWeights shared;                   // shared expert, when the spec has one
  const Tensor* shared_gate = nullptr;    // (1, hidden) sigmoid gate of the shared expert
  // spec.hash_layers (DeepSeek-V4): (vocab, n_experts_per_tok) expert ids by token id, F32
  // holding whole numbers (checked at load); the router's scores weigh them.
  const Tensor* hash_eid = nullptr;
};

// One expert's biases (rows of FfnWeights' *_exps_bias), null when the model has none.
struct ExpertBiases {
  const float* gate = nullptr;
  const float* up = nullptr;
  const float* down = nullptr;
};

// What the unit may use during a forward: the compute team, the quantized-activation
// buffer, the expert store and the engine's phase timers.
struct FfnContext {
  ThreadPool& pool;
  ScratchBuffer& matmul;
  ActPrecision precision;
  ExpertStore& store;
  PhaseSeconds& phase;
  const int32_t* token_ids = nullptr;  // the rows' token ids: hash-routed layers need them
  RemoteExperts* remote = nullptr;     // experts computed elsewhere (model/remote_experts.hpp)
};

class FfnBlock {
 public:
  // Makes the spec's routing rule when it has MoE layers (or MTP layers, always MoE).
  explicit FfnBlock(const ModelSpec& spec);

  // Layer `layer`'s FFN weights, looked up in `weights` and checked against the spec
  // (Error(Format) naming a missing or misshapen tensor).
  FfnWeights resolve(const WeightStore& weights, int64_t layer, bool moe) const;

  // h: [n, hidden], the normed FFN input of n rows; writes the FFN output to out:
  // [n, hidden]. A MoE layer writes its routing to routing_out when not null ([n][n_layers]
  // [n_experts_per_tok], trunk layers only) and, when it fails (a read), leaves the store
  // consistent (abort) before the error goes on.
  void forward(FfnContext& ctx, const FfnWeights& W, const float* h, int64_t n, int32_t* routing_out, float* out);

  // The first-layer guess: before the first MoE layer's attention, that layer's experts
  // for each row, from x (the residual stream there, [n, hidden]) plus the previous
  // forward's attention part; `ffn_norm` and W are that layer's. Queued as prefetches.
  void guess_first_layer(FfnContext& ctx, const Tensor& ffn_norm, const FfnWeights& W, const float* x, int64_t n);
  // x: the first MoE layer's FFN input before its norm ([n, hidden]): keeps what its
  // attention added to the last row for the next forward's guess.
  void remember_first_input(const float* x, int64_t n);
  // A hash-routed layer (W.hash_eid): its experts follow from ctx.token_ids alone, so they
  // are queued as prefetches before its attention (exact, not a guess). The engine calls it
  // for the first MoE layer; the lookahead covers a hash layer after another MoE layer.
  void prefetch_hash_layer(FfnContext& ctx, const FfnWeights& W, int64_t n);
  // An expert worker's side of model/remote_experts.hpp: experts[i] over counts[i] rows of
  // `rows` ([sum(counts), hidden], expert after expert), each through the store and the same
  // kernels as the MoE block's, into out (same layout). Error(InvalidArgument) for an expert
  // or layer out of range.
  void compute_experts(FfnContext& ctx, const FfnWeights& W, const std::vector<int32_t>& experts,
                       const std::vector<int64_t>& counts, const float* rows, float* out);

 private:
  void moe_block(FfnContext& ctx, const FfnWeights& W, const float* h, int64_t n, int32_t* routing_out, float* out);
  void routed_experts(FfnContext& ctx, const FfnWeights& W, const float* h, int64_t n, const std::vector<int32_t>& sel,
                      bool* shared_pending);
  // Moves the remote experts out of `distinct` into remote_ and starts their batch; false
  // when there are none.
  bool start_remote(FfnContext& ctx, const FfnWeights& W, const float* h, int64_t n, const std::vector<int32_t>& sel,
                    std::vector<int32_t>* distinct);
  void finish_remote(FfnContext& ctx);
  void shared_expert(FfnContext& ctx, const FfnWeights& W, const float* h, int64_t n);
  void predict_next(FfnContext& ctx, const FfnWeights& W, const float* h, int64_t n);
  void expert_ffn(FfnContext& ctx, const ExpertViews& e, const float* x, int64_t n, int64_t ffn, float* out,
                  const ExpertBiases& bias = {});
  void activate(FfnContext& ctx, int64_t elems);

  const ModelSpec& spec_;
  std::unique_ptr<Router> router_;  // the spec's routing rule, shared by the MoE layers
  // Work buffers, grown on demand: SwiGLU's gate and up, router logits, each (token, slot)'s
  // expert output, one expert's input and output rows, the lookahead's router logits, the
  // shared expert's output.
  std::vector<float> gate_, up_, router_logits_, slot_out_, xe_, ye_, next_router_, shared_out_;
  // The layer's batch for the remote experts, the (token, slot) place of each of its rows,
  // and their results.
  RemoteBatch remote_;
  std::vector<int64_t> remote_slots_;
  std::vector<float> remote_out_;
  // The first-layer guess's context part: what the first MoE layer's attention added to the
  // residual stream of the latest forward's last row (its FFN input minus its input);
  // guess_base_ keeps that input of the current forward's last row.
  std::vector<float> guess_delta_, guess_base_, guess_h_;
  bool have_guess_delta_ = false;
};

}  // namespace colibri
