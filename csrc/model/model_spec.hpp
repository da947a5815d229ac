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

// Which attention unit a layer runs (model/attention_layer.hpp: make_attention).
enum class AttentionKind : int {
  Gqa = 0,  // grouped-query attention (multi-head and multi-query are its edge cases)
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
  float attention_scale = 0.0f;     // softmax scale; 0 means 1/sqrt(head_dim)
  AttentionKind attention_kind = AttentionKind::Gqa;
  QkNorm qk_norm = QkNorm::None;
  bool attention_bias = false;
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
  bool tie_word_embeddings = false;
  int64_t context_length = 0;       // KV-cache positions per session
};

// One tensor of the manifest, as the core sees it.
struct TensorSpec {
  std::string name;
  DType type = DType::F32;
  std::vector<int64_t> shape;       // PyTorch order: (rows, cols) or (n,)
  std::vector<Extent> extents;
  int64_t rope_unpermute_heads = 0; // see sources/manifest.py
  bool has_crc32 = false;           // native container: the bytes' crc32, checked at load
  uint32_t crc32 = 0;
};

}  // namespace colibri
