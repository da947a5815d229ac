"""The MoE block of the DeepSeek-V3 lineage, shared by the families built on it
(deepseek.py: DeepSeek-V2/V3/V3.2, Kimi-K2, GLM-4.7-Flash, GLM-5; glm.py: GLM-4.5):
routing rule, expert groups, shared experts, leading dense layers and multi-token-
prediction (MTP) layers, from config.json and from GGUF metadata, and their tensor names.

* Routing (config.json): ``scoring_func`` / ``topk_method`` as real checkpoints spell them.
  DeepSeek-V3, V3.2, Kimi-K2 and GLM: sigmoid + ``noaux_tc`` (the only rule their
  reference code has). DeepSeek-V2: softmax with ``greedy`` or ``group_limited_greedy``;
  ``norm_topk_prob`` renormalizes as the released modeling code does (transformers' port
  drops it; the released V2 configs all have it false). Anything else is refused, naming it.
* Routing (GGUF): ``expert_gating_func`` 2 (sigmoid) with ``exp_probs_b`` and the groups
  of ``expert_group_count`` / ``expert_group_used_count``; 1 (softmax): greedy top-k, or
  with groups DeepSeek-V2's group-limited greedy (a group scores its best expert; llama.cpp
  scores every grouped rule by its best two). Absent: softmax for deepseek2 (llama.cpp's
  default for old V2 files), sigmoid otherwise. ``expert_weights_scale`` and
  ``expert_weights_norm`` as named.
* Shared experts: ``n_shared_experts * moe_intermediate_size`` wide, added unweighted.
  Dense leading layers: ``mlp_layer_types`` when present, else ``first_k_dense_replace``
  (transformers' per-family default when absent); GGUF files show them by their tensors
  (``ffn_gate_inp`` present or not), and the expert and shared-expert widths too.
* MTP: layers ``num_hidden_layers ..`` present in the checkpoint (up to
  ``num_nextn_predict_layers``) are kept as MTP layers (``n_mtp_layers``); in GGUF files
  ``nextn_predict_layers`` of ``block_count``'s layers are MTP layers (llama.cpp's
  converter keeps them for glm4moe, deepseek32 and glm-dsa and drops them for deepseek2;
  a "trunk-only" file declares them without carrying them).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ...errors import ModelFormatError, UnsupportedError
from ..fields import ConfigFields, as_int
from ..manifest import RouterKind
from .common import LAYER
from .spec import GGUFInput, HFInput, NameRule, plain_gguf_name

ROUTERS: tuple[RouterKind, ...] = ("softmax", "sigmoid_grouped", "softmax_group_limited")

MOE_NAMES: list[NameRule] = [
    (re.compile(LAYER + r"mlp\.gate\.e_score_correction_bias"), "blk.{0}.exp_probs_b"),
    (re.compile(LAYER + r"mlp\.shared_experts\.(gate|up|down)_proj\.weight"),
     "blk.{0}.ffn_{1}_shexp"),
]  # fmt: skip
MTP_NAMES: list[NameRule] = [
    (re.compile(LAYER + r"eh_proj\.weight"), "blk.{0}.nextn.eh_proj"),
    (re.compile(LAYER + r"enorm\.weight"), "blk.{0}.nextn.enorm"),
    (re.compile(LAYER + r"hnorm\.weight"), "blk.{0}.nextn.hnorm"),
    (re.compile(LAYER + r"shared_head\.norm\.weight"), "blk.{0}.nextn.shared_head_norm"),
    (re.compile(LAYER + r"shared_head\.head\.weight"), "blk.{0}.nextn.shared_head_head"),
    (re.compile(LAYER + r"embed_tokens\.weight"), "blk.{0}.nextn.embed_tokens"),
]
_HF_LAYER = re.compile(r"model\.layers\.(\d{1,9})\.")
_BIAS = "mlp.gate.e_score_correction_bias"  # the selection bias, in HF names
GGUF_MTP_KEY = "nextn_predict_layers"

_GGUF_RENAMES = [
    (re.compile(r"^(blk\.\d+)\.exp_probs_b\.bias$"), r"\1.exp_probs_b"),
    (re.compile(r"^(blk\.\d+)\.indexer\.k_norm\.bias$"), r"\1.indexer.k_norm.bias"),
]


def gguf_name(arch: str, name: str, shape: tuple[int, ...]) -> tuple[str, tuple[int, ...]]:
    """llama.cpp's names of this lineage -> canonical (``.weight`` dropped; the selection
    bias is ``exp_probs_b.bias`` there)."""
    for pat, repl in _GGUF_RENAMES:
        if pat.match(name):
            return pat.sub(repl, name), shape
    return plain_gguf_name(arch, name, shape)


# ----------------------------------------------------------------------- config.json


def _hf_router(arch: str, cfg: Mapping[str, Any], d: Path) -> tuple[RouterKind, bool]:
    """(router kind, uses the selection bias) from scoring_func / topk_method."""
    scoring = cfg.get("scoring_func")
    method = cfg.get("topk_method")
    if arch == "deepseek_v2":
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
            f"{d}: scoring_func {scoring!r} is not supported for {arch} (its routing is "
            f"'sigmoid' with topk_method 'noaux_tc')"
        )
    if method not in (None, "noaux_tc"):
        raise UnsupportedError(
            f"{d}: topk_method {method!r} is not supported for {arch} (supported: 'noaux_tc')"
        )
    return "sigmoid_grouped", True


def _hf_moe_layers(f: ConfigFields, n_layers: int, dense_lead: int, d: Path) -> tuple[bool, ...]:
    freq = f.cfg.get("moe_layer_freq", 1)
    if freq not in (None, 1):
        raise UnsupportedError(f"{d}: moe_layer_freq {freq!r} is not supported (only 1)")
    types = f.cfg.get("mlp_layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != n_layers or any(
            t not in ("dense", "sparse") for t in types
        ):
            raise ModelFormatError(
                f"{f.where}: mlp_layer_types must list 'dense' or 'sparse' for each of the "
                f"{n_layers} layers"
            )
        return tuple(t == "sparse" for t in types)
    lead = f.int("first_k_dense_replace", dense_lead, lo=0)
    return tuple(i >= lead for i in range(n_layers))


def hf_mtp_layers(cfg: Mapping[str, Any], n_layers: int, names: Iterable[str], d: Path) -> int:
    """MTP layers the checkpoint carries (layers n_layers.. with tensors), checked against
    ``num_nextn_predict_layers``."""
    present = {int(m.group(1)) for n in names if (m := _HF_LAYER.match(n))}
    extra = sorted(i for i in present if i >= n_layers)
    if not extra:
        return 0
    f = ConfigFields(cfg, d / "config.json")
    declared = f.int("num_nextn_predict_layers", f.int("num_mtp_layers", 0, lo=0), lo=0)
    if extra != list(range(n_layers, n_layers + len(extra))) or len(extra) > declared:
        raise ModelFormatError(
            f"{d}: the checkpoint has tensors of layers {extra} beyond num_hidden_layers "
            f"{n_layers}, but config.json declares {declared} multi-token-prediction layer(s)"
        )
    return len(extra)


def hf_moe(inp: HFInput, *, dense_lead: int, scaling: float) -> dict[str, Any]:
    """``inp.base`` plus the MoE block's ModelConfig fields from config.json (the
    family's transformers defaults: ``dense_lead`` for first_k_dense_replace, ``scaling``
    for routed_scaling_factor), after refusing what the block does not implement."""
    cfg, d, f, arch = inp.cfg, inp.d, inp.fields, inp.arch
    if cfg.get("hidden_act", "silu") != "silu":
        raise UnsupportedError(f"{d}: hidden_act {cfg.get('hidden_act')!r} is not supported")
    if cfg.get("mlp_bias"):
        raise UnsupportedError(f"{d}: mlp_bias is not supported")
    router, bias = _hf_router(arch, cfg, d)
    raw = cfg.get("n_routed_experts")
    if raw is None:
        raw = cfg.get("num_experts") or cfg.get("num_local_experts")
    if raw is None:
        raise ModelFormatError(f"{f.where}: key 'n_routed_experts' is missing")
    n_exp = as_int(raw, "n_routed_experts", f.where, lo=0, floats=True)
    top_k = f.int("num_experts_per_tok", lo=0)
    moe_ffn = f.int("moe_intermediate_size", lo=0)
    n_shared = f.int("n_shared_experts", 0, lo=0)
    n_group = f.int("n_group", 1, lo=1)
    topk_group = f.int("topk_group", 1, lo=1)
    if router == "softmax":
        n_group = topk_group = 1  # "greedy" ignores the groups
    n_layers = inp.base["n_layers"]
    moe_layers = _hf_moe_layers(f, n_layers, dense_lead, d)
    out = dict(inp.base)
    out.update(
        arch=arch,
        intermediate_size=f.int("intermediate_size", lo=0) if not all(moe_layers) else 0,
        n_experts=n_exp,
        n_experts_per_tok=top_k,
        moe_intermediate_size=moe_ffn,
        norm_topk_prob=f.bool("norm_topk_prob", arch != "deepseek_v2"),
        shared_expert_intermediate_size=n_shared * moe_ffn,
        shared_expert_gated=False,
        moe_layers=moe_layers,
        router=router,
        router_bias=bias and any(n.endswith(_BIAS) for n in inp.names),
        routed_scaling_factor=f.positive("routed_scaling_factor", scaling),
        n_group=n_group,
        topk_group=topk_group,
        n_mtp_layers=hf_mtp_layers(cfg, n_layers, inp.names, d),
    )
    return out


# ----------------------------------------------------------------------- GGUF


def _gguf_router(inp: GGUFInput) -> RouterKind:
    a, meta = inp.arch, inp.meta
    gating = meta.int(f"{a}.expert_gating_func", 1 if a == "deepseek2" else 2, lo=0)
    if gating == 2:
        return "sigmoid_grouped"
    if gating == 1:
        groups = meta.int(f"{a}.expert_group_count", 1, lo=1)
        used = meta.int(f"{a}.expert_group_used_count", groups, lo=1)
        return "softmax_group_limited" if 1 < groups and used < groups else "softmax"
    raise UnsupportedError(
        f"{inp.where}: expert_gating_func {gating} is not supported (1: softmax, 2: sigmoid)"
    )


def gguf_moe(inp: GGUFInput) -> dict[str, Any]:
    """``inp.base`` plus the MoE block's ModelConfig fields from GGUF metadata and the
    tensors present, with n_layers the trunk (block_count less the MTP layers)."""
    a, meta, tensors, where = inp.arch, inp.meta, inp.tensors, inp.where
    declared = meta.int(f"{a}.{GGUF_MTP_KEY}", 0, lo=0)
    n_layers = inp.base["n_layers"] - declared  # block_count counts the MTP layers
    # A "trunk-only" file declares them but carries none (llama.cpp accepts it too).
    n_mtp = declared if f"blk.{n_layers}.nextn.eh_proj" in tensors else 0
    if n_layers <= 0:
        raise ModelFormatError(f"{where}: {a}.block_count leaves no trunk layers")
    moe_layers = tuple(f"blk.{i}.ffn_gate_inp" in tensors for i in range(n_layers))
    first_moe = next((i for i, m in enumerate(moe_layers) if m), None)
    if first_moe is None:
        raise ModelFormatError(f"{where}: a {a} model without router tensors (ffn_gate_inp)")
    first_dense = next((i for i, m in enumerate(moe_layers) if not m), None)
    moe_ffn = tensors[f"blk.{first_moe}.ffn_gate_exps.0"].shape[0]
    shexp = tensors.get(f"blk.{first_moe}.ffn_gate_shexp")
    dense_ffn = tensors[f"blk.{first_dense}.ffn_gate"].shape[0] if first_dense is not None else 0
    router = _gguf_router(inp)
    groups = meta.int(f"{a}.expert_group_count", 1, lo=1)
    used = meta.int(f"{a}.expert_group_used_count", groups, lo=1)
    if router == "softmax":
        groups = used = 1
    out = dict(inp.base)
    out.update(
        n_layers=n_layers,
        intermediate_size=dense_ffn,
        n_experts=meta.int(f"{a}.expert_count", lo=0),
        n_experts_per_tok=meta.int(f"{a}.expert_used_count", lo=0),
        moe_intermediate_size=moe_ffn,
        norm_topk_prob=meta.bool(f"{a}.expert_weights_norm", False),
        shared_expert_intermediate_size=shexp.shape[0] if shexp is not None else 0,
        shared_expert_gated=False,
        moe_layers=moe_layers,
        router=router,
        router_bias=f"blk.{first_moe}.exp_probs_b" in tensors,
        routed_scaling_factor=inp.meta.positive(f"{a}.expert_weights_scale", 1.0),
        n_group=groups,
        topk_group=used,
        n_mtp_layers=n_mtp,
    )
    return out
