"""Llama (dense) and Mixtral (MoE): grouped-query attention, RMSNorm, SwiGLU, full RoPE;
Mixtral routes every layer's FFN to 8 experts by softmax top-2, renormalized.

* ``llama``: Hugging Face ``llama`` / ``LlamaForCausalLM``; GGUF ``llama`` with
  ``llama.expert_count`` 0 (or absent).
* ``mixtral``: Hugging Face ``mixtral`` / ``MixtralForCausalLM``; GGUF ``llama`` with
  ``llama.expert_count`` > 0.

* Mixtral checkpoints name their experts ``block_sparse_moe.experts.{e}.w1/w2/w3`` (w1 =
  gate, w2 = down, w3 = up) and the router ``block_sparse_moe.gate``; config.json's
  ``intermediate_size`` is the expert width (and its ``"head_dim": null`` means
  hidden / heads); sliding-window attention is refused.
* llama.cpp's ``llama`` converter permutes the rows of Q and K (and their biases) for its
  interleaved RoPE (``LlamaModel.permute``); the loader restores Hugging Face's order
  (``rope_unpermute_heads``). llama3 RoPE scaling arrives as a ``rope_freqs`` tensor.
* Top-k renormalization: always for Mixtral (its modeling code and llama.cpp's graph).
"""

from __future__ import annotations

import re

from ..manifest import ModelConfig
from .common import (
    DECODER_NAMES,
    LAYER,
    gguf_gqa_config,
    hf_expert_counts,
    refuse_hf_features,
    unsupported_if,
)
from .spec import Family, GGUFInput, HFInput, NameRule

_MIXTRAL_NAMES: list[NameRule] = [
    (re.compile(LAYER + r"block_sparse_moe\.gate\.weight"), "blk.{0}.ffn_gate_inp"),
    (re.compile(LAYER + r"block_sparse_moe\.experts\.(\d+)\.w1\.weight"),
     "blk.{0}.ffn_gate_exps.{1}"),
    (re.compile(LAYER + r"block_sparse_moe\.experts\.(\d+)\.w2\.weight"),
     "blk.{0}.ffn_down_exps.{1}"),
    (re.compile(LAYER + r"block_sparse_moe\.experts\.(\d+)\.w3\.weight"),
     "blk.{0}.ffn_up_exps.{1}"),
]  # fmt: skip


def _hf_config(inp: HFInput) -> ModelConfig:
    refuse_hf_features(inp)
    n_layers = inp.base["n_layers"]
    width = inp.fields.int("intermediate_size", 0, lo=0)
    if inp.arch == "llama":
        return ModelConfig(**inp.base, arch="llama", intermediate_size=width,
                           moe_layers=tuple(False for _ in range(n_layers)))  # fmt: skip
    unsupported_if(inp.cfg.get("sliding_window"), inp.d, "sliding-window attention")
    n_exp, top_k = hf_expert_counts(inp)
    return ModelConfig(
        **inp.base, arch="mixtral", intermediate_size=0, n_experts=n_exp,
        n_experts_per_tok=top_k, moe_intermediate_size=width, norm_topk_prob=True,
        moe_layers=tuple(True for _ in range(n_layers)),
    )  # fmt: skip


def _gguf_config(inp: GGUFInput) -> ModelConfig:
    mixtral = inp.meta.int(f"{inp.arch}.expert_count", 0, lo=0) > 0
    arch = "mixtral" if mixtral else "llama"
    return gguf_gqa_config(inp, arch, norm_topk=mixtral, qk_norm="head", moe=mixtral)


FAMILY = Family(
    name="llama",
    archs=("llama", "mixtral"),
    attention=("gqa",),
    routers=("softmax",),
    hf_model_types={"llama": "llama", "mixtral": "mixtral"},
    hf_arch_classes={"LlamaForCausalLM": "llama", "MixtralForCausalLM": "mixtral"},
    hf_names=[*DECODER_NAMES, *_MIXTRAL_NAMES],
    hf_config=_hf_config,
    gguf_architectures=("llama",),
    gguf_config=_gguf_config,
    gguf_permuted=("llama",),
)
