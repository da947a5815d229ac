"""MiniMax-M2: grouped-query attention with an RMSNorm over the whole Q and K projections
(OLMoE's "full" QK-norm, weights n_heads * head_dim and n_kv_heads * head_dim wide) and
partial RoPE; every layer routes to its experts by sigmoid scores with a selection-only
correction bias, top-k renormalized, no expert groups and no shared experts.

* ``minimax_m2``: Hugging Face ``minimax_m2`` / ``MiniMaxM2ForCausalLM``; GGUF
  ``minimax-m2`` (llama.cpp's LLM_ARCH_MINIMAX_M2).

* Routing: DeepSeek-V3's ``sigmoid_grouped`` rule with one group (n_group = topk_group =
  1): choose the top k of sigmoid(logit) + ``e_score_correction_bias``, weight by the
  sigmoid scores renormalized to sum 1, no scaling. transformers' modeling code always
  renormalizes, and llama.cpp's graph hard-codes it; config.json's ``scoring_func`` (the
  released files: "sigmoid") must be sigmoid when present.
* Partial RoPE as halves (NEOX) over the first ``rotary_dim`` dimensions of each head:
  ``partial_rotary_factor`` (in ``rope_parameters`` or at the top level) of ``head_dim``,
  else the released files' ``rotary_dim`` (transformers reads it the same way); GGUF
  ``rope.dimension_count``.
* Checkpoints name the experts as Mixtral does (``block_sparse_moe.experts.{e}.w1/w2/w3``:
  gate, down, up), the router ``block_sparse_moe.gate`` and the bias
  ``block_sparse_moe.e_score_correction_bias``; config.json's ``intermediate_size`` is the
  expert width. llama.cpp stores the bias as ``exp_probs_b.bias``.
"""

from __future__ import annotations

import re

from ...errors import ModelFormatError, UnsupportedError
from ..fields import as_float
from ..manifest import ModelConfig
from .common import DECODER_NAMES, LAYER, hf_expert_counts, refuse_hf_features
from .deepseek_moe import gguf_moe, gguf_name
from .spec import Family, GGUFInput, HFInput, NameRule

ARCH = "minimax_m2"
_MOE = LAYER + r"block_sparse_moe\."
_NAMES: list[NameRule] = [
    *DECODER_NAMES,
    (re.compile(_MOE + r"gate\.weight"), "blk.{0}.ffn_gate_inp"),
    (re.compile(_MOE + r"e_score_correction_bias"), "blk.{0}.exp_probs_b"),
    (re.compile(_MOE + r"experts\.(\d+)\.w1\.weight"), "blk.{0}.ffn_gate_exps.{1}"),
    (re.compile(_MOE + r"experts\.(\d+)\.w2\.weight"), "blk.{0}.ffn_down_exps.{1}"),
    (re.compile(_MOE + r"experts\.(\d+)\.w3\.weight"), "blk.{0}.ffn_up_exps.{1}"),
]
_BIAS = "block_sparse_moe.e_score_correction_bias"


def _rotary_dim(inp: HFInput, head_dim: int) -> int:
    """transformers' reading: partial_rotary_factor when given, else rotary_dim / head_dim,
    else the whole head."""
    where = inp.fields.where
    params = inp.cfg.get("rope_parameters")
    params = params if isinstance(params, dict) else {}
    prf = params.get("partial_rotary_factor", inp.cfg.get("partial_rotary_factor"))
    if prf is None:
        rot = inp.cfg.get("rotary_dim")
        if rot is None:
            return head_dim
        prf = as_float(rot, "rotary_dim", where, lo=0.0, lo_open=True) / head_dim
    prf = as_float(prf, "partial_rotary_factor", where, lo=0.0, lo_open=True)
    if prf > 1:
        raise ModelFormatError(f"{where}: partial_rotary_factor {prf} > 1 (rotary_dim larger "
                               f"than head_dim {head_dim})")  # fmt: skip
    return int(head_dim * prf)


def _hf_config(inp: HFInput) -> ModelConfig:
    refuse_hf_features(inp)
    scoring = inp.cfg.get("scoring_func")
    if scoring not in (None, "sigmoid"):
        raise UnsupportedError(f"{inp.d}: scoring_func {scoring!r} is not supported for "
                               f"minimax_m2 (its routing is 'sigmoid')")  # fmt: skip
    n_exp, top_k = hf_expert_counts(inp)
    n_layers = inp.base["n_layers"]
    return ModelConfig(
        **inp.base,
        arch=ARCH,
        intermediate_size=0,
        rotary_dim=_rotary_dim(inp, inp.base["head_dim"]),
        qk_norm="full",
        n_experts=n_exp,
        n_experts_per_tok=top_k,
        moe_intermediate_size=inp.fields.int("intermediate_size"),
        norm_topk_prob=True,
        shared_expert_gated=False,
        moe_layers=tuple(True for _ in range(n_layers)),
        router="sigmoid_grouped",
        router_bias=any(n.endswith(_BIAS) for n in inp.names),
    )


def _gguf_config(inp: GGUFInput) -> ModelConfig:
    a, meta = inp.arch, inp.meta
    out = gguf_moe(inp)  # sigmoid unless expert_gating_func says otherwise; bias; widths
    if out["router"] != "sigmoid_grouped" or out["shared_expert_intermediate_size"]:
        raise UnsupportedError(f"{inp.where}: a minimax-m2 file routes by sigmoid scores "
                               f"without shared experts")  # fmt: skip
    head_dim = meta.int(f"{a}.attention.key_length", out["hidden_size"] // out["n_heads"])
    if meta.int(f"{a}.attention.value_length", head_dim) != head_dim:
        raise UnsupportedError(f"{inp.where}: key and value head sizes differ")
    out.update(
        arch=ARCH,
        head_dim=head_dim,
        rotary_dim=meta.int(f"{a}.rope.dimension_count", head_dim, lo=0),
        qk_norm="full",
        norm_topk_prob=True,  # llama.cpp's graph for minimax-m2 hard-codes it
    )
    return ModelConfig(**out)


FAMILY = Family(
    name="minimax_m2",
    archs=(ARCH,),
    attention=("gqa",),
    routers=("sigmoid_grouped",),
    hf_model_types={"minimax_m2": ARCH},
    hf_arch_classes={"MiniMaxM2ForCausalLM": ARCH},
    hf_names=_NAMES,
    hf_config=_hf_config,
    gguf_architectures=("minimax-m2",),
    gguf_config=_gguf_config,
    gguf_name=gguf_name,
)
