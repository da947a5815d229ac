"""gpt-oss (OpenAI's open-weight MoE, 20b and 120b): grouped-query attention with biases,
learned per-head attention sinks and a sliding window on every other layer; a softmax
top-k router with a bias in its logits; experts with biases and a clamped SwiGLU.

* ``gpt_oss``: Hugging Face ``gpt_oss`` / ``GptOssForCausalLM``; GGUF ``gpt-oss``
  (llama.cpp's LLM_ARCH_OPENAI_MOE).

* Routing: softmax over the k best logits (router bias included), which is the softmax
  over all experts renormalized over the k chosen: the ``softmax`` rule with
  ``norm_topk_prob``.
* Activation (``swiglu_oai``): g = min(gate, limit), u = clamp(up, -limit, limit),
  (u + 1) * g * sigmoid(alpha * g); config.json's ``swiglu_limit`` (alpha 1.702, which
  transformers' config also defaults). llama.cpp hard-codes 7.0 and 1.702 and its GGUF files
  carry neither; a GGUF runs with those.
* Attention: ``layer_types`` ("sliding_attention" / "full_attention") become
  ``sliding_layers``; config.json's ``attention_bias`` covers q, k, v and o. GGUF files carry
  ``attention.sliding_window``; llama.cpp makes layers 0, 2, 4, ... the sliding ones (its
  SWA pattern 2), as transformers' default ``layer_types`` does; it names the FFN norm
  ``post_attention_norm``.
* Experts in Hugging Face float checkpoints are stored fused, transposed and with gate and
  up interleaved (``gate_up_proj`` [E, hidden, 2 * ffn], gate = [..., ::2]), and the MXFP4
  checkpoints as released (``*_blocks`` / ``*_scales``) in an order of their own; both are
  re-laid out once into a side file (sources/fused_experts.py), MXFP4 as GGUF MXFP4 blocks
  holding the very same codes and exponents.
* RoPE: YaRN from ``rope_parameters`` (``truncate`` false in the released config; a GGUF
  carries no such key and runs llama.cpp's truncated correction range).
"""

from __future__ import annotations

import re
from typing import Any

from ...errors import ModelFormatError
from ..fields import bad
from ..fused_experts import gpt_oss_experts
from ..manifest import ModelConfig
from .common import DECODER_NAMES, LAYER, hf_expert_counts
from .spec import Family, GGUFInput, HFInput, NameRule, plain_gguf_name

ARCH = "gpt_oss"
# llama.cpp's graph for LLM_ARCH_OPENAI_MOE (ggml_swiglu_oai): not in its GGUF files.
GGUF_SWIGLU_LIMIT = 7.0
SWIGLU_ALPHA = 1.702

_NAMES: list[NameRule] = [
    *DECODER_NAMES,
    (re.compile(LAYER + r"self_attn\.o_proj\.bias"), "blk.{0}.attn_output.bias"),
    (re.compile(LAYER + r"self_attn\.sinks"), "blk.{0}.attn_sinks"),
    (re.compile(LAYER + r"mlp\.router\.weight"), "blk.{0}.ffn_gate_inp"),
    (re.compile(LAYER + r"mlp\.router\.bias"), "blk.{0}.ffn_gate_inp.bias"),
]
_LAYER_TYPES = {"sliding_attention": True, "full_attention": False}


def _sliding_layers(cfg: Any, n_layers: int, where: object) -> tuple[bool, ...]:
    types = cfg.get("layer_types")
    if types is None:  # transformers' default: layers 0, 2, 4, ... slide
        return tuple(i % 2 == 0 for i in range(n_layers))
    if not isinstance(types, list) or len(types) != n_layers or any(
        t not in _LAYER_TYPES for t in types
    ):
        raise bad(where, "layer_types", types,
                  f"{n_layers} entries, each sliding_attention or full_attention")  # fmt: skip
    return tuple(_LAYER_TYPES[t] for t in types)


def _hf_config(inp: HFInput) -> ModelConfig:
    f, where, n_layers = inp.fields, inp.fields.where, inp.base["n_layers"]
    n_exp, top_k = hf_expert_counts(inp)
    sliding = _sliding_layers(inp.cfg, n_layers, where)
    window = f.int("sliding_window", 0, lo=0) if any(sliding) else 0
    if any(sliding) and window < 1:
        raise bad(where, "sliding_window", inp.cfg.get("sliding_window"),
                  "a window >= 1 (the config has sliding layers)")  # fmt: skip
    bias = f.bool("attention_bias", True)
    limit = inp.cfg.get("swiglu_limit", 7.0)
    alpha = inp.cfg.get("swiglu_alpha", SWIGLU_ALPHA)
    return ModelConfig(
        **inp.base,
        arch=ARCH,
        intermediate_size=0,
        attention_bias=bias,
        attention_out_bias=bias,
        attention_sinks=True,
        sliding_window=window,
        sliding_layers=sliding,
        n_experts=n_exp,
        n_experts_per_tok=top_k,
        moe_intermediate_size=f.int("intermediate_size"),
        norm_topk_prob=True,
        moe_layers=tuple(True for _ in range(n_layers)),
        router_logit_bias=True,
        expert_bias=True,
        activation="swiglu_oai",
        swiglu_limit=limit,  # type- and range-checked with the config (check_ffn_fields)
        swiglu_alpha=alpha,
    )


def _gguf_name(arch: str, name: str, shape: tuple[int, ...]) -> tuple[str, tuple[int, ...]]:
    cname, shape = plain_gguf_name(arch, name, shape)
    # llama.cpp names gpt-oss's FFN norm after transformers' post_attention_layernorm.
    return re.sub(r"^(blk\.\d+\.)post_attention_norm$", r"\1ffn_norm", cname), shape


def _gguf_config(inp: GGUFInput) -> ModelConfig:
    a, meta, tensors, base = inp.arch, inp.meta, inp.tensors, inp.base
    n_layers = base["n_layers"]
    head_dim = meta.int(f"{a}.attention.key_length", base["hidden_size"] // base["n_heads"])
    if "blk.0.ffn_gate_inp" not in tensors or "blk.0.ffn_gate_exps.0" not in tensors:
        raise ModelFormatError(f"{inp.where}: a gpt-oss file without routed experts")
    window = meta.int(f"{a}.attention.sliding_window", 0, lo=0)
    return ModelConfig(
        **base,
        arch=ARCH,
        head_dim=head_dim,
        intermediate_size=0,
        attention_bias="blk.0.attn_q.bias" in tensors,
        attention_out_bias="blk.0.attn_output.bias" in tensors,
        attention_sinks="blk.0.attn_sinks" in tensors,
        sliding_window=window,
        sliding_layers=tuple(bool(window) and i % 2 == 0 for i in range(n_layers)),
        n_experts=meta.int(f"{a}.expert_count", 0, lo=0),
        n_experts_per_tok=meta.int(f"{a}.expert_used_count", 0, lo=0),
        moe_intermediate_size=tensors["blk.0.ffn_gate_exps.0"].shape[0],
        norm_topk_prob=True,
        moe_layers=tuple(True for _ in range(n_layers)),
        router_logit_bias="blk.0.ffn_gate_inp.bias" in tensors,
        expert_bias="blk.0.ffn_gate_exps.bias" in tensors,
        activation="swiglu_oai",
        swiglu_limit=GGUF_SWIGLU_LIMIT,
        swiglu_alpha=SWIGLU_ALPHA,
    )


FAMILY = Family(
    name="gpt_oss",
    archs=(ARCH,),
    attention=("gqa",),
    routers=("softmax",),
    hf_model_types={"gpt_oss": ARCH},
    hf_arch_classes={"GptOssForCausalLM": ARCH},
    hf_names=_NAMES,
    hf_config=_hf_config,
    gguf_architectures=("gpt-oss",),
    gguf_config=_gguf_config,
    gguf_name=_gguf_name,
    hf_experts=gpt_oss_experts,
)
