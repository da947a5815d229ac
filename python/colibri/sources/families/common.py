"""Building blocks several family modules share: the Hugging Face decoder names every
family here uses, the refusal of features none implements, the expert counts of
config.json, and the GGUF config of the llama.cpp families with grouped-query attention
and one router (llama, Mixtral, Qwen2/3-MoE, OLMoE).
"""

from __future__ import annotations

import re
from typing import Any

from ...errors import ModelFormatError, UnsupportedError
from ..fields import as_int
from ..manifest import ModelConfig, QkNorm
from ..paths import shown
from .spec import GGUFInput, HFInput, NameRule

LAYER = r"model\.layers\.(\d+)\."  # a layer's prefix in HF names (group 1: the layer)

# The decoder every family here shares: embeddings, norms, head, GQA projections, a dense
# FFN or routed experts (one tensor per expert) and their router.
DECODER_NAMES: list[NameRule] = [
    (re.compile(r"model\.embed_tokens\.weight"), "token_embd"),
    (re.compile(r"model\.norm\.weight"), "output_norm"),
    (re.compile(r"lm_head\.weight"), "output"),
    (re.compile(LAYER + r"input_layernorm\.weight"), "blk.{0}.attn_norm"),
    (re.compile(LAYER + r"post_attention_layernorm\.weight"), "blk.{0}.ffn_norm"),
    (re.compile(LAYER + r"self_attn\.([qkv])_proj\.weight"), "blk.{0}.attn_{1}"),
    (re.compile(LAYER + r"self_attn\.([qkv])_proj\.bias"), "blk.{0}.attn_{1}.bias"),
    (re.compile(LAYER + r"self_attn\.o_proj\.weight"), "blk.{0}.attn_output"),
    (re.compile(LAYER + r"self_attn\.([qk])_norm\.weight"), "blk.{0}.attn_{1}_norm"),
    (re.compile(LAYER + r"mlp\.(gate|up|down)_proj\.weight"), "blk.{0}.ffn_{1}"),
    (re.compile(LAYER + r"mlp\.gate\.weight"), "blk.{0}.ffn_gate_inp"),
    (
        re.compile(LAYER + r"mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight"),
        "blk.{0}.ffn_{2}_exps.{1}",
    ),
]


def unsupported_if(cond: Any, where: object, what: str) -> None:
    if cond:
        raise UnsupportedError(f"{where}: {what} is not supported")


def refuse_hf_features(inp: HFInput, *, attention_bias: bool = False) -> None:
    """config.json settings the GQA families' forward pass does not implement;
    ``attention_bias``: the family has q/k/v biases (Qwen2-MoE) and no output bias."""
    cfg, d = inp.cfg, inp.d
    unsupported_if(cfg.get("hidden_act", "silu") != "silu", d,
                   f"hidden_act {shown(cfg.get('hidden_act'))}")  # fmt: skip
    unsupported_if(cfg.get("mlp_bias"), d, "mlp_bias")
    unsupported_if(cfg.get("clip_qkv") is not None, d, "clip_qkv (OLMoE activation clipping)")
    unsupported_if(cfg.get("use_sliding_window"), d, "sliding-window attention")
    unsupported_if(
        not attention_bias and cfg.get("attention_bias"),
        d,
        "attention_bias on this architecture (it adds an output-projection bias)",
    )


def hf_expert_counts(inp: HFInput) -> tuple[int, int]:
    """(routed experts, top-k) of a MoE config.json (``num_experts`` or, Mixtral and newer
    Qwen3-MoE files, ``num_local_experts``)."""
    cfg = inp.cfg
    n_exp = as_int(cfg.get("num_experts") or cfg.get("num_local_experts") or 0,
                   "num_experts", inp.fields.where, lo=0, floats=True)  # fmt: skip
    top_k = inp.fields.int("num_experts_per_tok", 0, lo=0)
    if n_exp <= 0 or top_k <= 0:
        raise ModelFormatError(
            f"{inp.fields.where}: a {inp.arch} model needs experts and top-k > 0"
        )
    return n_exp, top_k


def gguf_gqa_config(
    inp: GGUFInput, arch: str, *, norm_topk: bool, qk_norm: QkNorm, moe: bool
) -> ModelConfig:
    """The ModelConfig of a llama.cpp GQA file (llama, Mixtral, Qwen2/3-MoE, OLMoE).

    ``norm_topk``: whether the top-k router weights are renormalized, which llama.cpp's
    graphs hard-code per architecture; ``qk_norm``: the QK-norm kind when the file has
    ``attn_q_norm``; ``moe``: the family has routers (a file without them is refused).
    Which layers are MoE and the expert, shared-expert and dense widths are read from the
    tensors (llama.cpp's Mixtral and OLMoE files keep the expert width in
    ``feed_forward_length``)."""
    a, meta, tensors, base = inp.arch, inp.meta, inp.tensors, inp.base
    hidden, n_heads, n_layers = base["hidden_size"], base["n_heads"], base["n_layers"]
    head_dim = meta.int(f"{a}.attention.key_length", hidden // n_heads)
    v_dim = meta.int(f"{a}.attention.value_length", head_dim)
    rot = meta.int(f"{a}.rope.dimension_count", head_dim)
    if v_dim != head_dim or rot != head_dim:
        raise UnsupportedError(
            f"{inp.where}: key length {head_dim}, value length {v_dim} and RoPE dimensions "
            f"{rot} differ; colibri supports full-dimension RoPE with equal key/value head "
            f"sizes."
        )

    def width(name: str) -> int:
        t = tensors.get(name)
        return t.shape[0] if t is not None and len(t.shape) > 0 else 0

    moe_layers = tuple(f"blk.{i}.ffn_gate_inp" in tensors for i in range(n_layers))
    first_moe = next((i for i, m in enumerate(moe_layers) if m), None)
    first_dense = next((i for i, m in enumerate(moe_layers) if not m), None)
    if moe and first_moe is None:
        raise ModelFormatError(f"{inp.where}: a {arch} model without router tensors "
                               f"(ffn_gate_inp)")  # fmt: skip
    routed = first_moe is not None
    return ModelConfig(
        **base,
        arch=arch,
        head_dim=head_dim,
        intermediate_size=width(f"blk.{first_dense}.ffn_gate") if first_dense is not None else 0,
        qk_norm=qk_norm if "blk.0.attn_q_norm" in tensors else "none",
        attention_bias="blk.0.attn_q.bias" in tensors,
        n_experts=meta.int(f"{a}.expert_count", 0, lo=0) if routed else 0,
        n_experts_per_tok=meta.int(f"{a}.expert_used_count", 0, lo=0) if routed else 0,
        moe_intermediate_size=width(f"blk.{first_moe}.ffn_gate_exps.0") if routed else 0,
        norm_topk_prob=norm_topk and routed,
        shared_expert_intermediate_size=width(f"blk.{first_moe}.ffn_gate_shexp") if routed
        else 0,
        moe_layers=moe_layers,
    )
