"""Qwen2-MoE and Qwen3-MoE: grouped-query attention, softmax top-k routing; Qwen2-MoE adds
a shared expert behind a sigmoid gate and q/k/v biases, Qwen3-MoE a per-head QK-norm.

* ``qwen2_moe``: Hugging Face ``qwen2_moe`` / ``Qwen2MoeForCausalLM``; GGUF ``qwen2moe``.
* ``qwen3_moe``: Hugging Face ``qwen3_moe`` / ``Qwen3MoeForCausalLM``; GGUF ``qwen3moe``.

* config.json: ``moe_intermediate_size`` is the expert width; dense layers are those in
  ``mlp_only_layers`` or off the ``decoder_sparse_step``; Qwen3-MoE writes
  ``num_local_experts`` (older files: ``num_experts``); Qwen2-MoE's
  ``shared_expert_intermediate_size`` (0: none); its q/k/v biases are read when the
  checkpoint has them (newer files write ``qkv_bias``, older ones have no such key and
  always the biases).
* Top-k renormalization: config.json's ``norm_topk_prob``; in GGUF files as llama.cpp's
  graphs hard-code it (qwen3moe: yes, qwen2moe: no), so a GGUF computes what llama.cpp
  computes. GGUF stores Q/K unpermuted (NEOX RoPE).
"""

from __future__ import annotations

import re

from ..fields import as_int, bad
from ..manifest import ModelConfig
from .common import DECODER_NAMES, LAYER, gguf_gqa_config, hf_expert_counts, refuse_hf_features
from .spec import Family, GGUFInput, HFInput, NameRule, plain_gguf_name

SHARED_EXPERT_NAMES: list[NameRule] = [
    (re.compile(LAYER + r"mlp\.shared_expert\.(gate|up|down)_proj\.weight"),
     "blk.{0}.ffn_{1}_shexp"),
    (re.compile(LAYER + r"mlp\.shared_expert_gate\.weight"), "blk.{0}.ffn_gate_inp_shexp"),
]  # fmt: skip
_GGUF_ARCHS = {"qwen2moe": "qwen2_moe", "qwen3moe": "qwen3_moe"}
_GGUF_NORM_TOPK = {"qwen2_moe": False, "qwen3_moe": True}  # llama.cpp's build_moe_ffn norm_w


def _hf_config(inp: HFInput) -> ModelConfig:
    qwen2 = inp.arch == "qwen2_moe"
    refuse_hf_features(inp, attention_bias=qwen2)
    f, where, n_layers = inp.fields, inp.fields.where, inp.base["n_layers"]
    dense = f.int("intermediate_size", 0, lo=0)
    n_exp, top_k = hf_expert_counts(inp)
    moe_ffn = f.int("moe_intermediate_size")
    step = f.int("decoder_sparse_step", 1)
    only_raw = inp.cfg.get("mlp_only_layers") or []
    if not isinstance(only_raw, list):
        raise bad(where, "mlp_only_layers", only_raw, "a list of layer indices")
    only = {as_int(i, "mlp_only_layers", where) for i in only_raw}
    moe_layers = tuple(i not in only and (i + 1) % step == 0 for i in range(n_layers))
    norm_topk = f.bool("norm_topk_prob")
    shared = f.int("shared_expert_intermediate_size", 0, lo=0) if qwen2 else 0
    return ModelConfig(
        **inp.base,
        arch=inp.arch,
        intermediate_size=0 if all(moe_layers) else dense,
        qk_norm="none" if qwen2 else "head",
        attention_bias=qwen2 and "model.layers.0.self_attn.q_proj.bias" in inp.names,
        n_experts=n_exp,
        n_experts_per_tok=top_k,
        moe_intermediate_size=moe_ffn,
        norm_topk_prob=norm_topk,
        shared_expert_intermediate_size=shared,
        moe_layers=moe_layers,
    )


def _gguf_name(arch: str, name: str, shape: tuple[int, ...]) -> tuple[str, tuple[int, ...]]:
    cname, shape = plain_gguf_name(arch, name, shape)
    if cname.endswith("ffn_gate_inp_shexp") and len(shape) == 1:
        shape = (1, shape[0])  # llama.cpp creates it as {n_embd}; either layout is one row
    return cname, shape


def _gguf_config(inp: GGUFInput) -> ModelConfig:
    arch = _GGUF_ARCHS[inp.arch]
    return gguf_gqa_config(inp, arch, norm_topk=_GGUF_NORM_TOPK[arch], qk_norm="head", moe=True)


FAMILY = Family(
    name="qwen_moe",
    archs=("qwen2_moe", "qwen3_moe"),
    attention=("gqa",),
    routers=("softmax",),
    hf_model_types={"qwen2_moe": "qwen2_moe", "qwen3_moe": "qwen3_moe"},
    hf_arch_classes={"Qwen2MoeForCausalLM": "qwen2_moe", "Qwen3MoeForCausalLM": "qwen3_moe"},
    hf_names=[*DECODER_NAMES, *SHARED_EXPERT_NAMES],
    hf_config=_hf_config,
    gguf_architectures=tuple(_GGUF_ARCHS),
    gguf_config=_gguf_config,
    gguf_name=_gguf_name,
)
