"""The manifest: what a model is and where its bytes are.

A manifest is the normalized architecture config plus, for every tensor, its element type,
its shape and the byte extents in the model's files that hold it. Every model source (GGUF
file, Hugging Face directory, later the native container) produces one; the core reads
bytes through extents and never needs to know which source they came from.

Tensor names are canonical (GGUF-style, without the ``.weight`` suffix), whatever the
source calls them:

==============================  ==============================================================
name                            shape (rows = output features, PyTorch order)
==============================  ==============================================================
token_embd                      (vocab, hidden)
output_norm                     (hidden,)
output                          (vocab, hidden)               absent when embeddings are tied
blk.{i}.attn_norm               (hidden,)
blk.{i}.attn_q / _k / _v        (heads*head_dim | kv_heads*head_dim, hidden)
blk.{i}.attn_q.bias (k, v)      (rows,)                       only with attention bias
blk.{i}.attn_output             (hidden, heads*head_dim)
blk.{i}.attn_output.bias        (hidden,)                     only with attention_out_bias
blk.{i}.attn_sinks              (heads,)                      only with attention_sinks
blk.{i}.attn_q_norm / _k_norm   (head_dim,) or (heads*head_dim,)   see ModelConfig.qk_norm
blk.{i}.ffn_norm                (hidden,)
blk.{i}.ffn_gate / _up          (ffn, hidden)                 dense FFN layers
blk.{i}.ffn_down                (hidden, ffn)
blk.{i}.ffn_gate_inp            (n_experts, hidden)           the router
blk.{i}.ffn_gate_exps.{e}       (expert_ffn, hidden)          one entry per routed expert
blk.{i}.ffn_up_exps.{e}         (expert_ffn, hidden)
blk.{i}.ffn_down_exps.{e}       (hidden, expert_ffn)
blk.{i}.ffn_gate_shexp / _up    (shared_ffn, hidden)          shared expert (Qwen2-MoE)
blk.{i}.ffn_down_shexp          (hidden, shared_ffn)
blk.{i}.ffn_gate_inp_shexp      (1, hidden)                   sigmoid gate of the shared expert
blk.{i}.exp_probs_b             (n_experts,)                  selection bias (sigmoid router)
blk.{i}.ffn_gate_inp.bias       (n_experts,)                  router logit bias (gpt-oss)
blk.{i}.ffn_gate_exps.bias      (n_experts, expert_ffn)       per-expert biases (gpt-oss),
blk.{i}.ffn_up_exps.bias        (n_experts, expert_ffn)       resident
blk.{i}.ffn_down_exps.bias      (n_experts, hidden)
==============================  ==============================================================

Multi-head latent attention (``attention == "mla"``; llama.cpp's names, ``qk = nope + rope``):

==============================  ==============================================================
blk.{i}.attn_q                  (heads*qk, hidden)            without q-LoRA (q_lora_rank 0)
blk.{i}.attn_q_a                (q_lora, hidden)              with q-LoRA
blk.{i}.attn_q_a_norm           (q_lora,)
blk.{i}.attn_q_b                (heads*qk, q_lora)
blk.{i}.attn_kv_a_mqa           (kv_lora + rope, hidden)      latent, then the shared rope key
blk.{i}.attn_kv_a_norm          (kv_lora,)
blk.{i}.attn_k_b                (heads*kv_lora, nope)         per head W_UK transposed (absorbs
                                                              the key up-projection into q)
blk.{i}.attn_v_b                (heads*v, kv_lora)            per head W_UV
blk.{i}.attn_output             (hidden, heads*v)
blk.{i}.indexer.attn_q_b        (index_heads*index_dim, q_lora)   DSA lightning indexer
blk.{i}.indexer.attn_k          (index_dim, hidden)           ("full" indexer layers only)
blk.{i}.indexer.k_norm (+.bias) (index_dim,)                  LayerNorm of the indexer key
blk.{i}.indexer.proj            (index_heads, hidden)         per-head weights of the scores
==============================  ==============================================================

Multi-token-prediction layers (``n_mtp_layers``) follow the trunk as layers
``n_layers .. n_layers + n_mtp_layers - 1``: a full decoder layer (always MoE) plus
``blk.{i}.nextn.eh_proj`` (hidden, 2*hidden), ``nextn.enorm``, ``nextn.hnorm``,
``nextn.shared_head_norm`` (hidden,) and, when the checkpoint carries copies of them,
``nextn.embed_tokens`` and ``nextn.shared_head_head`` (vocab, hidden).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

QkNorm = Literal["none", "head", "full"]
AttentionKind = Literal["gqa", "mla", "v4_sliding"]
# Routing rules (csrc/model/routers/): softmax top-k; sigmoid + bias + group-limited top-k
# (DeepSeek-V3 "noaux_tc"); softmax with group-limited greedy selection (DeepSeek-V2).
# DeepSeek-V4's sqrt(softplus) scores with a selection bias, no groups.
RouterKind = Literal["softmax", "sigmoid_grouped", "softmax_group_limited", "sqrt_softplus"]
IndexerType = Literal["full", "shared"]
# The gated activation of every SwiGLU FFN: silu(gate) * up, gpt-oss's clamped variant, or
# DeepSeek-V4's (silu(min(gate, limit)) * clamp(up, -limit, limit)).
Activation = Literal["silu", "swiglu_oai", "swiglu_clamp"]


@dataclass(frozen=True)
class Extent:
    """A run of bytes in one of the manifest's files."""

    file: int  # index into Manifest.files
    offset: int  # bytes from the start of the file
    length: int  # bytes


@dataclass(frozen=True)
class TensorInfo:
    name: str  # canonical name (see the module docstring)
    dtype: str  # GGML type name: quant_types.WEIGHT_TYPES, or F8_E4M3 (Fp8TensorInfo)
    shape: tuple[int, ...]  # PyTorch order: (rows, cols) for a matrix, (n,) for a vector
    extents: tuple[Extent, ...]  # bytes in storage order; their lengths sum to nbytes
    # GGUF stores Llama-family Q/K rows permuted for llama.cpp's interleaved RoPE. When
    # > 0, the rows are in that order for this many heads and the loader restores the
    # Hugging Face (rotate-half) order, which is the one convention the core implements.
    rope_unpermute_heads: int = 0
    # Native containers: the crc32 of the tensor's bytes, checked by the core at load.
    crc32: int | None = None
    # When > 0 the bytes hold this many per-head blocks stored transposed (each
    # [cols, rows / heads]: MLA's W_UK as kv_b_proj keeps it); the loader transposes each
    # block to [rows / heads, cols]. Float types only.
    transpose_heads: int = 0

    @property
    def nbytes(self) -> int:
        return sum(e.length for e in self.extents)


@dataclass(frozen=True)
class ModelConfig:
    """Architecture hyper-parameters, normalized across sources and families."""

    arch: str  # family (families.SUPPORTED_FAMILIES), e.g. "qwen3_moe", "deepseek_v3"
    vocab_size: int
    hidden_size: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    intermediate_size: int  # dense FFN width (0 when every layer is MoE)
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    rope_scaling: Mapping[str, Any] | None = None  # HF rope_scaling dict (type, factor, ...)
    qk_norm: QkNorm = "none"  # "head": RMSNorm over each head; "full": over all heads (OLMoE)
    attention_bias: bool = False  # q/k/v projections have biases (Qwen2-MoE)
    # GQA extras (gpt-oss): a learned sink logit per query head in the softmax's denominator
    # (blk.{i}.attn_sinks); a sliding window of the last sliding_window positions, the
    # query's own included (0: none), in the layers marked True in sliding_layers (one entry
    # per layer; empty: none); a bias after the output projection (blk.{i}.attn_output.bias).
    attention_sinks: bool = False
    sliding_window: int = 0
    sliding_layers: tuple[bool, ...] = ()
    attention_out_bias: bool = False
    # Per-layer-type GQA overrides (MiMo-V2-Flash), each defaulting to the global value: the
    # sliding layers' KV heads (0: n_kv_heads) and RoPE base (0: rope_theta; the same
    # rotary_dim and scaling); sinks in the sliding layers only; values scaled by
    # attention_value_scale after their projection, before the cache. A GQA model's value
    # heads are v_head_dim wide when it is set (0: head_dim; see gqa_value_dim).
    sliding_n_kv_heads: int = 0
    sliding_rope_theta: float = 0.0
    sinks_sliding_only: bool = False
    attention_value_scale: float = 1.0
    n_experts: int = 0  # routed experts per MoE layer (0: dense model)
    n_experts_per_tok: int = 0  # top-k
    moe_intermediate_size: int = 0  # FFN width of one routed expert
    norm_topk_prob: bool = False  # renormalize the top-k router weights to sum to 1
    shared_expert_intermediate_size: int = 0  # 0: no shared expert
    moe_layers: tuple[bool, ...] = ()  # per layer: True when the layer's FFN is the MoE block
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    # RoPE layout: rotated dimensions per head (0: all of head_dim, or qk_rope_head_dim for
    # MLA) and whether pairs are adjacent (2i, 2i+1; DeepSeek's rope_interleave) rather than
    # halves (i, i + dim/2).
    rotary_dim: int = 0
    rope_interleaved: bool = False
    attention_scale: float = 0.0  # softmax scale; 0 means 1/sqrt(head_dim)
    # Routing (routed_scaling_factor multiplies the routed weights; groups: n_group equal
    # groups of experts, topk_group of them kept per token).
    router: RouterKind = "softmax"
    routed_scaling_factor: float = 1.0
    n_group: int = 1
    topk_group: int = 1
    router_bias: bool = False  # blk.{i}.exp_probs_b (e_score_correction_bias) per MoE layer
    shared_expert_gated: bool = True  # the shared expert has a sigmoid gate (Qwen2-MoE)
    # Multi-head latent attention (attention == "mla"): head_dim is qk_nope + qk_rope and
    # n_kv_heads equals n_heads; the KV cache keeps kv_lora_rank + qk_rope_head_dim values
    # per token and layer.
    attention: AttentionKind = "gqa"
    q_lora_rank: int = 0  # 0: a direct q projection
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    mla_norm_eps: float = 1e-6  # eps of the q-LoRA and latent RMSNorms
    mla_no_rope: bool = False  # no rotation at all (Kimi-Linear's NoPE MLA layers)
    # DSA lightning indexer (index_n_heads > 0): per layer "full" (own indexer) or "shared"
    # (the previous full layer's selection); index_topk keys per query.
    index_n_heads: int = 0
    index_head_dim: int = 0
    index_topk: int = 0
    indexer_types: tuple[IndexerType, ...] = ()
    index_rope_interleaved: bool = False
    n_mtp_layers: int = 0  # multi-token-prediction layers after the trunk (not run)
    # gpt-oss FFN pieces (csrc/model/ffn_block.cpp): blk.{i}.ffn_gate_inp.bias added to the
    # router logits (selection and weights; not exp_probs_b, the sigmoid router's
    # selection-only bias); per-expert biases blk.{i}.ffn_{gate,up,down}_exps.bias; the
    # activation, "swiglu_oai": g = min(gate, limit), u = clamp(up, -limit, limit),
    # (u + 1) * g * sigmoid(alpha * g).
    router_logit_bias: bool = False
    expert_bias: bool = False
    activation: Activation = "silu"
    swiglu_limit: float = 7.0
    swiglu_alpha: float = 1.702
    # DeepSeek-V4 (sources/v4_units.py): the grouped output projection of its attention
    # (attention "v4_sliding"); hyper-connections when hc_mult > 0 (the residual is hc_mult
    # streams; Sinkhorn-Knopp iterations and their floor); MoE layers marked True in
    # hash_layers route by token id (blk.{i}.ffn_hash_eid).
    o_groups: int = 0
    o_lora_rank: int = 0
    hc_mult: int = 0
    hc_sinkhorn_iters: int = 0
    hc_eps: float = 0.0
    hash_layers: tuple[bool, ...] = ()
    # V4's compressed layers (csrc/model/attn_v4_compressed.hpp): per layer the compression
    # rate (0 or empty: sliding only), True in csa_layers for compressed sparse attention
    # (overlapping compressor + the lightning indexer, index_* above) rather than heavily
    # compressed; their RoPE ("compress": base and scaling; 0: none).
    compress_ratios: tuple[int, ...] = ()
    csa_layers: tuple[bool, ...] = ()
    compress_rope_theta: float = 0.0
    compress_rope_scaling: Mapping[str, Any] | None = None
    # Hybrid linear attention (Qwen3-Next): per layer True where the layer runs a Gated
    # DeltaNet (csrc/model/linear_attn_gdn.hpp) instead of attention (empty: none), with
    # its key/value heads, head sizes and short-convolution width. attention_output_gate:
    # the attention layers' q_proj also gives a per-head gate (blk.{i}.attn_gate),
    # sigmoid(gate) scaling the attention output before o_proj. norm_weight_offset: added
    # to the residual-stream and QK-norm weights (zero-centred norms scale by 1 + w).
    linear_layers: tuple[bool, ...] = ()
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel: int = 0
    # The linear layers run Kimi Delta Attention (Kimi-Linear; csrc/model/linear_attn_kda.hpp:
    # a decay per key channel, as many key as value heads of one size) instead.
    linear_kda: bool = False
    attention_output_gate: bool = False
    norm_weight_offset: float = 0.0
    # As llama.cpp's GGUF files store the Gated DeltaNet (families/qwen3_next_gguf.py) and
    # KDA (kimi_linear_gguf.py): gdn_a_log / kda_a_log holds -exp(A_log) itself; the value
    # heads in tiled order (value head h reads key head h % linear_num_key_heads, not
    # h / (value heads per key head)).
    linear_a_neg_exp: bool = False
    linear_v_tiled: bool = False

    @property
    def is_mla(self) -> bool:
        return self.attention == "mla"

    @property
    def has_indexer(self) -> bool:
        return self.index_n_heads > 0

    def is_sliding(self, layer: int) -> bool:
        marks = self.sliding_layers
        return bool(marks) and layer < len(marks) and marks[layer]

    def kv_heads(self, layer: int) -> int:
        """GQA: the KV heads of `layer` (the sliding layers' own count when set)."""
        return self.sliding_n_kv_heads if self.sliding_n_kv_heads and self.is_sliding(layer) \
            else self.n_kv_heads  # fmt: skip

    def has_sinks(self, layer: int) -> bool:
        return self.attention_sinks and (not self.sinks_sliding_only or self.is_sliding(layer))

    @property
    def gqa_value_dim(self) -> int:
        """GQA: the values of one head (v_head_dim when set, else head_dim)."""
        return self.v_head_dim or self.head_dim

    def is_linear(self, layer: int) -> bool:
        """True when `layer` runs linear attention (a Gated DeltaNet) instead of attention."""
        layers = self.linear_layers
        return bool(layers) and layer < len(layers) and layers[layer]


@dataclass(frozen=True)
class ExpertBlob:
    """A native container's blob: one routed expert's gate, up and down in one aligned
    range, read with one request and checked against its crc32."""

    extent: Extent
    crc32: int | None = None


@dataclass(frozen=True)
class Manifest:
    source: Literal["gguf", "hf"]
    path: Path  # what the user passed (file or directory)
    files: tuple[Path, ...]  # files the extents index into
    config: ModelConfig
    tensors: Mapping[str, TensorInfo]
    # Raw metadata for later layers (tokenizer, chat template): GGUF key/values or the HF
    # config.json contents.
    metadata: Mapping[str, Any] = field(default_factory=dict)
    # Native containers: (layer, expert) -> the blob holding that expert. Other sources
    # leave it empty and their experts are read matrix by matrix through `tensors`.
    expert_blobs: Mapping[tuple[int, int], ExpertBlob] = field(default_factory=dict)
