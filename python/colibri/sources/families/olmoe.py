"""OLMoE: grouped-query attention with an RMSNorm over the whole Q and K projections (not
per head), softmax top-k routing in every layer.

* ``olmoe``: Hugging Face ``olmoe`` / ``OlmoeForCausalLM``; GGUF ``olmoe``.

* config.json's ``intermediate_size`` is the expert width; ``clip_qkv`` (activation
  clipping) is refused; ``norm_topk_prob`` as written (llama.cpp's graph: no
  renormalization, which GGUF files follow). GGUF stores Q/K unpermuted (NEOX RoPE).
"""

from __future__ import annotations

from ..manifest import ModelConfig
from .common import DECODER_NAMES, gguf_gqa_config, hf_expert_counts, refuse_hf_features
from .spec import Family, GGUFInput, HFInput


def _hf_config(inp: HFInput) -> ModelConfig:
    refuse_hf_features(inp)
    width = inp.fields.int("intermediate_size", 0, lo=0)
    n_exp, top_k = hf_expert_counts(inp)
    return ModelConfig(
        **inp.base, arch="olmoe", intermediate_size=0, qk_norm="full", n_experts=n_exp,
        n_experts_per_tok=top_k, moe_intermediate_size=width,
        norm_topk_prob=inp.fields.bool("norm_topk_prob"),
        moe_layers=tuple(True for _ in range(inp.base["n_layers"])),
    )  # fmt: skip


def _gguf_config(inp: GGUFInput) -> ModelConfig:
    return gguf_gqa_config(inp, "olmoe", norm_topk=False, qk_norm="full", moe=True)


FAMILY = Family(
    name="olmoe",
    archs=("olmoe",),
    attention=("gqa",),
    routers=("softmax",),
    hf_model_types={"olmoe": "olmoe"},
    hf_arch_classes={"OlmoeForCausalLM": "olmoe"},
    hf_names=DECODER_NAMES,
    hf_config=_hf_config,
    gguf_architectures=("olmoe",),
    gguf_config=_gguf_config,
)
