// The engine's load (the spec checked, resident weights read and resolved per layer, the
// routed experts handed to the store) and its configuration and counters. The forward
// passes are in model/engine_forward.cpp.
#include "model/engine.hpp"

#include <algorithm>
#include <regex>

#include "common/errors.hpp"
#include "model/norm_offset.hpp"
#include "quant/dot_tiles.hpp"

namespace colibri {

namespace {

void check_spec(const ModelSpec& s) {
  auto positive = [](int64_t v, const char* what) {
    if (v <= 0) fail(ErrorKind::InvalidArgument, std::string("model spec: ") + what + " must be > 0");
  };
  positive(s.vocab_size, "vocab_size");
  positive(s.hidden_size, "hidden_size");
  positive(s.n_layers, "n_layers");
  positive(s.n_heads, "n_heads");
  positive(s.n_kv_heads, "n_kv_heads");
  positive(s.head_dim, "head_dim");
  positive(s.context_length, "context_length");
  if (s.n_heads % s.n_kv_heads != 0)
    fail(ErrorKind::InvalidArgument, "model spec: n_heads must be a multiple of n_kv_heads");
  const auto rot = static_cast<int64_t>(s.rope_inv_freq.size()) * 2;
  if (rot == 0 || rot > s.head_dim)
    fail(ErrorKind::InvalidArgument, "model spec: rope_inv_freq must have 1..head_dim/2 entries");
  if (!s.moe_layers.empty() && static_cast<int64_t>(s.moe_layers.size()) != s.n_layers)
    fail(ErrorKind::InvalidArgument, "model spec: moe_layers must have one entry per layer");
  const bool any_moe = std::any_of(s.moe_layers.begin(), s.moe_layers.end(), [](uint8_t b) { return b; });
  if ((any_moe || s.n_mtp_layers > 0) &&
      (s.n_experts <= 0 || s.n_experts_per_tok <= 0 || s.n_experts_per_tok > s.n_experts))
    fail(ErrorKind::InvalidArgument, "model spec: MoE layers need 0 < n_experts_per_tok <= n_experts");
  if (s.n_mtp_layers < 0) fail(ErrorKind::InvalidArgument, "model spec: n_mtp_layers must be >= 0");
  if (s.hc_mult < 0 || (s.hc_mult > 0 && (s.hc_sinkhorn_iters < 1 || !(s.hc_eps >= 0.0f) || s.n_mtp_layers > 0)))
    fail(ErrorKind::InvalidArgument,
         "model spec: hyper-connections need hc_mult >= 0, hc_sinkhorn_iters >= 1, hc_eps >= 0 and no MTP layers");
  if (!s.hash_layers.empty() && static_cast<int64_t>(s.hash_layers.size()) != s.n_layers)
    fail(ErrorKind::InvalidArgument, "model spec: hash_layers must have one entry per layer");
  if (s.attention_kind == AttentionKind::Mla) {
    positive(s.kv_lora_rank, "kv_lora_rank");
    positive(s.qk_nope_head_dim, "qk_nope_head_dim");
    positive(s.qk_rope_head_dim, "qk_rope_head_dim");
    positive(s.v_head_dim, "v_head_dim");
    if (s.head_dim != s.qk_nope_head_dim + s.qk_rope_head_dim || s.n_kv_heads != s.n_heads)
      fail(ErrorKind::InvalidArgument, "model spec: MLA needs head_dim = qk_nope + qk_rope and n_kv_heads = n_heads");
    if (rot != s.qk_rope_head_dim)
      fail(ErrorKind::InvalidArgument, "model spec: MLA rotates exactly qk_rope_head_dim dimensions");
    if (s.q_lora_rank < 0) fail(ErrorKind::InvalidArgument, "model spec: q_lora_rank must be >= 0");
  }
  if (s.sliding_window < 0) fail(ErrorKind::InvalidArgument, "model spec: sliding_window must be >= 0");
  if (!s.sliding_layers.empty() && static_cast<int64_t>(s.sliding_layers.size()) != s.n_layers)
    fail(ErrorKind::InvalidArgument, "model spec: sliding_layers must have one entry per layer");
  const bool any_sliding = std::any_of(s.sliding_layers.begin(), s.sliding_layers.end(), [](uint8_t b) { return b; });
  if (any_sliding && s.sliding_window == 0)
    fail(ErrorKind::InvalidArgument, "model spec: sliding_layers need a sliding_window > 0");
  if (s.sliding_n_kv_heads < 0 || (s.sliding_n_kv_heads > 0 && s.n_heads % s.sliding_n_kv_heads != 0))
    fail(ErrorKind::InvalidArgument, "model spec: n_heads must be a multiple of sliding_n_kv_heads");
  if (!s.sliding_rope_inv_freq.empty() && s.sliding_rope_inv_freq.size() != s.rope_inv_freq.size())
    fail(ErrorKind::InvalidArgument, "model spec: sliding_rope_inv_freq must rotate as many pairs as rope_inv_freq");
  if (s.v_head_dim < 0) fail(ErrorKind::InvalidArgument, "model spec: v_head_dim must be >= 0");
  const bool v4 = s.attention_kind == AttentionKind::V4Sliding;
  if ((any_sliding || s.attention_sinks || s.attention_out_bias) && s.attention_kind != AttentionKind::Gqa && !v4)
    fail(ErrorKind::InvalidArgument,
         "model spec: sliding windows, attention sinks and the output bias are implemented for GQA only");
  if (s.rope_interleaved && s.attention_kind != AttentionKind::Mla && !v4)
    fail(ErrorKind::InvalidArgument, "model spec: interleaved RoPE is implemented for MLA only");
  if (!s.compress_ratios.empty() &&
      (!v4 || static_cast<int64_t>(s.compress_ratios.size()) != s.n_layers ||
       (!s.csa_layers.empty() && s.csa_layers.size() != s.compress_ratios.size())))
    fail(ErrorKind::InvalidArgument,
         "model spec: compress_ratios (and csa_layers) need V4 attention and one entry per layer");
  if (s.index_n_heads > 0 && !v4) {  // a V4 indexer is checked by its layer (attn_v4_compressed.cpp)
    if (s.attention_kind != AttentionKind::Mla)
      fail(ErrorKind::InvalidArgument, "model spec: the DSA indexer needs MLA attention");
    positive(s.index_head_dim, "index_head_dim");
    positive(s.index_topk, "index_topk");
    if (static_cast<int64_t>(s.indexer_full.size()) != s.n_layers || s.indexer_full[0] == 0)
      fail(ErrorKind::InvalidArgument,
           "model spec: indexer_full needs one entry per layer, the first layer running its own indexer");
  }
}

// blk.{layer}.ffn_{gate,up,down}_exps.{expert}: a routed expert's matrix (streamed).
bool parse_expert_name(const std::string& name, int64_t* layer, int* proj, int64_t* expert) {
  static const std::regex re(R"(^blk\.(\d+)\.ffn_(gate|up|down)_exps\.(\d+)$)");
  std::smatch m;
  if (!std::regex_match(name, m, re)) return false;
  *layer = std::stoll(m[1].str());
  *proj = m[2].str() == "gate" ? 0 : (m[2].str() == "up" ? 1 : 2);
  *expert = std::stoll(m[3].str());
  return true;
}

std::vector<TensorSpec> resident_tensors(const std::vector<TensorSpec>& tensors) {
  std::vector<TensorSpec> out;
  int64_t l, e;
  int p;
  for (const auto& t : tensors)
    if (!parse_expert_name(t.name, &l, &p, &e)) out.push_back(t);
  return out;
}

// Gathers each routed expert's three matrices (with the container's blob, if any) and
// checks their shapes against the spec.
std::vector<ExpertSource> expert_sources(const ModelSpec& s, const std::vector<TensorSpec>& tensors,
                                         const std::vector<ExpertBlob>& blobs) {
  const int64_t ne = std::max<int64_t>(s.n_experts, 0);
  const int64_t n_layers = s.n_layers + s.n_mtp_layers;  // MTP layers' experts are streamed too
  std::vector<ExpertSource> by_key(static_cast<std::size_t>(n_layers * ne));
  std::vector<uint8_t> seen(by_key.size() * 3, 0);
  int64_t layer, expert;
  int proj;
  for (const auto& t : tensors) {
    if (!parse_expert_name(t.name, &layer, &proj, &expert)) continue;
    if (layer >= n_layers || expert >= ne)
      fail(ErrorKind::Format, "tensor '" + t.name + "' is outside the model's " + std::to_string(n_layers) +
                                  " layers x " + std::to_string(ne) + " experts");
    const int64_t rows = proj == 2 ? s.hidden_size : s.moe_intermediate_size;
    const int64_t cols = proj == 2 ? s.moe_intermediate_size : s.hidden_size;
    if (t.shape.size() != 2 || t.shape[0] != rows || t.shape[1] != cols)
      fail(ErrorKind::Format, "expert tensor '" + t.name + "' does not have the shape " + std::to_string(rows) +
                                  "x" + std::to_string(cols) + " the config implies");
    const auto k = static_cast<std::size_t>(layer * ne + expert);
    ExpertSource& src = by_key[k];
    src.layer = layer;
    src.expert = expert;
    (proj == 0 ? src.gate : proj == 1 ? src.up : src.down) = t;
    seen[k * 3 + static_cast<std::size_t>(proj)] = 1;
  }
  for (const auto& b : blobs) {
    if (b.layer < 0 || b.layer >= n_layers || b.expert < 0 || b.expert >= ne)
      fail(ErrorKind::Format, "expert blob for layer " + std::to_string(b.layer) + " expert " +
                                  std::to_string(b.expert) + " is outside the model");
    ExpertSource& src = by_key[static_cast<std::size_t>(b.layer * ne + b.expert)];
    src.blob = b.extent;
    src.has_crc32 = b.has_crc32;
    src.crc32 = b.crc32;
  }
  std::vector<ExpertSource> out;
  for (int64_t li = 0; li < n_layers; ++li) {
    const bool moe = li >= s.n_layers || (!s.moe_layers.empty() && s.moe_layers[static_cast<std::size_t>(li)]);
    for (int64_t e = 0; e < ne; ++e) {
      const auto k = static_cast<std::size_t>(li * ne + e);
      const int have = seen[k * 3] + seen[k * 3 + 1] + seen[k * 3 + 2];
      if (!moe) {
        if (have) fail(ErrorKind::Format, "layer " + std::to_string(li) + " is dense but has expert tensors");
        continue;
      }
      if (have != 3)
        fail(ErrorKind::Format, "the model has no tensor 'blk." + std::to_string(li) + ".ffn_" +
                                    (seen[k * 3] ? (seen[k * 3 + 1] ? "down" : "up") : "gate") + "_exps." +
                                    std::to_string(e) + "'");
      out.push_back(std::move(by_key[k]));
    }
  }
  return out;
}

// Whether a resident matrix goes into the row-lane layout: where the best kernels for its
// type read it directly (the AVX-512 Q4_1 / Q8_0 row-lane kernels; elsewhere the layout would
// only cost an unpack). Not MLA's per-head matrices, whose heads need not be whole groups.
bool lane_layout_pays(const Tensor& t) {
  if (t.name.find("attn_k_b") != std::string::npos || t.name.find("attn_v_b") != std::string::npos) return false;
  if (t.name.find("attn_output_a") != std::string::npos) return false;  // V4's groups: per-group row blocks
  const DotTile* tile = dot_tile_for(kernels(t.type));
  return tile && tile->packed_rows && tile->packed_tile;
}

// Auto's compute-bound policy: a bounded spin (Hybrid), except on Apple Silicon, where CPU
// and GPU share one power budget and both seed measurements favoured sleeping even for
// pure-CPU decode (docs/tuning.md).
#if defined(__APPLE__) && defined(__aarch64__)
constexpr WaitPolicy kAutoComputeBound = WaitPolicy::Passive;
#else
constexpr WaitPolicy kAutoComputeBound = WaitPolicy::Hybrid;
#endif

}  // namespace

// The wait policy's Auto is decided here and nowhere else: Python passes "auto" through and
// reads the choice back (Engine::auto_wait_policy, thread_settings). The team starts on the
// compute-bound policy until choose_wait_policy() sees the forwards wait on the disk.
WaitChoice decide_wait(const ThreadSettings& requested) {
  WaitChoice c;
  c.is_auto = requested.policy == WaitPolicy::Auto;
  c.base = requested;
  if (c.is_auto) c.base.policy = kAutoComputeBound;
  return c;
}

Engine::Engine(ModelSpec spec, const std::vector<TensorSpec>& tensors,
               const std::vector<std::string>& files, const ThreadSettings& threads,
               const std::vector<ExpertBlob>& blobs)
    // check_spec runs before any weight is read (the comma operator sequences it).
    : spec_(std::move(spec)), files_(files),
      weights_((check_spec(spec_), resident_tensors(tensors)), files_),
      wait_(decide_wait(threads)),
      pool_(wait_.base) {
  weights_.verify_checksums(pool_);
  lane_bytes_ = weights_.pack_lanes(pool_, lane_layout_pays);
  store_ = std::make_unique<ExpertStore>(spec_.n_layers + spec_.n_mtp_layers, spec_.n_experts,
                                         expert_sources(spec_, tensors, blobs), files);
  apply_norm_weight_offset(spec_, weights_);
  resolve_layers();
}

void Engine::resolve_layers() {
  const ModelSpec& s = spec_;
  const int64_t d = s.hidden_size;
  auto req = [&](const std::string& name) { return &weights_.get(name); };

  token_embd_ = req("token_embd");
  check_shape(token_embd_, s.vocab_size, d);
  output_norm_ = req("output_norm");
  check_shape(output_norm_, 1, d);
  output_ = s.tie_word_embeddings ? token_embd_ : req("output");
  check_shape(output_, s.vocab_size, d);

  if (s.hc_mult > 0) hc_head_ = resolve_hc(s, weights_, "output_hc", true);
  layers_.resize(static_cast<std::size_t>(s.n_layers));
  for (int64_t i = 0; i < s.n_layers; ++i)
    resolve_layer(layers_[static_cast<std::size_t>(i)], i, !s.moe_layers.empty() && s.moe_layers[static_cast<std::size_t>(i)]);
  int64_t next = -1;
  for (int64_t i = s.n_layers - 1; i >= 0; --i) {
    LayerWeights& L = layers_[static_cast<std::size_t>(i)];
    if (next >= 0) L.ffn.next_moe = &layers_[static_cast<std::size_t>(next)].ffn;
    if (L.ffn.is_moe) next = i;
  }
  first_moe_ = next;
  mtp_.resize(static_cast<std::size_t>(s.n_mtp_layers));
  for (int64_t j = 0; j < s.n_mtp_layers; ++j) {
    const int64_t i = s.n_layers + j;
    MtpLayerWeights& M = mtp_[static_cast<std::size_t>(j)];
    resolve_layer(M.block, i, true);
    const std::string p = "blk." + std::to_string(i) + ".nextn.";
    M.eh_proj = req(p + "eh_proj");
    check_shape(M.eh_proj, d, 2 * d);
    M.enorm = req(p + "enorm");
    check_shape(M.enorm, 1, d);
    M.hnorm = req(p + "hnorm");
    check_shape(M.hnorm, 1, d);
    M.shared_head_norm = req(p + "shared_head_norm");
    check_shape(M.shared_head_norm, 1, d);
    // The checkpoints' copies of the embedding and head (DeepSeek-V3 and GLM store them
    // equal to the trunk's); the trunk's when the file leaves them out.
    M.embed = weights_.find(p + "embed_tokens");
    if (M.embed == nullptr) M.embed = token_embd_;
    check_shape(M.embed, s.vocab_size, d);
    M.head = weights_.find(p + "shared_head_head");
    if (M.head == nullptr) M.head = output_;
    check_shape(M.head, s.vocab_size, d);
  }
}

// One decoder layer's weights: attention (GQA or MLA, from the spec), norms, FFN.
void Engine::resolve_layer(LayerWeights& L, int64_t i, bool moe) {
  const ModelSpec& s = spec_;
  const int64_t d = s.hidden_size;
  auto req = [&](const std::string& name) { return &weights_.get(name); };
  const std::string p = "blk." + std::to_string(i) + ".";
  L.attn_norm = req(p + "attn_norm");
  check_shape(L.attn_norm, 1, d);
  L.attention = make_attention(s, weights_, i);
  L.ffn_norm = req(p + "ffn_norm");
  check_shape(L.ffn_norm, 1, d);
  L.ffn = ffn_.resolve(weights_, i, moe);
  if (s.hc_mult > 0) {
    L.attn_hc = resolve_hc(s, weights_, p + "hc_attn", false);
    L.ffn_hc = resolve_hc(s, weights_, p + "hc_ffn", false);
  }
}

KvLayerLayout Engine::mtp_kv_layout(int64_t j) const {
  if (j < 0 || j >= static_cast<int64_t>(mtp_.size()))
    fail(ErrorKind::InvalidArgument, "the model has no MTP layer " + std::to_string(j));
  return mtp_[static_cast<std::size_t>(j)].block.attention->kv_layout();
}

std::vector<KvLayerLayout> Engine::kv_layouts() const {
  std::vector<KvLayerLayout> out;
  out.reserve(layers_.size());
  for (const auto& L : layers_) out.push_back(L.attention->kv_layout());
  return out;
}

void Engine::configure_threads(const ThreadSettings& settings) {
  std::lock_guard<std::mutex> lock(mu_);
  const WaitChoice wait = decide_wait(settings);
  pool_.configure(wait.base);  // may throw (bad settings): nothing changed yet
  wait_ = wait;
  wait_share_ = 0.0;
}

// Auto: sleep between parallel regions when the forward waits on the disk (spinning
// threads would take the cores the I/O workers and the kernel's block layer need, which
// is what the seed documents measured), spin a bounded time when it computes. The share is
// smoothed over forwards and has a dead band, so one slow read does not flip it.
void Engine::choose_wait_policy(double wait_seconds, double total_seconds) {
  if (!wait_.is_auto || total_seconds <= 0) return;
  constexpr double kSmoothing = 0.3, kDiskBound = 0.20, kComputeBound = 0.10;
  wait_share_ = (1 - kSmoothing) * wait_share_ + kSmoothing * (wait_seconds / total_seconds);
  const WaitPolicy now = pool_.settings().policy;
  WaitPolicy want = now;
  if (wait_share_ > kDiskBound) want = WaitPolicy::Passive;
  if (wait_share_ < kComputeBound) want = wait_.base.policy;
  if (want != now) {
    ThreadSettings t = wait_.base;
    t.policy = want;
    pool_.configure(t);
  }
}

void Engine::configure_store(const StoreSettings& settings) {
  std::lock_guard<std::mutex> lock(mu_);
  store_->configure(settings);
}

ExpertStoreStats Engine::store_stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return store_->stats();
}

void Engine::reset_store_stats() {
  std::lock_guard<std::mutex> lock(mu_);
  store_->reset_stats();
  phase_ = PhaseSeconds{};
  if (gpu_) gpu_->reset_counters();
}

void Engine::use_gpu(const std::string& library_path, int adapter_index, uint64_t memory_budget) {
  std::lock_guard<std::mutex> lock(mu_);
  if (gpu_) fail(ErrorKind::InvalidArgument, "the engine already runs on a GPU");
  auto device = gpu::open_webgpu_device(library_path, adapter_index, gpu::RequiredLimits{}, memory_budget);
  gpu_ = std::make_unique<GpuOffload>(std::move(device), weights_, output_, memory_budget);
}

std::unique_ptr<GpuReport> Engine::gpu_report() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!gpu_) return nullptr;
  return std::make_unique<GpuReport>(gpu_->report());
}

void Engine::preload_experts() {
  std::lock_guard<std::mutex> lock(mu_);
  store_->preload();
}

void Engine::set_expert_pins(const std::vector<int64_t>& keys) {
  std::lock_guard<std::mutex> lock(mu_);
  store_->set_pins(keys);
}

std::vector<uint64_t> Engine::route_counts() const {
  std::lock_guard<std::mutex> lock(mu_);
  return store_->route_counts();
}

void Engine::set_io_fault(IoFault fault) {
  std::lock_guard<std::mutex> lock(mu_);
  store_->set_fault(fault);
}

PhaseSeconds Engine::phase_seconds() const {
  std::lock_guard<std::mutex> lock(mu_);
  return phase_;
}

std::pair<std::vector<int32_t>, std::vector<int64_t>> Engine::last_dsa_selection() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (attn_ws_.dsa_keys.empty()) return {};  // no indexer ran (the offsets may be stale)
  return {attn_ws_.dsa_keys, attn_ws_.dsa_offsets};
}

ThreadSettings Engine::thread_settings() const { return pool_.settings(); }

void Engine::reset_thread_stats() {
  std::lock_guard<std::mutex> lock(mu_);
  pool_.reset_stats();
}

void Engine::set_activation_precision(ActPrecision precision) {
  std::lock_guard<std::mutex> lock(mu_);
  precision_ = precision;
}

}  // namespace colibri
