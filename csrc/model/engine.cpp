#include "model/engine.hpp"

#include <algorithm>
#include <cstring>

#include "common/errors.hpp"
#include "model/kv_cache.hpp"
#include "model/ops.hpp"

namespace colibri {

namespace {

void check_shape(const Tensor* t, int64_t rows, int64_t cols) {
  if (t->rows != rows || t->cols != cols)
    fail(ErrorKind::Format, "tensor '" + t->name + "' is " + std::to_string(t->rows) + "x" +
                                std::to_string(t->cols) + " but the config implies " +
                                std::to_string(rows) + "x" + std::to_string(cols));
}

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
  if (any_moe && (s.n_experts <= 0 || s.n_experts_per_tok <= 0 || s.n_experts_per_tok > s.n_experts))
    fail(ErrorKind::InvalidArgument, "model spec: MoE layers need 0 < n_experts_per_tok <= n_experts");
}

}  // namespace

Engine::Engine(ModelSpec spec, const std::vector<TensorSpec>& tensors,
               const std::vector<std::string>& files, const ThreadSettings& threads)
    // check_spec runs before any weight is read (the comma operator sequences it).
    : spec_(std::move(spec)), files_(files), weights_((check_spec(spec_), tensors), files_),
      pool_(threads) {
  resolve_layers();
}

void Engine::resolve_layers() {
  const ModelSpec& s = spec_;
  const int64_t d = s.hidden_size, qd = s.n_heads * s.head_dim, kvd = s.n_kv_heads * s.head_dim;
  auto req = [&](const std::string& name) { return &weights_.get(name); };
  auto opt = [&](const std::string& name) { return weights_.find(name); };

  token_embd_ = req("token_embd");
  check_shape(token_embd_, s.vocab_size, d);
  output_norm_ = req("output_norm");
  check_shape(output_norm_, 1, d);
  output_ = s.tie_word_embeddings ? token_embd_ : req("output");
  check_shape(output_, s.vocab_size, d);

  layers_.resize(static_cast<std::size_t>(s.n_layers));
  for (int64_t i = 0; i < s.n_layers; ++i) {
    LayerWeights& L = layers_[static_cast<std::size_t>(i)];
    const std::string p = "blk." + std::to_string(i) + ".";
    L.attn_norm = req(p + "attn_norm");
    check_shape(L.attn_norm, 1, d);
    L.q = req(p + "attn_q");
    check_shape(L.q, qd, d);
    L.k = req(p + "attn_k");
    check_shape(L.k, kvd, d);
    L.v = req(p + "attn_v");
    check_shape(L.v, kvd, d);
    L.o = req(p + "attn_output");
    check_shape(L.o, d, qd);
    if (s.attention_bias) {
      L.q_bias = req(p + "attn_q.bias");
      check_shape(L.q_bias, 1, qd);
      L.k_bias = req(p + "attn_k.bias");
      check_shape(L.k_bias, 1, kvd);
      L.v_bias = req(p + "attn_v.bias");
      check_shape(L.v_bias, 1, kvd);
    }
    if (s.qk_norm != QkNorm::None) {
      L.q_norm = req(p + "attn_q_norm");
      L.k_norm = req(p + "attn_k_norm");
      const bool full = s.qk_norm == QkNorm::Full;
      check_shape(L.q_norm, 1, full ? qd : s.head_dim);
      check_shape(L.k_norm, 1, full ? kvd : s.head_dim);
    }
    L.ffn_norm = req(p + "ffn_norm");
    check_shape(L.ffn_norm, 1, d);
    L.is_moe = !s.moe_layers.empty() && s.moe_layers[static_cast<std::size_t>(i)];
    if (!L.is_moe) {
      const int64_t f = s.intermediate_size;
      L.dense = {req(p + "ffn_gate"), req(p + "ffn_up"), req(p + "ffn_down")};
      check_shape(L.dense.gate, f, d);
      check_shape(L.dense.up, f, d);
      check_shape(L.dense.down, d, f);
      continue;
    }
    L.router = req(p + "ffn_gate_inp");
    check_shape(L.router, s.n_experts, d);
    const int64_t f = s.moe_intermediate_size;
    for (int64_t e = 0; e < s.n_experts; ++e) {
      const std::string sfx = "." + std::to_string(e);
      ExpertWeights ew{req(p + "ffn_gate_exps" + sfx), req(p + "ffn_up_exps" + sfx),
                       req(p + "ffn_down_exps" + sfx)};
      check_shape(ew.gate, f, d);
      check_shape(ew.up, f, d);
      check_shape(ew.down, d, f);
      L.experts.push_back(ew);
    }
    if (s.shared_expert_intermediate_size > 0) {
      const int64_t sf = s.shared_expert_intermediate_size;
      L.shared = {req(p + "ffn_gate_shexp"), req(p + "ffn_up_shexp"), req(p + "ffn_down_shexp")};
      check_shape(L.shared.gate, sf, d);
      check_shape(L.shared.up, sf, d);
      check_shape(L.shared.down, d, sf);
      L.shared_gate = opt(p + "ffn_gate_inp_shexp");
      if (L.shared_gate) check_shape(L.shared_gate, 1, d);
    }
  }
}

void Engine::configure_threads(const ThreadSettings& settings) {
  std::lock_guard<std::mutex> lock(mu_);
  pool_.configure(settings);
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

void Engine::mm(const Tensor& w, const float* x, int64_t n, float* y) {
  matmul(pool_, w.view(), x, n, y, ws_.matmul, precision_);
}

void Engine::forward(KvCache& kv, int64_t pos0, const int32_t* ids, int64_t n, bool all_logits,
                     float* logits_out, int32_t* routing_out) {
  const ModelSpec& s = spec_;
  if (n <= 0) fail(ErrorKind::InvalidArgument, "forward needs at least one token");
  for (int64_t t = 0; t < n; ++t) {
    if (ids[t] < 0 || ids[t] >= s.vocab_size)
      fail(ErrorKind::TokenOutOfRange, "token id " + std::to_string(ids[t]) + " at index " +
                                           std::to_string(t) + " is outside the vocabulary [0, " +
                                           std::to_string(s.vocab_size) + ")");
  }
  if (pos0 + n > kv.context_length())
    fail(ErrorKind::ContextOverflow,
         "context overflow: the session holds " + std::to_string(pos0) + " tokens and " +
             std::to_string(n) + " more would exceed the context length of " +
             std::to_string(kv.context_length()) + " (raise EngineConfig.context_length or start a new session)");

  kv.reserve(pos0 + n);  // grows the session's cache before any of it is written
  std::lock_guard<std::mutex> lock(mu_);
  ThreadPool::ComputeScope scope(pool_);
  const int64_t d = s.hidden_size;
  ws_.x.resize(static_cast<std::size_t>(n * d));
  ws_.h.resize(static_cast<std::size_t>(n * d));
  get_rows(token_embd_->view(), ids, n, ws_.x.data());
  if (routing_out && s.n_experts_per_tok > 0)
    std::fill(routing_out, routing_out + n * s.n_layers * s.n_experts_per_tok, -1);

  for (int64_t li = 0; li < s.n_layers; ++li) {
    const LayerWeights& L = layers_[static_cast<std::size_t>(li)];
    for (int64_t t = 0; t < n; ++t)
      rms_norm_row(ws_.x.data() + t * d, L.attn_norm->f32(), d, s.rms_norm_eps, ws_.h.data() + t * d);
    attention_block(L, kv, li, pos0, n);  // leaves the projected output in ws_.proj
    add_inplace(ws_.x.data(), ws_.proj.data(), n * d);
    for (int64_t t = 0; t < n; ++t)
      rms_norm_row(ws_.x.data() + t * d, L.ffn_norm->f32(), d, s.rms_norm_eps, ws_.h.data() + t * d);
    if (L.is_moe)
      moe_block(L, li, n, routing_out);  // leaves the FFN output in ws_.ffn_out
    else
      ffn_block(L, n);
    add_inplace(ws_.x.data(), ws_.ffn_out.data(), n * d);
  }

  const int64_t first = all_logits ? 0 : n - 1, rows = n - first;
  for (int64_t t = first; t < n; ++t)
    rms_norm_row(ws_.x.data() + t * d, output_norm_->f32(), d, s.rms_norm_eps, ws_.h.data() + t * d);
  mm(*output_, ws_.h.data() + first * d, rows, logits_out);
}

}  // namespace colibri
