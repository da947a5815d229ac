"""MiMo-V2-Flash (Xiaomi): grouped-query attention whose sliding-window layers differ from
its full layers, a dense first layer, then MoE layers routed by sigmoid scores with a
selection-only correction bias and no shared experts.

* ``mimo_v2_flash``: Hugging Face ``mimo_v2_flash`` / ``MiMoV2FlashForCausalLM``
  (transformers 5.25); GGUF ``mimo2`` (llama.cpp's LLM_ARCH_MIMO2, read by
  mimo_v2_flash_gguf.py).

* config.json is read as transformers' ``MiMoV2FlashConfig`` reads it, with its defaults
  for what a file leaves out: ``layer_types`` (full at layer 0 and every 6th, else
  sliding), ``mlp_layer_types`` ("dense" then "sparse"), ``rope_parameters`` keyed by layer
  type, ``sliding_window`` (or ``sliding_window_size`` + 1), ``v_head_dim`` 128,
  ``attention_value_scale`` 0.707 (null: 1), ``rms_norm_eps`` 1e-5. Keys the config class
  does not read (``hybrid_layer_pattern``, ``moe_layer_freq``, ``swa_*`` of the original
  remote code) are not read here either.
* Attention, per layer type (ModelConfig's per-layer-type GQA overrides): the sliding
  layers have twice ``num_key_value_heads`` KV heads, their own RoPE base, and a learned
  sink logit per query head (``self_attn.attention_sink_bias``); the full layers none.
  Values are ``v_head_dim`` wide (query/key heads ``head_dim``) and multiplied by
  ``attention_value_scale`` as projected (before the cache; the bias, if any, included).
  Softmax scale 1/sqrt(head_dim).
* RoPE: halves (NEOX) over the first ``int(head_dim * partial_rotary_factor)``
  dimensions; colibri needs the same, even rotated width and ``rope_type`` "default" for both
  layer types.
* Routing: DeepSeek-V3's ``sigmoid_grouped`` rule (``n_group`` / ``topk_group``,
  ``norm_topk_prob``, ``routed_scaling_factor``); experts stored one per expert
  (``mlp.experts.{e}.{gate,up,down}_proj``), the router ``mlp.gate.weight`` and its bias
  ``mlp.gate.e_score_correction_bias``.
* The multi-token-prediction weights (``model.mtp.*``) are ignored, as transformers
  ignores them: they are neither loaded nor run.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ...errors import UnsupportedError
from ..fields import as_float, bad
from ..manifest import ModelConfig
from .common import DECODER_NAMES, LAYER, refuse_hf_features
from .mimo_v2_flash_gguf import (
    GGUF_ARCHS,
    GGUF_MTP_KEY,
    gguf_config,
    gguf_name,
    gguf_tensors,
)
from .spec import Family, HFInput, NameRule

ARCH = "mimo_v2_flash"
_NAMES: list[NameRule] = [
    *DECODER_NAMES,
    (re.compile(LAYER + r"self_attn\.attention_sink_bias"), "blk.{0}.attn_sinks"),
    (re.compile(LAYER + r"mlp\.gate\.e_score_correction_bias"), "blk.{0}.exp_probs_b"),
]
_BIAS = "mlp.gate.e_score_correction_bias"
_TYPES = ("full_attention", "sliding_attention")
# transformers' MiMoV2FlashConfig defaults.
_DEFAULT_ROPE = {
    "full_attention": {"rope_type": "default", "rope_theta": 5_000_000.0,
                       "partial_rotary_factor": 0.334},
    "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0,
                          "partial_rotary_factor": 0.334},
}  # fmt: skip
_DEFAULT_PRF = 0.334
_DEFAULT_VALUE_SCALE = 0.707


def _mtp_dropped(name: str) -> str | None:
    """The multi-token-prediction weights are not loaded (transformers ignores them)."""
    return None if name.startswith("model.mtp.") else name


def _layer_types(cfg: Mapping[str, Any], n_layers: int, where: object) -> tuple[bool, ...]:
    """Per layer, True for a sliding layer."""
    types = cfg.get("layer_types")
    if types is None:
        return tuple(not (i == 0 or (i + 1) % 6 == 0) for i in range(n_layers))
    if not isinstance(types, list) or len(types) != n_layers or any(t not in _TYPES
                                                                   for t in types):
        raise bad(where, "layer_types", types,
                  f"{n_layers} entries, each full_attention or sliding_attention")  # fmt: skip
    return tuple(t == "sliding_attention" for t in types)


def _moe_layers(cfg: Mapping[str, Any], n_layers: int, where: object) -> tuple[bool, ...]:
    types = cfg.get("mlp_layer_types")
    if types is None:
        return tuple(i > 0 for i in range(n_layers))
    if not isinstance(types, list) or len(types) != n_layers or any(t not in ("dense", "sparse")
                                                                   for t in types):
        raise bad(where, "mlp_layer_types", types,
                  f"{n_layers} entries, each dense or sparse")  # fmt: skip
    return tuple(t == "sparse" for t in types)


def _rope(cfg: Mapping[str, Any], kind: str, head_dim: int, where: object) -> tuple[float, int]:
    """(rope_theta, rotated dimensions) of one layer type's ``rope_parameters`` entry."""
    params = cfg.get("rope_parameters")
    params = _DEFAULT_ROPE if params is None else params
    if not isinstance(params, dict) or not isinstance(params.get(kind), dict):
        raise bad(where, "rope_parameters", params,
                  f"an object with a {kind} object (per layer type)")  # fmt: skip
    p = params[kind]
    if p.get("rope_type", "default") != "default":
        raise UnsupportedError(f"{where}: rope_type {p.get('rope_type')!r} for {kind} layers is "
                               f"not supported for mimo_v2_flash (only 'default')")  # fmt: skip
    theta = as_float(p.get("rope_theta"), f"rope_parameters.{kind}.rope_theta", where, lo=0.0,
                     lo_open=True)  # fmt: skip
    prf = as_float(p.get("partial_rotary_factor", _DEFAULT_PRF),
                   f"rope_parameters.{kind}.partial_rotary_factor", where, lo=0.0,
                   lo_open=True)  # fmt: skip
    rot = int(head_dim * prf)
    if prf > 1 or rot < 2 or rot % 2:
        raise bad(where, f"rope_parameters.{kind}.partial_rotary_factor", prf,
                  f"a factor giving an even rotated width in [2, head_dim {head_dim}]")  # fmt: skip
    return theta, rot


def _hf_config(inp: HFInput) -> ModelConfig:
    refuse_hf_features(inp, attention_bias=True)  # q/k/v biases only: o_proj has none
    cfg, f, where = inp.cfg, inp.fields, inp.fields.where
    n_layers, head_dim = inp.base["n_layers"], inp.base["head_dim"]
    sliding = _layer_types(cfg, n_layers, where)
    moe = _moe_layers(cfg, n_layers, where)
    full_rope = _rope(cfg, "full_attention", head_dim, where) if not all(sliding) else None
    swa_rope = _rope(cfg, "sliding_attention", head_dim, where) if any(sliding) else None
    theta, rot = full_rope or swa_rope or (10000.0, head_dim)
    if full_rope and swa_rope and full_rope[1] != swa_rope[1]:
        raise UnsupportedError(f"{where}: full and sliding layers rotating different widths "
                               f"({full_rope[1]}, {swa_rope[1]}) are not supported")  # fmt: skip
    window = 0
    if any(sliding):
        size = cfg.get("sliding_window_size")
        window = f.int("sliding_window_size", lo=1) + 1 if size is not None else \
            f.int("sliding_window", 129, lo=1)  # fmt: skip
    scale = cfg.get("attention_value_scale", _DEFAULT_VALUE_SCALE)
    eps = as_float(cfg.get("rms_norm_eps", 1e-5), "rms_norm_eps", where, lo=0.0)
    routed_scale = cfg.get("routed_scaling_factor")
    routed_scale = 1.0 if routed_scale is None else as_float(
        routed_scale, "routed_scaling_factor", where, lo=0.0, lo_open=True)
    base = {**inp.base, "rms_norm_eps": eps, "rope_theta": theta, "rope_scaling": None}
    n_kv = inp.base["n_kv_heads"]
    return ModelConfig(
        **base,
        arch=ARCH,
        intermediate_size=f.int("intermediate_size") if not all(moe) else 0,
        attention_bias=f.bool("attention_bias", False),
        rotary_dim=rot,
        v_head_dim=f.int("v_head_dim", 128),
        attention_sinks=any(sliding),
        sinks_sliding_only=True,
        sliding_window=window,
        sliding_layers=sliding,
        sliding_n_kv_heads=2 * n_kv if any(sliding) else 0,
        sliding_rope_theta=swa_rope[0] if full_rope and swa_rope else 0.0,
        attention_value_scale=1.0 if scale is None else scale,  # range-checked with the config
        n_experts=f.int("n_routed_experts", 256) if any(moe) else 0,
        n_experts_per_tok=f.int("num_experts_per_tok", 8) if any(moe) else 0,
        moe_intermediate_size=f.int("moe_intermediate_size", 2048) if any(moe) else 0,
        norm_topk_prob=f.bool("norm_topk_prob", True),
        shared_expert_gated=False,
        moe_layers=moe,
        router="sigmoid_grouped",
        routed_scaling_factor=routed_scale,
        n_group=f.int("n_group", 1),
        topk_group=f.int("topk_group", 1),
        router_bias=any(n.endswith(_BIAS) for n in inp.names),
    )


FAMILY = Family(
    name="mimo_v2_flash",
    archs=(ARCH,),
    attention=("gqa",),
    routers=("sigmoid_grouped",),
    hf_model_types={"mimo_v2_flash": ARCH},
    hf_arch_classes={"MiMoV2FlashForCausalLM": ARCH},
    hf_names=_NAMES,
    hf_config=_hf_config,
    gguf_architectures=GGUF_ARCHS,
    gguf_config=gguf_config,
    gguf_name=gguf_name,
    gguf_tensors=gguf_tensors,
    gguf_kv_heads_by_layer=True,
    gguf_mtp_key=GGUF_MTP_KEY,
    hf_rename=_mtp_dropped,
    hf_rope_by_layer_type=True,
)
