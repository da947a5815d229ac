// The delta rule of the linear-attention layers for one value head over n tokens, in its
// two forms, on the kernels of linear_attn_kernels.hpp (any ISA: the same bits):
//  - recurrent, token by token (transformers' torch_recurrent_gated_delta_rule and
//    recurrent_kimi_delta_attention): S = diag(exp(g)) S; S += k (beta (v - S^T k))^T;
//    o = S^T q;
//  - chunked (torch_chunk_gated_delta_rule, chunk_kimi_delta_attention): chunks of 64
//    tokens, a triangular solve per chunk, then matrix products with the state; the same
//    values in another order.
// Gated DeltaNet's decay is one value per token and head; Kimi Delta Attention's one per key
// channel (HeadRows::channel_decay).
#pragma once
#include <cstdint>

#include "model/linear_attn_kernels.hpp"

namespace colibri::linattn {

// One head's inputs: token t's q / k / v at q + t * stride ...; its beta at
// beta[t * beta_stride]; its log decay at g[t * g_stride] (channel_decay: the dk values
// from there); its output at out + t * ostride. The state S is (dk x dv), row i the key
// channel i.
struct HeadRows {
  const float *q, *k, *v;
  int64_t stride;
  const float* beta;
  int64_t beta_stride;
  const float* g;
  int64_t g_stride;
  bool channel_decay;
  float* out;
  int64_t ostride;
  int64_t dk, dv;
};

constexpr int64_t kChunk = 64;  // transformers' chunk_size

void delta_rule_recurrent(const Kernels& kern, const HeadRows& r, int64_t n, float* S);
void delta_rule_chunked(const Kernels& kern, const HeadRows& r, int64_t n, float* S);

}  // namespace colibri::linattn
