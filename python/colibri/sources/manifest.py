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
==============================  ==============================================================
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

# Element types by GGML name. The core's DType uses GGML's numeric ids for the same names.
TENSOR_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q5_K", "Q6_K")

QkNorm = Literal["none", "head", "full"]


@dataclass(frozen=True)
class Extent:
    """A run of bytes in one of the manifest's files."""

    file: int  # index into Manifest.files
    offset: int  # bytes from the start of the file
    length: int  # bytes


@dataclass(frozen=True)
class TensorInfo:
    name: str  # canonical name (see the module docstring)
    dtype: str  # GGML type name, one of TENSOR_TYPES
    shape: tuple[int, ...]  # PyTorch order: (rows, cols) for a matrix, (n,) for a vector
    extents: tuple[Extent, ...]  # bytes in storage order; their lengths sum to nbytes
    # GGUF stores Llama-family Q/K rows permuted for llama.cpp's interleaved RoPE. When
    # > 0, the rows are in that order for this many heads and the loader restores the
    # Hugging Face (rotate-half) order, which is the one convention the core implements.
    rope_unpermute_heads: int = 0
    # Native containers: the crc32 of the tensor's bytes, checked by the core at load.
    crc32: int | None = None

    @property
    def nbytes(self) -> int:
        return sum(e.length for e in self.extents)


@dataclass(frozen=True)
class ModelConfig:
    """Architecture hyper-parameters, normalized across sources and families."""

    arch: str  # family: "llama", "qwen3_moe", "qwen2_moe", "olmoe", "mixtral"
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
    n_experts: int = 0  # routed experts per MoE layer (0: dense model)
    n_experts_per_tok: int = 0  # top-k
    moe_intermediate_size: int = 0  # FFN width of one routed expert
    norm_topk_prob: bool = False  # renormalize the top-k router weights to sum to 1
    shared_expert_intermediate_size: int = 0  # 0: no shared expert
    moe_layers: tuple[bool, ...] = ()  # per layer: True when the layer's FFN is the MoE block
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()


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
