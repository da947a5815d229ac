// What the forward pass needs to know about an architecture, as data. Families differ
// only in these fields (and in which tensors exist); there is one engine for all of them.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "io/file_reader.hpp"
#include "model/routers/router.hpp"
#include "quant/dtype.hpp"

namespace colibri {

enum class QkNorm : int {
  None = 0,
  PerHead = 1,  // RMSNorm over each head's head_dim values (Qwen3)
  Full = 2,     // RMSNorm over the whole projection, all heads at once (OLMoE)
};

// The gated activation of every SwiGLU FFN (dense, routed and shared experts).
enum class FfnActivation : int {
  Silu = 0,       // silu(gate) * up
  SwigluOai = 1,  // gpt-oss: g = min(gate, limit), u = clamp(up, -limit, limit),
                  // (u + 1) * g * sigmoid(alpha * g)
  SwigluClamp = 2,  // DeepSeek-V4: silu(min(gate, limit)) * clamp(up, -limit, limit)
};

// Which attention unit a layer runs (model/attention_layer.hpp: make_attention).
enum class AttentionKind : int {
  Gqa = 0,  // grouped-query attention (multi-head and multi-query are its edge cases;
            // Llama, Qwen, Mixtral, OLMoE, GLM-4.5)
  Mla = 1,  // multi-head latent attention (DeepSeek-V2/V3, Kimi-K2, GLM-4.7-Flash, GLM-5),
            // with the DSA lightning indexer when index_n_heads > 0
  V4Sliding = 2,  // DeepSeek-V4's sliding-window attention (model/attn_v4.hpp)
};

struct ModelSpec {
  std::string arch;                 // family name, for messages
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t n_layers = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t intermediate_size = 0;    // dense FFN width
  float rms_norm_eps = 1e-6f;
  // RoPE as data: inverse frequencies for the rotated dimension pairs (rotate-half
  // convention: dim i pairs with i + rotary_dim/2), computed in Python from the config's
  // scaling variant; attention_factor multiplies cos and sin (YaRN's mscale).
  std::vector<float> rope_inv_freq;  // rotary_dim / 2 entries
  float rope_attention_factor = 1.0f;
  bool rope_interleaved = false;    // pairs (2i, 2i+1) instead of (i, i + rotary_dim/2)
  float attention_scale = 0.0f;     // softmax scale; 0 means 1/sqrt(head_dim)
  AttentionKind attention_kind = AttentionKind::Gqa;
  QkNorm qk_norm = QkNorm::None;
  bool attention_bias = false;
  // GQA extras (gpt-oss): a learned sink logit per query head in every layer
  // (blk.{i}.attn_sinks), a sliding window of sliding_window positions (0: none; the query's
  // own included) in the layers marked 1 in sliding_layers (empty: none), and a bias after
  // the output projection (blk.{i}.attn_output.bias). The cache keeps every position.
  bool attention_sinks = false;
  int64_t sliding_window = 0;
  std::vector<uint8_t> sliding_layers;
  bool attention_out_bias = false;
  int64_t n_experts = 0;            // routed experts per MoE layer
  int64_t n_experts_per_tok = 0;    // top-k
  int64_t moe_intermediate_size = 0;
  bool norm_topk_prob = false;
  RouterKind router = RouterKind::SoftmaxTopK;  // the routing rule of every MoE layer
  float routed_scaling_factor = 1.0f;  // multiplies the routed weights
  int64_t n_group = 1;                 // expert groups (grouped routers)
  int64_t topk_group = 1;              // groups kept per token
  int64_t shared_expert_intermediate_size = 0;
  std::vector<uint8_t> moe_layers;  // per layer: 1 when the FFN is the MoE block
  // gpt-oss FFN pieces: blk.{i}.ffn_gate_inp.bias added to the router logits before the
  // rule (selection and weights); per-expert biases blk.{i}.ffn_{gate,up,down}_exps.bias
  // ((n_experts, width) each, resident) added after each expert's projections; the
  // activation and its clamp.
  bool router_logit_bias = false;
  bool expert_bias = false;
  FfnActivation activation = FfnActivation::Silu;
  float swiglu_limit = 7.0f;
  float swiglu_alpha = 1.702f;
  bool tie_word_embeddings = false;
  int64_t context_length = 0;       // KV-cache positions per session

  // MLA (attention_kind Mla; head_dim = qk_nope_head_dim + qk_rope_head_dim; rope_inv_freq covers the rope part).
  int64_t q_lora_rank = 0;          // 0: a direct q projection (attn_q)
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  float mla_norm_eps = 1e-6f;       // eps of the q-LoRA and latent RMSNorms
  bool mla_no_rope = false;         // no rotation at all (Kimi-Linear's NoPE MLA layers)
  // DSA lightning indexer (index_n_heads > 0).
  int64_t index_n_heads = 0;
  int64_t index_head_dim = 0;
  int64_t index_topk = 0;
  std::vector<uint8_t> indexer_full;  // per layer: 1 runs its own indexer, 0 reuses the last full one's
  bool index_rope_interleaved = false;
  // Multi-token-prediction layers after the trunk: loaded (weights resident, experts in
  // the store) but not run by forward().
  int64_t n_mtp_layers = 0;
  // DeepSeek-V4 (model/attn_v4.hpp, model/hyper_conn.hpp): the grouped output projection
  // (o_groups groups of heads, each to o_lora_rank values); hyper-connections when
  // hc_mult > 0 (the residual is hc_mult streams, mixed by Sinkhorn-Knopp iterations with
  // hc_eps as their floor); MoE layers marked 1 in hash_layers take their experts from
  // blk.{i}.ffn_hash_eid by token id.
  int64_t o_groups = 0;
  int64_t o_lora_rank = 0;
  int64_t hc_mult = 0;
  int64_t hc_sinkhorn_iters = 0;
  float hc_eps = 0.0f;
  std::vector<uint8_t> hash_layers;
  // V4's compressed layers (model/attn_v4_compressed.hpp): per layer the compression rate
  // (0 or empty: a sliding-only layer), 1 in csa_layers where the layer is compressed sparse
  // attention (an overlapping compressor and the lightning indexer, with index_n_heads,
  // index_head_dim, index_topk) rather than heavily compressed attention; the RoPE of
  // those layers (their queries, keys and compressed entries: "compress" in the config).
  std::vector<int64_t> compress_ratios;
  std::vector<uint8_t> csa_layers;
  std::vector<float> compress_rope_inv_freq;
  float compress_rope_attention_factor = 1.0f;
  // Hybrid linear attention (Qwen3-Next; model/linear_attn_gdn.hpp): per layer 1 where the
  // layer runs a Gated DeltaNet instead of attention (empty: none), its heads and sizes.
  std::vector<uint8_t> linear_layers;
  int64_t linear_num_key_heads = 0;
  int64_t linear_num_value_heads = 0;
  int64_t linear_key_head_dim = 0;
  int64_t linear_value_head_dim = 0;
  int64_t linear_conv_kernel = 0;
  // The linear layers run Kimi Delta Attention (Kimi-Linear; model/linear_attn_kda.hpp:
  // channel-wise decay, nk = nv, dk = dv) instead of Gated DeltaNet.
  bool linear_kda = false;
  // Forwards of at least this many tokens run the delta rule's chunked form, shorter ones
  // the recurrent form (0: always recurrent). With the SIMD kernels as without, the
  // recurrent form is the faster (docs/linear-attention.md), so colibri leaves it 0; the
  // tests set it.
  int64_t linear_chunked_min_tokens = 0;
  // GQA per-layer-type overrides (MiMo-V2-Flash), each defaulting to the global value so
  // other families are unchanged: the sliding layers' KV heads (0: n_kv_heads) and RoPE
  // (empty: rope_inv_freq; same rotated width); sinks in the sliding layers only; value
  // heads of v_head_dim values (0: head_dim; MLA reads v_head_dim its own way); values
  // multiplied by attention_value_scale after their projection (before the cache).
  int64_t sliding_n_kv_heads = 0;
  std::vector<float> sliding_rope_inv_freq;
  bool sinks_sliding_only = false;
  float attention_value_scale = 1.0f;
  // As llama.cpp's GGUF files store them: blk.{i}.gdn_a_log / kda_a_log holds
  // A = -exp(A_log) itself (linear_a_neg_exp); the value heads are in "tiled" order, value head h reading key
  // head h % nk instead of h / (nv / nk) (linear_v_tiled: llama.cpp's Qwen3.5 files).
  bool linear_a_neg_exp = false;
  bool linear_v_tiled = false;
  // GQA: q_proj's per-head gate (blk.{i}.attn_gate), sigmoid(gate) * attention output
  // before the output projection.
  bool attention_output_gate = false;
  // Added once at load to every residual-stream norm weight (attn_norm, ffn_norm,
  // output_norm) and QK-norm weight: Qwen3-Next's zero-centred norms scale by 1 + w.
  float norm_weight_offset = 0.0f;
};

// One tensor of the manifest, as the core sees it.
struct TensorSpec {
  std::string name;
  DType type = DType::F32;
  std::vector<int64_t> shape;       // PyTorch order: (rows, cols) or (n,)
  std::vector<Extent> extents;
  int64_t rope_unpermute_heads = 0; // see sources/manifest.py
  int64_t transpose_heads = 0;      // see sources/manifest.py (MLA's W_UK from kv_b_proj)
  bool has_crc32 = false;           // native container: the bytes' crc32, checked at load
  uint32_t crc32 = 0;
  // F8_E4M3 only: the companion F32 block-scale matrix (quant/fp8.hpp), its extents and
  // block shape; it lies in the store right after the weight's bytes. A tensor cut from a
  // larger FP8 weight (MLA's attn_k_b / attn_v_b from kv_b_proj) brings its scale matrix as
  // values instead (scale_values, row-major), re-blocked for its own rows by the loader.
  std::vector<Extent> scale_extents;
  std::vector<float> scale_values;
  int64_t scale_block_rows = 0;
  int64_t scale_block_cols = 0;
};

// Bytes of an F8_E4M3 spec's scale matrix (0 for other types).
inline std::size_t scale_bytes(const TensorSpec& s) {
  if (s.type != DType::F8_E4M3 || s.shape.size() != 2 || s.scale_block_rows <= 0 || s.scale_block_cols <= 0) return 0;
  const int64_t sr = (s.shape[0] + s.scale_block_rows - 1) / s.scale_block_rows;
  const int64_t sc = (s.shape[1] + s.scale_block_cols - 1) / s.scale_block_cols;
  return static_cast<std::size_t>(sr * sc) * sizeof(float);
}

}  // namespace colibri
