"""Kimi-Linear: a hybrid of Kimi Delta Attention linear-attention layers and multi-head
latent attention (MLA) layers without RoPE, with a DeepSeek-V3-style MoE FFN (sigmoid
scores plus a selection bias, group-limited top-k, renormalized and scaled weights, shared
experts added unweighted).

* ``kimi_linear``: Hugging Face ``kimi_linear`` / ``KimiLinearForCausalLM``; GGUF
  ``kimi-linear`` (kimi_linear_gguf.py reads llama.cpp's files).

* Layer schedule: config.json's ``layer_types`` ("linear_attention" / "full_attention"),
  else ``linear_attn_config``'s ``kda_layers`` / ``full_attn_layers`` (1-indexed, as the
  released checkpoints give them), else transformers' default (every 4th layer from
  layer 4 full). Any other kind, or a layer neither list names, is refused.
* Linear layers (csrc/model/linear_attn_kda.hpp): ``linear_attn_config``'s ``num_heads``,
  ``head_dim``, ``short_conv_kernel_size`` (or the flat ``linear_num_heads``,
  ``linear_head_dim``, ``linear_conv_kernel_dim`` transformers writes). ``q/k/v_proj`` and
  ``o_proj`` take the attention names; ``q/k/v_conv1d`` (C, 1, K) each are read as one
  ``kda_conv`` vector (q, k then v channels: the order transformers concatenates them
  in), ``A_log`` (1, 1, heads, 1) as a vector of heads, both through extents (no copy).
* MLA layers: DeepSeek's (families/deepseek.py) with ``mla_no_rope``: the rope part of q
  and k is used as projected (transformers' KimiLinearAttention rotates nothing). The
  q-LoRA and latent norms use eps 1e-6 (KimiLinearRMSNorm's default: transformers builds
  them without ``rms_norm_eps``), softmax scale qk^-0.5.
* MoE: ``block_sparse_moe.*`` in the checkpoint (experts ``w1/w3/w2``: gate, up, down;
  the router ``gate`` and ``gate.e_score_correction_bias``; the dense layers'
  ``gate/up/down_proj``), ``mlp.*`` as transformers names them accepted too. The config's
  ``num_experts``, ``num_experts_per_token``, ``num_shared_experts``,
  ``num_expert_group``, ``moe_renormalize`` (transformers' attribute names) or the
  DeepSeek names; ``first_k_dense_replace`` dense layers first (default 1) unless
  ``mlp_layer_types`` lists them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ...errors import ModelFormatError, UnsupportedError
from ..fields import as_int, bad
from ..manifest import Extent, ModelConfig, TensorInfo
from ..paths import shown
from .common import DECODER_NAMES, LAYER
from .deepseek import _KV_B, _MLA_NAMES, MLA_NORM_EPS
from .deepseek_moe import MOE_NAMES
from .kimi_linear_gguf import GGUF_ARCHS, gguf_config, gguf_name, gguf_tensors
from .spec import Family, HFInput, NameRule

ARCH = "kimi_linear"
_KINDS = {"linear_attention": True, "full_attention": False}
_MOE = LAYER + r"block_sparse_moe\."
_ATTN = LAYER + r"self_attn\."
_NAMES: list[NameRule] = [
    *DECODER_NAMES,
    *_MLA_NAMES,
    *MOE_NAMES,
    (re.compile(_MOE + r"experts\.(\d+)\.w1\.weight"), "blk.{0}.ffn_gate_exps.{1}"),
    (re.compile(_MOE + r"experts\.(\d+)\.w3\.weight"), "blk.{0}.ffn_up_exps.{1}"),
    (re.compile(_MOE + r"experts\.(\d+)\.w2\.weight"), "blk.{0}.ffn_down_exps.{1}"),
    (re.compile(_MOE + r"gate\.weight"), "blk.{0}.ffn_gate_inp"),
    (re.compile(_MOE + r"gate\.e_score_correction_bias"), "blk.{0}.exp_probs_b"),
    (re.compile(_MOE + r"shared_experts\.(gate|up|down)_proj\.weight"), "blk.{0}.ffn_{1}_shexp"),
    (re.compile(_MOE + r"(gate|up|down)_proj\.weight"), "blk.{0}.ffn_{1}"),
    (re.compile(_ATTN + r"(?:forget_gate\.)?f_([ab])_proj\.weight"), "blk.{0}.kda_f_{1}"),
    (re.compile(_ATTN + r"(?:forget_gate\.)?dt_bias"), "blk.{0}.kda_dt_bias"),
    (re.compile(_ATTN + r"g_([ab])_proj\.weight"), "blk.{0}.kda_g_{1}"),
    (re.compile(_ATTN + r"b_proj\.weight"), "blk.{0}.kda_b"),
    (re.compile(_ATTN + r"o_norm\.weight"), "blk.{0}.kda_norm"),
]
_CONV = re.compile(_ATTN + r"([qkv])_conv1d\.weight")
_A_LOG = re.compile(_ATTN + r"(?:forget_gate\.)?A_log")
_BIAS_NAMES = ("block_sparse_moe.gate.e_score_correction_bias", "mlp.gate.e_score_correction_bias")


def linear_layers(cfg: Mapping[str, Any], n_layers: int, where: object) -> tuple[bool, ...]:
    """Per layer True for a Kimi Delta Attention layer, as transformers' KimiLinearConfig
    reads ``layer_types`` / ``linear_attn_config`` (1-indexed lists)."""
    types = cfg.get("layer_types")
    lac = cfg.get("linear_attn_config") or {}
    lists = (("full_attn_layers", "full_attention"), ("kda_layers", "linear_attention"))
    if types is None and isinstance(lac, dict) and all(key in lac for key, _ in lists):
        types = [None] * n_layers
        for key, kind in lists:
            for raw in lac[key] or []:
                i = as_int(raw, f"linear_attn_config.{key}", where, lo=1, hi=n_layers)
                types[i - 1] = kind
    if types is None:
        return tuple(not (i and i % 4 == 0) for i in range(n_layers))
    if not isinstance(types, list) or len(types) != n_layers:
        raise bad(where, "layer_types", types, f"a list of {n_layers} layer kinds")
    for i, t in enumerate(types):
        if t not in _KINDS:
            raise UnsupportedError(
                f"{where}: layer {i} has kind {shown(t)}; colibri runs Kimi-Linear's "
                f"linear_attention (KDA) and full_attention (MLA) layers only"
            )
    return tuple(_KINDS[t] for t in types)


def _first(cfg: Mapping[str, Any], *keys: str) -> Any:
    return next((cfg[k] for k in keys if cfg.get(k) is not None), None)


def _hf_config(inp: HFInput) -> ModelConfig:
    cfg, f, d, where = inp.cfg, inp.fields, inp.d, inp.fields.where
    n_layers = inp.base["n_layers"]
    if cfg.get("hidden_act", "silu") != "silu":
        raise UnsupportedError(f"{d}: hidden_act {cfg.get('hidden_act')!r} is not supported")
    if f.bool("attention_bias", False):
        raise UnsupportedError(f"{d}: attention_bias on an MLA model is not supported")
    act = cfg.get("moe_router_activation_func", "sigmoid")
    if act != "sigmoid":
        raise UnsupportedError(f"{d}: moe_router_activation_func {act!r} is not supported "
                               f"(Kimi-Linear's router is 'sigmoid')")  # fmt: skip

    def count(*keys: str, default: int | None = None, lo: int = 0) -> int:
        raw = _first(cfg, *keys)
        if raw is None:
            if default is None:
                raise ModelFormatError(f"{where}: key {keys[0]!r} is missing")
            return default
        return as_int(raw, keys[0], where, lo=lo)

    lac = cfg.get("linear_attn_config")
    lac = lac if isinstance(lac, dict) else {}
    heads = as_int(lac.get("num_heads", cfg.get("linear_num_heads", 32)), "linear_num_heads",
                   where, lo=1)  # fmt: skip
    hd = as_int(lac.get("head_dim", cfg.get("linear_head_dim", 128)), "linear_head_dim", where,
                lo=1)  # fmt: skip
    kernel = as_int(lac.get("short_conv_kernel_size", cfg.get("linear_conv_kernel_dim", 4)),
                    "linear_conv_kernel_dim", where, lo=1)  # fmt: skip
    types = cfg.get("mlp_layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != n_layers or any(
            t not in ("dense", "sparse") for t in types
        ):
            raise bad(where, "mlp_layer_types", types,
                      f"'dense' or 'sparse' for each of {n_layers} layers")  # fmt: skip
        moe_layers = tuple(t == "sparse" for t in types)
    else:
        lead = count("first_k_dense_replace", default=1)
        moe_layers = tuple(i >= lead for i in range(n_layers))
    moe_ffn = count("moe_intermediate_size")
    nope = f.int("qk_nope_head_dim", lo=1)
    rope = f.int("qk_rope_head_dim", lo=1)
    n_group = count("num_expert_group", "n_group", default=1, lo=1)
    renorm = _first(cfg, "moe_renormalize", "norm_topk_prob")
    base = dict(inp.base)
    if not base.get("max_position_embeddings"):
        base["max_position_embeddings"] = count("model_max_length", default=0)
    if cfg.get("q_lora_rank"):
        q_lora = f.int("q_lora_rank", lo=1)
    else:
        q_lora = 0
    return ModelConfig(
        **{**base, "head_dim": nope + rope, "n_kv_heads": base["n_heads"]},
        arch=ARCH,
        intermediate_size=0 if all(moe_layers) else f.int("intermediate_size", lo=1),
        n_experts=count("num_experts", "n_routed_experts", "num_local_experts"),
        n_experts_per_tok=count("num_experts_per_token", "num_experts_per_tok"),
        moe_intermediate_size=moe_ffn,
        norm_topk_prob=True if renorm is None else bool(renorm),
        shared_expert_intermediate_size=moe_ffn * count(
            "num_shared_experts", "num_shared_experts", "n_shared_experts", default=1),
        moe_layers=moe_layers,
        shared_expert_gated=False,
        router="sigmoid_grouped",
        router_bias=any(n.endswith(b) for n in inp.names for b in _BIAS_NAMES),
        routed_scaling_factor=f.positive("routed_scaling_factor", 2.446),
        n_group=n_group,
        topk_group=count("topk_group", default=1, lo=1),
        attention="mla",
        rotary_dim=rope,
        attention_scale=float((nope + rope) ** -0.5),
        q_lora_rank=q_lora,
        kv_lora_rank=f.int("kv_lora_rank", lo=1),
        qk_nope_head_dim=nope,
        qk_rope_head_dim=rope,
        v_head_dim=f.int("v_head_dim", lo=1),
        mla_norm_eps=MLA_NORM_EPS,
        mla_no_rope=True,
        linear_layers=linear_layers(cfg, n_layers, where),
        linear_num_key_heads=heads,
        linear_num_value_heads=heads,
        linear_key_head_dim=hd,
        linear_value_head_dim=hd,
        linear_conv_kernel=kernel,
        linear_kda=True,
    )


def _split(
    found: Mapping[str, tuple[str, tuple[int, ...], Extent]],
    files: Sequence[Path],
    cfg: ModelConfig,
    d: Path,
) -> tuple[dict[str, TensorInfo], frozenset[str], Path | None]:
    """The per-projection short convolutions as one ``kda_conv`` vector and ``A_log`` as a
    vector (extents into the stored bytes, so nothing is copied)."""
    out: dict[str, TensorInfo] = {}
    used: set[str] = set()
    convs: dict[str, dict[str, tuple[str, tuple[int, ...], Extent]]] = {}
    for name, (dtype, shape, ext) in found.items():
        if m := _CONV.fullmatch(name):
            if len(shape) != 3 or shape[1] != 1:
                raise ModelFormatError(f"{files[ext.file]}: tensor {shown(name)} has shape "
                                       f"{tuple(shape)}, not (channels, 1, kernel)")  # fmt: skip
            convs.setdefault(m.group(1), {})[m.group(2)] = (dtype, shape, ext)
        elif m := _A_LOG.fullmatch(name):
            b = f"blk.{m.group(1)}."
            n = 1
            for s in shape:
                n *= s
            out[b + "kda_a_log"] = TensorInfo(b + "kda_a_log", dtype, (n,), (ext,))
        else:
            continue
        used.add(name)
    for layer, parts in convs.items():
        if set(parts) != {"q", "k", "v"} or len({p[0] for p in parts.values()}) != 1:
            raise ModelFormatError(f"{d}: layer {layer} needs q, k and v short convolutions "
                                   f"of one dtype")  # fmt: skip
        dtype = parts["q"][0]
        n = sum(p[1][0] * p[1][2] for p in parts.values())
        b = f"blk.{layer}."
        out[b + "kda_conv"] = TensorInfo(b + "kda_conv", dtype, (n,),
                                         tuple(parts[c][2] for c in "qkv"))  # fmt: skip
    return out, frozenset(used), None


FAMILY = Family(
    name="kimi_linear",
    archs=(ARCH,),
    attention=("mla",),
    routers=("sigmoid_grouped",),
    hf_model_types={"kimi_linear": ARCH},
    hf_arch_classes={"KimiLinearForCausalLM": ARCH},
    hf_names=_NAMES,
    hf_config=_hf_config,
    hf_kv_b=_KV_B,
    gguf_architectures=GGUF_ARCHS,
    gguf_config=gguf_config,
    gguf_name=gguf_name,
    gguf_tensors=gguf_tensors,
    hf_experts=_split,
)
