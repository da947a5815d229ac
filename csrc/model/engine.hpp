// A loaded model: spec, resident weights resolved per layer, the compute team and the
// shared work buffers. Sessions (model/session.hpp) hold the per-conversation state (KV
// cache) and call into the engine; one forward runs at a time per engine.
#pragma once
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "io/file_reader.hpp"
#include "model/attention_layer.hpp"
#include "model/expert_store.hpp"
#include "model/ffn_block.hpp"
#include "model/gpu_linear.hpp"
#include "model/hyper_conn.hpp"
#include "model/kv_cache.hpp"
#include "model/matmul.hpp"
#include "model/model_spec.hpp"
#include "model/phases.hpp"
#include "model/remote_experts.hpp"
#include "model/weights.hpp"
#include "threadpool/threadpool.hpp"

namespace colibri {

// The native container's blob of one expert (gate, up and down in one aligned range) and
// its checksum; other sources have none and their experts are read tensor by tensor.
struct ExpertBlob {
  int64_t layer = 0;
  int64_t expert = 0;
  Extent extent{};
  bool has_crc32 = false;
  uint32_t crc32 = 0;
};

struct LayerWeights {
  const Tensor* attn_norm = nullptr;
  std::unique_ptr<AttentionLayer> attention;  // this layer's attention kind, its weights inside
  const Tensor* ffn_norm = nullptr;
  FfnWeights ffn;                      // dense or MoE (model/ffn_block.hpp)
  HcWeights attn_hc, ffn_hc;           // spec.hc_mult > 0: each block's hyper-connection
};

// A multi-token-prediction layer: a decoder layer (always MoE) plus the projection that
// joins the next token's embedding with the trunk's hidden state. Not run by forward():
// mtp_forward() runs it (model/engine_forward.cpp, driven by a session's MtpState,
// model/mtp.hpp); its experts are in the store as layer n_layers + i.
struct MtpLayerWeights {
  LayerWeights block;
  const Tensor* eh_proj = nullptr;           // (hidden, 2 * hidden): [enorm(e) | hnorm(h)]
  const Tensor* enorm = nullptr;             // (hidden)
  const Tensor* hnorm = nullptr;             // (hidden)
  const Tensor* shared_head_norm = nullptr;  // (hidden)
  const Tensor* embed = nullptr;  // the layer's copy of the embedding, else the trunk's
  const Tensor* head = nullptr;   // the layer's copy of the LM head, else the trunk's
};

// Reusable float buffers for one forward call, grown on demand.
struct Workspace {
  std::vector<float> x, h, proj, ffn_out;  // residual stream, normed, attention out, FFN out
  std::vector<float> logits_rows;  // a batch's lm_head rows before they go to each row
  std::vector<int32_t> routing;    // a batch's routing, [rows][n_layers][top_k]
  std::vector<float> mtp_cat;      // MTP: [enorm(embedding) | hnorm(hidden)] per row
  ScratchBuffer matmul;
};

// Asked between layers of a forward (and by the session between prefill chunks): true stops
// the forward with Error(Cancelled). It is called once per layer, so it must be cheap; the
// binding's version reads a clock and only looks at Python's signals every few ms.
using CancelCheck = std::function<bool()>;

// One sequence of a batched forward (Engine::forward_batch).
struct BatchRow {
  class KvCache* kv = nullptr;
  int64_t pos0 = 0;                // positions [pos0, pos0 + n) of kv
  const int32_t* ids = nullptr;
  int64_t n = 0;
  bool all_logits = false;         // logits of every position ([n, vocab]), else of the last
  float* logits_out = nullptr;     // null: none (a prefill chunk before the last)
  int32_t* routing_out = nullptr;  // null, or [n][n_layers][n_experts_per_tok]
  float* hidden_out = nullptr;     // null, or [n][hidden]: every position's state after the final norm
};

// The wait policy asked for, as the engine runs it: Auto, or a fixed policy. `base` is the
// policy (with the team size and spin time) the pool runs while the work is compute-bound;
// under Auto, Engine::choose_wait_policy moves the pool to Passive while it is disk-bound.
// decide_wait() (engine.cpp) is the one place Auto is resolved.
struct WaitChoice {
  bool is_auto = false;
  ThreadSettings base;
};
WaitChoice decide_wait(const ThreadSettings& requested);

class Engine {
 public:
  // Routed experts (blk.{i}.ffn_{gate,up,down}_exps.{e}) are not loaded: they go to the
  // expert store, which reads them on demand once configure_store() has sized its cache.
  Engine(ModelSpec spec, const std::vector<TensorSpec>& tensors,
         const std::vector<std::string>& files, const ThreadSettings& threads,
         const std::vector<ExpertBlob>& blobs = {});

  const ModelSpec& spec() const { return spec_; }
  void configure_threads(const ThreadSettings& settings);
  void set_activation_precision(ActPrecision precision);
  ActPrecision activation_precision() const { return precision_; }
  // The settings in effect: with wait policy Auto, `policy` is the one auto chose last.
  ThreadSettings thread_settings() const;
  bool auto_wait_policy() const { return wait_.is_auto; }
  ThreadPoolStats thread_stats() const { return pool_.stats(); }
  void reset_thread_stats();
  std::size_t weight_bytes() const { return weights_.total_bytes(); }
  // Of those, the bytes in the row-lane layout (WeightStore::pack_lanes; 0 without AVX-512).
  std::size_t lane_weight_bytes() const { return lane_bytes_; }
  // What each layer keeps per position in a session's KV cache.
  std::vector<KvLayerLayout> kv_layouts() const;
  // Multi-token-prediction layers (run by mtp_forward, not by forward).
  const std::vector<MtpLayerWeights>& mtp_layers() const { return mtp_; }
  // What MTP layer j keeps per position in its own KV cache (one layer).
  KvLayerLayout mtp_kv_layout(int64_t j) const;

  // The streaming tier. configure_store drops every cached expert (never during a forward).
  void configure_store(const StoreSettings& settings);
  const ExpertStore& store() const { return *store_; }
  ExpertStoreStats store_stats() const;
  void reset_store_stats();
  void preload_experts();
  void set_expert_pins(const std::vector<int64_t>& keys);
  std::vector<uint64_t> route_counts() const;
  void set_io_fault(IoFault fault);
  void start_io_trace(std::size_t max_records) { store_->start_io_trace(max_records); }
  std::vector<ReadTraceRecord> io_trace() const { return store_->io_trace(); }
  PhaseSeconds phase_seconds() const;

  // EngineConfig(device="gpu"): opens adapter `adapter_index` of the wgpu-native library at
  // `library_path` and uploads the linear layers the first GPU slice runs there
  // (model/gpu_linear.hpp); `memory_budget` bytes of weights at most (0: no limit), the
  // rest stays on the CPU. Once per engine, before any forward. Throws DeviceUnavailable
  // (no usable adapter) leaving the engine on the CPU.
  void use_gpu(const std::string& library_path, int adapter_index, uint64_t memory_budget);
  // Where the matrices run and the GPU counters; null when the engine runs on the CPU only.
  std::unique_ptr<GpuReport> gpu_report() const;
  // Test hook: the DSA key selection (model/dsa_indexer.hpp) of the last forward's last
  // full indexer layer, in the attention kernels' sparse form: the queries' keys are
  // keys[offsets[t] .. offsets[t + 1]). Empty for a model without the indexer.
  std::pair<std::vector<int32_t>, std::vector<int64_t>> last_dsa_selection() const;

  // Expert workers (model/remote_experts.hpp; model/engine_remote.cpp). The coordinator's
  // side: the experts `remote` owns are computed through it from the next forward on (null:
  // every expert here again); its mask must be [n_layers + n_mtp_layers][n_experts]. A
  // worker's side: compute_experts runs experts[i] over counts[i] rows of `rows`
  // ([sum(counts), hidden]) of store layer `layer` into out (same layout), one call at a
  // time with the forwards.
  void set_remote_experts(std::shared_ptr<RemoteExperts> remote);
  bool has_remote_experts() const { return remote_ != nullptr; }
  void compute_experts(int64_t layer, const std::vector<int32_t>& experts, const std::vector<int64_t>& counts,
                       const float* rows, float* out);

  // Forward of n tokens at positions [pos0, pos0 + n) with the given KV cache (owned by a
  // session). Writes logits of the last position, or of every position when all_logits;
  // none when logits_out is null (a prefill chunk that is not the last: the lm_head is
  // skipped). Validates ids before touching any state. When routing_out is not null it
  // receives the selected experts, [n][n_layers][n_experts_per_tok] in router order (-1 for
  // dense layers). `cancelled` (may be null) is asked between layers; when it says stop,
  // the forward throws Error(Cancelled) and has written only KV entries at positions >= pos0,
  // which the session does not count. When stats_out is not null, this forward's share of
  // the expert and phase counters is added to it (measured under the engine lock, so it is
  // this forward's alone: see model/forward_stats.hpp).
  // When hidden_out is not null it receives every position's last hidden state after the
  // final norm, [n][hidden] (what an MTP layer joins with the next token's embedding: the
  // main model's output representation, as transformers' MTPCandidateGenerator, vLLM and
  // SGLang feed it).
  void forward(class KvCache& kv, int64_t pos0, const int32_t* ids, int64_t n, bool all_logits,
               float* logits_out, int32_t* routing_out = nullptr,
               const CancelCheck* cancelled = nullptr, struct ForwardStats* stats_out = nullptr,
               float* hidden_out = nullptr);

  // MTP layer j over n rows at slots [slot0, slot0 + n) of its own one-layer KV cache: row t
  // joins hidden[t] (the trunk's normed hidden state at some position p, or the previous
  // depth's output) with the embedding of ids[t] (the token at p + 1), runs the decoder
  // layer and the shared head norm. Writes the last row's logits ([vocab]) and its normed
  // output ([hidden]: the next depth's `hidden`) when the pointers are not null.
  void mtp_forward(int64_t j, class KvCache& kv, int64_t slot0, const float* hidden, const int32_t* ids,
                   int64_t n, float* logits_out, float* hidden_out, const CancelCheck* cancelled = nullptr,
                   struct ForwardStats* stats_out = nullptr);

  // Continuous batching: one forward over several sequences, each row its own KV cache,
  // positions and tokens (decode steps, prefill chunks, mixed). The dense matmuls run over
  // every row together, attention per row against its own cache, and the MoE block over
  // the union of the rows' experts (one read and one matmul per distinct expert). forward()
  // is the one-row case, so a row's logits are the same bits alone or in any batch. Every
  // row is validated before any state is touched; the rows' caches must be distinct. A
  // model with the DSA indexer runs the rows one after the other (its shared layers reuse
  // one forward's key selection), still in this one call.
  void forward_batch(const std::vector<BatchRow>& rows, const CancelCheck* cancelled = nullptr,
                     struct ForwardStats* stats_out = nullptr);

 private:
  void resolve_layers();
  void resolve_layer(LayerWeights& L, int64_t layer, bool moe);
  // One decoder layer on ws_.x (n rows: the segments' tokens one after the other):
  // attention of each segment with layer kv_layer of its own cache, then the FFN over all
  // rows (its experts are the store's layer L.ffn.layer). `between` runs between the two
  // (the cancel check).
  void decoder_layer(const LayerWeights& L, const std::vector<AttnSegment>& segs, int64_t kv_layer, int64_t n,
                     AttentionContext& actx, FfnContext& fctx, int32_t* routing_out,
                     const std::function<void()>& between);
  // decoder_layer with hyper-connections (spec.hc_mult > 0; model/engine_hc.cpp): ws_.x
  // holds hc_mult streams per row; each block's input is their collapse, its output is
  // spread back over them.
  void decoder_layer_hc(const LayerWeights& L, const std::vector<AttnSegment>& segs, int64_t kv_layer, int64_t n,
                        AttentionContext& actx, FfnContext& fctx, int32_t* routing_out,
                        const std::function<void()>& between);
  // hc_mult > 0: the embedding rows copied into every stream (before the layers), and the
  // hyper head's collapse back to one row each (after them), in ws_.x.
  void hc_expand_embedding(int64_t n);
  void hc_collapse_head(int64_t n);
  void forward_rows(const std::vector<BatchRow>& rows, const CancelCheck* cancelled, struct ForwardStats* stats_out);
  void lm_head(const std::vector<BatchRow>& rows);
  void choose_wait_policy(double wait_seconds, double total_seconds);
  void mm(const Tensor& w, const float* x, int64_t n, float* y);

  ModelSpec spec_;
  FileSet files_;
  WeightStore weights_;
  std::size_t lane_bytes_ = 0;
  const Tensor* token_embd_ = nullptr;
  const Tensor* output_norm_ = nullptr;
  const Tensor* output_ = nullptr;  // token_embd_ when tied
  std::vector<LayerWeights> layers_;
  std::vector<MtpLayerWeights> mtp_;
  int64_t first_moe_ = -1;  // the first MoE layer (the first-layer guess's target)
  HcWeights hc_head_;        // spec.hc_mult > 0: the hyper head (output_hc_*)
  HcMix hc_mix_;
  std::vector<float> hc_tmp_;
  std::unique_ptr<ExpertStore> store_;
  WaitChoice wait_;  // before pool_: the pool starts with wait_.base
  ThreadPool pool_;
  Workspace ws_;
  AttentionScratch attn_ws_;
  FfnBlock ffn_{spec_};  // the FFN of every layer, its routing rule and MoE prefetch state
  std::shared_ptr<RemoteExperts> remote_;  // null: every routed expert computed here
  PhaseSeconds phase_{};
  double wait_share_ = 0.0;      // smoothed expert-wait share of recent forwards (Auto)
  ActPrecision precision_ = ActPrecision::Int8;
  // One forward at a time per engine (shared pool, workspace, store); also guards the
  // store's and phases' counters against a stats call from another thread.
  mutable std::mutex mu_;
  // Last: destroyed first, it detaches the tensors it points at the GPU.
  std::unique_ptr<GpuOffload> gpu_;
};

}  // namespace colibri
