"""The DeepSeek-V3 / GLM family in Hugging Face checkpoints: config.json -> ModelConfig, the
tensor names, and the split of ``kv_b_proj`` into the absorbed-MLA tensors.

Families (``model_type``, or ``architectures[0]``):

=================  =====================================  =========================================
family             model_type / architecture              what it is
=================  =====================================  =========================================
``deepseek_v3``    ``deepseek_v3``, ``kimi_k2`` /         DeepSeek-V3, R1, V3.1; Kimi-K2 (same
                   ``DeepseekV3ForCausalLM``              architecture): MLA, sigmoid routing
``deepseek_v2``    ``deepseek_v2`` /                      DeepSeek-V2, V2-Lite (no q-LoRA): MLA,
                   ``DeepseekV2ForCausalLM``              softmax routing (``topk_method``)
``deepseek_v32``   ``deepseek_v32`` / ``DeepseekV32...``  DeepSeek-V3.2: MLA + DSA indexer
``glm4_moe``       ``glm4_moe`` / ``Glm4MoeForCausalLM``  GLM-4.5/4.6/4.7: GQA, partial RoPE,
                                                          optional QK-norm, q/k/v bias
``glm4_moe_lite``  ``glm4_moe_lite`` / ``Glm4MoeLite...`` GLM-4.7-Flash: MLA
``glm_moe_dsa``    ``glm_moe_dsa`` / ``GlmMoeDsa...``     GLM-5.x: MLA + DSA indexer
=================  =====================================  =========================================

What follows transformers 5.24 (the oracle) and the reference code it ports:

* MLA: ``head_dim`` of the ModelConfig is ``qk_nope + qk_rope`` (config.json's ``head_dim``
  is the rope width there and is ignored). RoPE covers ``qk_rope_head_dim``; interleaved
  pairs for DeepSeek-V2 (always), V3 and GLM-4.7-Flash (``rope_interleave``, default true),
  V3.2 and GLM-5 (always). The q-LoRA and latent RMSNorms use eps 1e-6 (their modules'
  default, not ``rms_norm_eps``). Softmax scale ``qk^-0.5``, times ``mscale(factor,
  mscale_all_dim)^2`` for a scaled RoPE with ``mscale_all_dim``.
* ``kv_b_proj`` [heads * (nope + v), kv_lora] becomes ``attn_k_b`` (each head's
  [nope, kv_lora] block, transposed at load: ``TensorInfo.transpose_heads``) and
  ``attn_v_b`` (each head's [v, kv_lora] rows): decode then runs absorbed.
* Routing: ``scoring_func``/``topk_method`` as real checkpoints spell them. DeepSeek-V3,
  V3.2, Kimi-K2 and GLM: sigmoid + ``noaux_tc`` (the only rule their reference code has).
  DeepSeek-V2: softmax with ``greedy`` or ``group_limited_greedy``; ``norm_topk_prob``
  renormalizes as the released modeling code does (transformers' port drops it; the
  released V2 configs all have it false). Anything else is refused, naming it.
* Shared experts: ``n_shared_experts * moe_intermediate_size`` wide, added unweighted.
  Dense leading layers: ``mlp_layer_types`` when present, else ``first_k_dense_replace``.
* DSA: ``index_n_heads``, ``index_head_dim``, ``index_topk``; GLM-5's ``indexer_types``
  (or the ``index_topk_pattern`` / ``index_topk_freq`` + ``index_skip_topk_offset``
  schedule it is derived from); indexer RoPE interleaved for GLM-5, half-split for V3.2.
* Multi-token prediction: layers ``num_hidden_layers ..`` present in the checkpoint (up to
  ``num_nextn_predict_layers``) are kept as MTP layers (``n_mtp_layers``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ..errors import ModelFormatError, UnsupportedError
from .fields import as_bool, as_float, as_int
from .manifest import Extent, IndexerType, ModelConfig, QkNorm, RouterKind

MODEL_TYPES = {
    "deepseek_v2": "deepseek_v2",
    "deepseek_v3": "deepseek_v3",
    "kimi_k2": "deepseek_v3",
    "deepseek_v32": "deepseek_v32",
    "glm4_moe": "glm4_moe",
    "glm4_moe_lite": "glm4_moe_lite",
    "glm_moe_dsa": "glm_moe_dsa",
}
ARCH_CLASSES = {
    "DeepseekV2ForCausalLM": "deepseek_v2",
    "DeepseekV3ForCausalLM": "deepseek_v3",
    "DeepseekV32ForCausalLM": "deepseek_v32",
    "Glm4MoeForCausalLM": "glm4_moe",
    "Glm4MoeLiteForCausalLM": "glm4_moe_lite",
    "GlmMoeDsaForCausalLM": "glm_moe_dsa",
}
MLA_FAMILIES = ("deepseek_v2", "deepseek_v3", "deepseek_v32", "glm4_moe_lite", "glm_moe_dsa")
DSA_FAMILIES = ("deepseek_v32", "glm_moe_dsa")
FAMILIES = (*MLA_FAMILIES, "glm4_moe")

# transformers' defaults for keys a config.json may leave out, per family.
_DENSE_LEAD = {"deepseek_v2": 0, "deepseek_v3": 3, "deepseek_v32": 3, "glm4_moe": 1,
               "glm4_moe_lite": 1, "glm_moe_dsa": 3}  # fmt: skip
_SCALING = {"deepseek_v2": 1.0, "deepseek_v3": 2.5, "deepseek_v32": 2.5, "glm4_moe": 1.0,
            "glm4_moe_lite": 1.8, "glm_moe_dsa": 2.5}  # fmt: skip
MLA_NORM_EPS = 1e-6  # DeepseekV3RMSNorm(q_lora_rank) / (kv_lora_rank): the module default

_L = r"model\.layers\.(\d+)\."
RULES: list[tuple[re.Pattern[str], str]] = [
    (re.compile(_L + r"self_attn\.q_a_proj\.weight"), "blk.{0}.attn_q_a"),
    (re.compile(_L + r"self_attn\.q_a_layernorm\.weight"), "blk.{0}.attn_q_a_norm"),
    (re.compile(_L + r"self_attn\.q_b_proj\.weight"), "blk.{0}.attn_q_b"),
    (re.compile(_L + r"self_attn\.kv_a_proj_with_mqa\.weight"), "blk.{0}.attn_kv_a_mqa"),
    (re.compile(_L + r"self_attn\.kv_a_layernorm\.weight"), "blk.{0}.attn_kv_a_norm"),
    (re.compile(_L + r"self_attn\.indexer\.wq_b\.weight"), "blk.{0}.indexer.attn_q_b"),
    (re.compile(_L + r"self_attn\.indexer\.wk\.weight"), "blk.{0}.indexer.attn_k"),
    (re.compile(_L + r"self_attn\.indexer\.k_norm\.weight"), "blk.{0}.indexer.k_norm"),
    (re.compile(_L + r"self_attn\.indexer\.k_norm\.bias"), "blk.{0}.indexer.k_norm.bias"),
    (re.compile(_L + r"self_attn\.indexer\.weights_proj\.weight"), "blk.{0}.indexer.proj"),
    (re.compile(_L + r"mlp\.gate\.e_score_correction_bias"), "blk.{0}.exp_probs_b"),
    (re.compile(_L + r"mlp\.shared_experts\.(gate|up|down)_proj\.weight"), "blk.{0}.ffn_{1}_shexp"),
    (re.compile(_L + r"eh_proj\.weight"), "blk.{0}.nextn.eh_proj"),
    (re.compile(_L + r"enorm\.weight"), "blk.{0}.nextn.enorm"),
    (re.compile(_L + r"hnorm\.weight"), "blk.{0}.nextn.hnorm"),
    (re.compile(_L + r"shared_head\.norm\.weight"), "blk.{0}.nextn.shared_head_norm"),
    (re.compile(_L + r"shared_head\.head\.weight"), "blk.{0}.nextn.shared_head_head"),
    (re.compile(_L + r"embed_tokens\.weight"), "blk.{0}.nextn.embed_tokens"),
]
KV_B = re.compile(_L + r"self_attn\.kv_b_proj\.weight")
_LAYER = re.compile(r"model\.layers\.(\d{1,9})\.")


def _int(cfg: Mapping[str, Any], key: str, where: Path, default: int | None = None,
         lo: int = 0) -> int:  # fmt: skip
    v = cfg.get(key)
    if v is None:
        v = default
    if v is None:
        raise ModelFormatError(f"{where / 'config.json'}: missing key {key!r}")
    return as_int(v, key, where / "config.json", lo=lo, floats=True)


def _bool(cfg: Mapping[str, Any], key: str, where: Path, default: bool) -> bool:
    v = cfg.get(key)
    return default if v is None else as_bool(v, key, where / "config.json")


def _float(cfg: Mapping[str, Any], key: str, where: Path, default: float) -> float:
    v = cfg.get(key)
    return default if v is None else as_float(v, key, where / "config.json", lo=0.0, lo_open=True)


def _router(fam: str, cfg: Mapping[str, Any], d: Path) -> tuple[RouterKind, bool]:
    """(router kind, uses the selection bias) from scoring_func / topk_method."""
    scoring = cfg.get("scoring_func")
    method = cfg.get("topk_method")
    if fam == "deepseek_v2":
        if scoring not in (None, "softmax"):
            raise UnsupportedError(
                f"{d}: scoring_func {scoring!r} is not supported for deepseek_v2 (its modeling "
                f"code implements 'softmax' only)"
            )
        if method in (None, "greedy"):
            return "softmax", False
        if method == "group_limited_greedy":
            return "softmax_group_limited", False
        raise UnsupportedError(
            f"{d}: topk_method {method!r} is not supported for deepseek_v2 (supported: "
            f"'greedy', 'group_limited_greedy')"
        )
    if scoring not in (None, "sigmoid"):
        raise UnsupportedError(
            f"{d}: scoring_func {scoring!r} is not supported for {fam} (its routing is "
            f"'sigmoid' with topk_method 'noaux_tc')"
        )
    if method not in (None, "noaux_tc"):
        raise UnsupportedError(
            f"{d}: topk_method {method!r} is not supported for {fam} (supported: 'noaux_tc')"
        )
    return "sigmoid_grouped", True


def _moe_layers(fam: str, cfg: Mapping[str, Any], n_layers: int, d: Path) -> tuple[bool, ...]:
    freq = cfg.get("moe_layer_freq", 1)
    if freq not in (None, 1):
        raise UnsupportedError(f"{d}: moe_layer_freq {freq!r} is not supported (only 1)")
    types = cfg.get("mlp_layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != n_layers or any(
            t not in ("dense", "sparse") for t in types
        ):
            raise ModelFormatError(
                f"{d / 'config.json'}: mlp_layer_types must list 'dense' or 'sparse' for each "
                f"of the {n_layers} layers"
            )
        return tuple(t == "sparse" for t in types)
    lead = _int(cfg, "first_k_dense_replace", d, _DENSE_LEAD[fam])
    return tuple(i >= lead for i in range(n_layers))


def _indexer_types(
    fam: str, cfg: Mapping[str, Any], n_layers: int, d: Path
) -> tuple[IndexerType, ...]:
    """Per layer "full" or "shared", as transformers' GlmMoeDsaConfig derives them."""
    if fam == "deepseek_v32":
        return tuple("full" for _ in range(n_layers))
    types = cfg.get("indexer_types")
    if types is None:
        pattern = cfg.get("index_topk_pattern")
        if isinstance(pattern, str):
            try:
                types = [{"F": "full", "S": "shared"}[c] for c in pattern]
            except KeyError as exc:
                raise UnsupportedError(
                    f"{d}: index_topk_pattern {pattern!r} has an indexer kind {exc} colibri does "
                    f"not implement (F: full, S: shared)"
                ) from None
        elif pattern is not None:
            types = list(pattern)
        else:
            freq = max(_int(cfg, "index_topk_freq", d, 1), 1)
            offset = _int(cfg, "index_skip_topk_offset", d, 2)
            types = ["full" if max(i - offset + 1, 0) % freq == 0 else "shared"
                     for i in range(n_layers)]  # fmt: skip
    if not isinstance(types, list) or len(types) != n_layers:
        raise ModelFormatError(f"{d / 'config.json'}: indexer_types must have {n_layers} entries")
    for t in types:
        if t not in ("full", "shared"):
            raise UnsupportedError(
                f"{d}: indexer type {t!r} is not implemented (colibri runs 'full' and 'shared' "
                f"DSA indexer layers)"
            )
    if types and types[0] != "full":
        raise ModelFormatError(
            f"{d / 'config.json'}: indexer_types[0] is 'shared' but a shared layer reuses the "
            f"selection of an earlier full layer"
        )
    return tuple(types)


def yarn_mscale(scale: float, m: float) -> float:
    return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0


def mla_softmax_scale(qk_head_dim: int, scaling: Mapping[str, Any] | None) -> float:
    """transformers' ``yarn_apply_mscale``: qk^-0.5, times mscale(factor, mscale_all_dim)^2
    for a scaled RoPE that has ``mscale_all_dim``."""
    scale = qk_head_dim**-0.5
    if scaling and scaling.get("rope_type", "default") != "default":
        m = scaling.get("mscale_all_dim") or 0
        if m:
            ms = yarn_mscale(float(scaling["factor"]), float(m))
            scale = scale * ms * ms
    return float(scale)


def mtp_layer_count(cfg: Mapping[str, Any], n_layers: int, names: Iterable[str], d: Path) -> int:
    """MTP layers the checkpoint carries (layers n_layers.. with tensors), checked against
    ``num_nextn_predict_layers``."""
    present = {int(m.group(1)) for n in names if (m := _LAYER.match(n))}
    extra = sorted(i for i in present if i >= n_layers)
    if not extra:
        return 0
    declared = _int(cfg, "num_nextn_predict_layers", d, _int(cfg, "num_mtp_layers", d, 0))
    if extra != list(range(n_layers, n_layers + len(extra))) or len(extra) > declared:
        raise ModelFormatError(
            f"{d}: the checkpoint has tensors of layers {extra} beyond num_hidden_layers "
            f"{n_layers}, but config.json declares {declared} multi-token-prediction layer(s)"
        )
    return len(extra)


def family_config(
    fam: str, cfg: Mapping[str, Any], d: Path, names: set[str], base: dict[str, Any]
) -> ModelConfig:
    """The ModelConfig of a DeepSeek/GLM-family checkpoint. ``base`` holds what every
    family shares (vocab, hidden, layers, heads, eps, RoPE, ids), as hf_config built it."""
    n_layers, n_heads, hidden = base["n_layers"], base["n_heads"], base["hidden_size"]
    if cfg.get("hidden_act", "silu") != "silu":
        raise UnsupportedError(f"{d}: hidden_act {cfg.get('hidden_act')!r} is not supported")
    if cfg.get("mlp_bias"):
        raise UnsupportedError(f"{d}: mlp_bias is not supported")
    router, bias = _router(fam, cfg, d)
    n_exp = _int(cfg, "n_routed_experts", d, cfg.get("num_experts") or cfg.get("num_local_experts"))
    top_k = _int(cfg, "num_experts_per_tok", d)
    moe_ffn = _int(cfg, "moe_intermediate_size", d)
    n_shared = _int(cfg, "n_shared_experts", d, 0)
    n_group = _int(cfg, "n_group", d, 1, lo=1)
    topk_group = _int(cfg, "topk_group", d, 1, lo=1)
    if router == "softmax":
        n_group = topk_group = 1  # "greedy" ignores the groups
    moe_layers = _moe_layers(fam, cfg, n_layers, d)
    scaling = base["rope_scaling"]
    out: dict[str, Any] = dict(base)
    out.update(
        arch=fam,
        intermediate_size=_int(cfg, "intermediate_size", d) if not all(moe_layers) else 0,
        n_experts=n_exp,
        n_experts_per_tok=top_k,
        moe_intermediate_size=moe_ffn,
        norm_topk_prob=_bool(cfg, "norm_topk_prob", d, fam != "deepseek_v2"),
        shared_expert_intermediate_size=n_shared * moe_ffn,
        shared_expert_gated=False,
        moe_layers=moe_layers,
        router=router,
        router_bias=bias and any(n.endswith("mlp.gate.e_score_correction_bias") for n in names),
        routed_scaling_factor=_float(cfg, "routed_scaling_factor", d, _SCALING[fam]),
        n_group=n_group,
        topk_group=topk_group,
        n_mtp_layers=mtp_layer_count(cfg, n_layers, names, d),
    )
    if fam == "glm4_moe":
        head_dim = _int(cfg, "head_dim", d, hidden // n_heads, lo=1)
        rope_params = cfg.get("rope_parameters")
        rope_params = rope_params if isinstance(rope_params, dict) else {}
        prf = as_float(rope_params.get("partial_rotary_factor", cfg.get("partial_rotary_factor",
                       0.5)), "partial_rotary_factor", d / "config.json", lo=0.0, lo_open=True)
        if prf > 1:
            raise ModelFormatError(f"{d / 'config.json'}: partial_rotary_factor {prf} > 1")
        qk: QkNorm = "head" if _bool(cfg, "use_qk_norm", d, False) else "none"
        out.update(
            head_dim=head_dim,
            n_kv_heads=_int(cfg, "num_key_value_heads", d, n_heads, lo=1),
            rotary_dim=int(head_dim * prf),
            qk_norm=qk,
            attention_bias=_bool(cfg, "attention_bias", d, False),
        )
        return ModelConfig(**out)

    if _bool(cfg, "attention_bias", d, False):
        raise UnsupportedError(f"{d}: attention_bias on an MLA model is not supported")
    nope = _int(cfg, "qk_nope_head_dim", d)
    rope = _int(cfg, "qk_rope_head_dim", d)
    q_lora = cfg.get("q_lora_rank")
    interleaved = fam in ("deepseek_v2", "deepseek_v32", "glm_moe_dsa") or _bool(
        cfg, "rope_interleave", d, True
    )
    out.update(
        attention="mla",
        head_dim=nope + rope,
        n_kv_heads=n_heads,
        rotary_dim=rope,
        rope_interleaved=interleaved,
        attention_scale=mla_softmax_scale(nope + rope, scaling),
        q_lora_rank=_int(cfg, "q_lora_rank", d, 0),
        kv_lora_rank=_int(cfg, "kv_lora_rank", d),
        qk_nope_head_dim=nope,
        qk_rope_head_dim=rope,
        v_head_dim=_int(cfg, "v_head_dim", d),
        mla_norm_eps=MLA_NORM_EPS,
    )
    if fam in DSA_FAMILIES:
        if not q_lora:
            raise UnsupportedError(f"{d}: a DSA indexer without q-LoRA is not supported")
        out.update(
            index_n_heads=_int(cfg, "index_n_heads", d),
            index_head_dim=_int(cfg, "index_head_dim", d),
            index_topk=_int(cfg, "index_topk", d),
            indexer_types=_indexer_types(fam, cfg, n_layers, d),
            index_rope_interleaved=fam == "glm_moe_dsa",
        )
        if out["index_head_dim"] < rope:
            raise ModelFormatError(f"{d}: index_head_dim is smaller than qk_rope_head_dim")
    return ModelConfig(**out)


def split_kv_b(
    layer: str, dtype: str, shape: tuple[int, ...], ext: Extent, cfg: ModelConfig, itemsize: int,
    where: Path,
) -> tuple[tuple[str, tuple[int, int], tuple[Extent, ...], tuple[int, ...]],
           tuple[str, tuple[int, int], tuple[Extent, ...], tuple[int, ...]]]:  # fmt: skip
    """``kv_b_proj`` [heads * (nope + v), kv_lora] -> (name, shape, extents, first source
    row of each extent) of ``attn_k_b`` (each head's nope rows; the core transposes each
    head's block) and of ``attn_v_b`` (each head's v rows)."""
    nh, nope, v, r = cfg.n_heads, cfg.qk_nope_head_dim, cfg.v_head_dim, cfg.kv_lora_rank
    if tuple(shape) != (nh * (nope + v), r):
        raise ModelFormatError(
            f"{where}: kv_b_proj of layer {layer} has shape {tuple(shape)}, but the config "
            f"implies {(nh * (nope + v), r)}"
        )
    row = r * itemsize
    k_ext, v_ext, k_rows, v_rows = [], [], [], []
    for h in range(nh):
        base = h * (nope + v)
        k_ext.append(Extent(ext.file, ext.offset + base * row, nope * row))
        v_ext.append(Extent(ext.file, ext.offset + (base + nope) * row, v * row))
        k_rows.append(base)
        v_rows.append(base + nope)
    return (
        (f"blk.{layer}.attn_k_b", (nh * r, nope), tuple(k_ext), tuple(k_rows)),
        (f"blk.{layer}.attn_v_b", (nh * v, r), tuple(v_ext), tuple(v_rows)),
    )
