"""The DeepSeek family: multi-head latent attention (MLA), the DSA lightning indexer
(DeepSeek-V3.2, GLM-5) and the DeepSeek-V3 MoE block (deepseek_moe.py). docs/deepseek.md
says what each model computes.

==================  ===========================================  ======================
arch                Hugging Face model_type / architectures      GGUF architecture
==================  ===========================================  ======================
``deepseek_v3``     ``deepseek_v3``, ``kimi_k2`` /               ``deepseek2``, sigmoid
                    ``DeepseekV3ForCausalLM``                    gating
``deepseek_v2``     ``deepseek_v2`` / ``DeepseekV2ForCausalLM``  ``deepseek2``, softmax
                                                                 gating
``deepseek_v32``    ``deepseek_v32`` / ``DeepseekV32...``        ``deepseek32``
``glm4_moe_lite``   ``glm4_moe_lite`` / ``Glm4MoeLite...``       ``deepseek2`` (reported
                                                                 as deepseek_v3)
``glm_moe_dsa``     ``glm_moe_dsa`` / ``GlmMoeDsa...``           ``glm-dsa``
==================  ===========================================  ======================

What follows transformers 5.24 (the oracle), the reference code it ports, and llama.cpp's
loaders (``src/models/<arch>.cpp``) for GGUF files, so a file computes what llama.cpp
computes from it:

* MLA: ``head_dim`` of the ModelConfig is ``qk_nope + qk_rope`` (config.json's ``head_dim``
  is the rope width there and is ignored). RoPE covers ``qk_rope_head_dim``: interleaved
  pairs for DeepSeek-V2 (always), V3 and GLM-4.7-Flash (``rope_interleave``, default true),
  V3.2 and GLM-5 (always), and for every GGUF (llama.cpp's "NORM" RoPE). The q-LoRA and
  latent RMSNorms use eps 1e-6 (their modules' default, not ``rms_norm_eps``); from a GGUF
  they use the file's ``rms_norm_epsilon``, as llama.cpp does (the two differ for GLM's
  1e-5). Softmax scale ``qk^-0.5``, times ``mscale(factor, mscale_all_dim)^2`` for a
  scaled RoPE with ``mscale_all_dim``.
* ``kv_b_proj`` [heads * (nope + v), kv_lora] becomes ``attn_k_b`` (each head's
  [nope, kv_lora] block, transposed at load: ``TensorInfo.transpose_heads``) and
  ``attn_v_b`` (each head's [v, kv_lora] rows): decode then runs absorbed
  (units.split_kv_b).
* GGUF MLA keys: ``attention.kv_lora_rank``, ``attention.q_lora_rank`` (absent: a direct
  ``attn_q``, V2-Lite), ``attention.key_length_mla`` = nope + rope,
  ``attention.value_length_mla``, ``rope.dimension_count`` = rope; ``attention.key_length``
  / ``value_length`` are the absorbed widths (kv_lora + rope, kv_lora) and are checked.
  ``attn_k_b`` / ``attn_v_b`` are 3-D ``[heads, kv_lora, nope]`` / ``[heads, v, kv_lora]``
  and read as matrices. Files with only the unsplit ``attn_kv_b`` (written before
  llama.cpp split it) are refused with a request to reconvert.
* YaRN in GGUF: the converter stores ``0.1 * mscale_all_dim`` as
  ``rope.scaling.yarn_log_multiplier`` (llama.cpp divides it back); cos/sin are not
  rescaled (DeepSeek's mscale == mscale_all_dim).
* DSA: ``index_n_heads``, ``index_head_dim``, ``index_topk`` (GGUF:
  ``attention.indexer.head_count``, ``.key_length``, ``.top_k``); GLM-5's
  ``indexer_types`` (or the ``index_topk_pattern`` / ``index_topk_freq`` +
  ``index_skip_topk_offset`` schedule it is derived from; GGUF: ``.types``, true: full,
  and without it every layer full except that a file trained for a million-token context
  gets GLM-5.2's pattern, llama.cpp's rule); indexer RoPE interleaved for GLM-5,
  half-split for V3.2.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from ...errors import ModelFormatError, UnsupportedError
from ..fields import as_float
from ..manifest import IndexerType, ModelConfig
from .common import DECODER_NAMES, LAYER
from .deepseek_moe import (
    GGUF_MTP_KEY,
    MOE_NAMES,
    MTP_NAMES,
    ROUTERS,
    gguf_moe,
    gguf_name,
    hf_moe,
    hf_mtp_layers,
)
from .spec import Family, GGUFInput, HFInput, NameRule

_DSA = ("deepseek_v32", "glm_moe_dsa")
# transformers' defaults for keys a config.json may leave out, per arch.
_DENSE_LEAD = {"deepseek_v2": 0, "deepseek_v3": 3, "deepseek_v32": 3, "glm4_moe_lite": 1,
               "glm_moe_dsa": 3}  # fmt: skip
_SCALING = {"deepseek_v2": 1.0, "deepseek_v3": 2.5, "deepseek_v32": 2.5, "glm4_moe_lite": 1.8,
            "glm_moe_dsa": 2.5}  # fmt: skip
MLA_NORM_EPS = 1e-6  # DeepseekV3RMSNorm(q_lora_rank) / (kv_lora_rank): the module default

_MLA_NAMES: list[NameRule] = [
    (re.compile(LAYER + r"self_attn\.q_a_proj\.weight"), "blk.{0}.attn_q_a"),
    (re.compile(LAYER + r"self_attn\.q_a_layernorm\.weight"), "blk.{0}.attn_q_a_norm"),
    (re.compile(LAYER + r"self_attn\.q_b_proj\.weight"), "blk.{0}.attn_q_b"),
    (re.compile(LAYER + r"self_attn\.kv_a_proj_with_mqa\.weight"), "blk.{0}.attn_kv_a_mqa"),
    (re.compile(LAYER + r"self_attn\.kv_a_layernorm\.weight"), "blk.{0}.attn_kv_a_norm"),
    (re.compile(LAYER + r"self_attn\.indexer\.wq_b\.weight"), "blk.{0}.indexer.attn_q_b"),
    (re.compile(LAYER + r"self_attn\.indexer\.wk\.weight"), "blk.{0}.indexer.attn_k"),
    (re.compile(LAYER + r"self_attn\.indexer\.k_norm\.weight"), "blk.{0}.indexer.k_norm"),
    (re.compile(LAYER + r"self_attn\.indexer\.k_norm\.bias"), "blk.{0}.indexer.k_norm.bias"),
    (re.compile(LAYER + r"self_attn\.indexer\.weights_proj\.weight"), "blk.{0}.indexer.proj"),
]
_KV_B = re.compile(LAYER + r"self_attn\.kv_b_proj\.weight")


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


# ----------------------------------------------------------------------- config.json


def _hf_indexer_types(inp: HFInput, n_layers: int) -> tuple[IndexerType, ...]:
    """Per layer "full" or "shared", as transformers' GlmMoeDsaConfig derives them."""
    cfg, d, where = inp.cfg, inp.d, inp.fields.where
    if inp.arch == "deepseek_v32":
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
            freq = max(inp.fields.int("index_topk_freq", 1, lo=0), 1)
            offset = inp.fields.int("index_skip_topk_offset", 2, lo=0)
            types = ["full" if max(i - offset + 1, 0) % freq == 0 else "shared"
                     for i in range(n_layers)]  # fmt: skip
    if not isinstance(types, list) or len(types) != n_layers:
        raise ModelFormatError(f"{where}: indexer_types must have {n_layers} entries")
    for t in types:
        if t not in ("full", "shared"):
            raise UnsupportedError(
                f"{d}: indexer type {t!r} is not implemented (colibri runs 'full' and 'shared' "
                f"DSA indexer layers)"
            )
    if types and types[0] != "full":
        raise ModelFormatError(
            f"{where}: indexer_types[0] is 'shared' but a shared layer reuses the "
            f"selection of an earlier full layer"
        )
    return tuple(types)


def _hf_config(inp: HFInput) -> ModelConfig:
    arch, f, d = inp.arch, inp.fields, inp.d
    out = hf_moe(inp, dense_lead=_DENSE_LEAD[arch], scaling=_SCALING[arch])
    if f.bool("attention_bias", False):
        raise UnsupportedError(f"{d}: attention_bias on an MLA model is not supported")
    nope = f.int("qk_nope_head_dim", lo=0)
    rope = f.int("qk_rope_head_dim", lo=0)
    interleaved = arch in ("deepseek_v2", "deepseek_v32", "glm_moe_dsa") or f.bool(
        "rope_interleave", True
    )
    out.update(
        attention="mla",
        head_dim=nope + rope,
        n_kv_heads=out["n_heads"],
        rotary_dim=rope,
        rope_interleaved=interleaved,
        attention_scale=mla_softmax_scale(nope + rope, out["rope_scaling"]),
        q_lora_rank=f.int("q_lora_rank", 0, lo=0),
        kv_lora_rank=f.int("kv_lora_rank", lo=0),
        qk_nope_head_dim=nope,
        qk_rope_head_dim=rope,
        v_head_dim=f.int("v_head_dim", lo=0),
        mla_norm_eps=MLA_NORM_EPS,
    )
    if arch in _DSA:
        if not inp.cfg.get("q_lora_rank"):
            raise UnsupportedError(f"{d}: a DSA indexer without q-LoRA is not supported")
        out.update(
            index_n_heads=f.int("index_n_heads", lo=0),
            index_head_dim=f.int("index_head_dim", lo=0),
            index_topk=f.int("index_topk", lo=0),
            indexer_types=_hf_indexer_types(inp, out["n_layers"]),
            index_rope_interleaved=arch == "glm_moe_dsa",
        )
        if out["index_head_dim"] < rope:
            raise ModelFormatError(f"{d}: index_head_dim is smaller than qk_rope_head_dim")
    return ModelConfig(**out)


# ----------------------------------------------------------------------- GGUF


def _gguf_name(arch: str, name: str, shape: tuple[int, ...]) -> tuple[str, tuple[int, ...]]:
    """Names as deepseek_moe.gguf_name; MLA's 3-D attn_k_b / attn_v_b [heads, rows, cols]
    as the matrix [heads*rows, cols]."""
    cname, shape = gguf_name(arch, name, shape)
    if cname.endswith(("attn_k_b", "attn_v_b")) and len(shape) == 3:
        shape = (shape[0] * shape[1], shape[2])
    return cname, shape


def _glm52_types(n_layers: int) -> tuple[IndexerType, ...]:
    """GLM-5.2's indexer pattern (llama.cpp's GLM_5_2_DEFAULT_INDEXER_TYPES): 2 full
    layers, then one full layer every 4."""
    return tuple("full" if i < 2 or (i - 2) % 4 == 0 else "shared" for i in range(n_layers))


def _gguf_indexer_types(inp: GGUFInput, n_layers: int, ctx: int) -> tuple[IndexerType, ...]:
    a = inp.arch
    raw = inp.meta.md.get(f"{a}.attention.indexer.types")
    if a == "deepseek32" or (raw is None and ctx < 1048576):
        return tuple("full" for _ in range(n_layers))
    if raw is None:
        return _glm52_types(n_layers)
    if not isinstance(raw, list) or len(raw) < n_layers:
        raise ModelFormatError(f"{inp.where}: {a}.attention.indexer.types needs {n_layers} "
                               f"entries")  # fmt: skip
    types: tuple[IndexerType, ...] = tuple("full" if x else "shared" for x in raw[:n_layers])
    if types[0] != "full":
        raise ModelFormatError(f"{inp.where}: the first layer's indexer must be full")
    return types


def _gguf_config(inp: GGUFInput) -> ModelConfig:
    a, meta, where, tensors = inp.arch, inp.meta, inp.where, inp.tensors
    out = gguf_moe(inp)
    if any(n.endswith(".attn_kv_b") for n in tensors) and not any(
        n.endswith(".attn_k_b") for n in tensors
    ):
        raise UnsupportedError(
            f"{where}: this GGUF stores MLA's kv_b unsplit (attn_kv_b), as llama.cpp wrote "
            f"before splitting it into attn_k_b/attn_v_b; convert the model again with a "
            f"current convert_hf_to_gguf.py"
        )
    rot = meta.int(f"{a}.rope.dimension_count", lo=0)
    kv_lora = meta.int(f"{a}.attention.kv_lora_rank", lo=0)
    qk_dim = meta.int(f"{a}.attention.key_length_mla", lo=0)
    v_dim = meta.int(f"{a}.attention.value_length_mla", lo=0)
    if meta.int(f"{a}.attention.key_length", lo=0) != kv_lora + rot or meta.int(
        f"{a}.attention.value_length", lo=0
    ) != kv_lora:
        raise ModelFormatError(
            f"{where}: attention.key_length/value_length are not the absorbed MLA widths "
            f"kv_lora_rank + rope ({kv_lora + rot}) / kv_lora_rank ({kv_lora})"
        )
    scaling = out["rope_scaling"]
    if scaling and "mscale_all_dim" in scaling:
        scaling = dict(scaling)
        scaling["mscale_all_dim"] = as_float(scaling["mscale_all_dim"], "yarn_log_multiplier",
                                             where, lo=0.0) / 0.1  # see the docstring
        scaling.setdefault("mscale", scaling["mscale_all_dim"])
    arch = {"deepseek32": "deepseek_v32", "glm-dsa": "glm_moe_dsa"}.get(
        a, "deepseek_v3" if out["router"] == "sigmoid_grouped" else "deepseek_v2"
    )
    eps = out["rms_norm_eps"]
    out.update(
        arch=arch,
        attention="mla",
        n_kv_heads=out["n_heads"],
        head_dim=qk_dim,
        rotary_dim=rot,
        rope_interleaved=True,
        rope_scaling=scaling,
        attention_scale=mla_softmax_scale(qk_dim, scaling),
        q_lora_rank=meta.int(f"{a}.attention.q_lora_rank", 0, lo=0),
        kv_lora_rank=kv_lora,
        qk_nope_head_dim=qk_dim - rot,
        qk_rope_head_dim=rot,
        v_head_dim=v_dim,
        mla_norm_eps=as_float(eps, "rms_norm_eps", where, lo=0.0) if eps else MLA_NORM_EPS,
    )
    if arch in _DSA:
        out.update(
            index_n_heads=meta.int(f"{a}.attention.indexer.head_count", lo=0),
            index_head_dim=meta.int(f"{a}.attention.indexer.key_length", lo=0),
            index_topk=meta.int(f"{a}.attention.indexer.top_k", lo=0),
            indexer_types=_gguf_indexer_types(inp, out["n_layers"],
                                              out["max_position_embeddings"]),
            index_rope_interleaved=a == "glm-dsa",
        )  # fmt: skip
    return ModelConfig(**out)


FAMILY = Family(
    name="deepseek",
    archs=("deepseek_v2", "deepseek_v3", "deepseek_v32", "glm4_moe_lite", "glm_moe_dsa"),
    attention=("mla",),
    routers=ROUTERS,
    hf_model_types={
        "deepseek_v2": "deepseek_v2",
        "deepseek_v3": "deepseek_v3",
        "kimi_k2": "deepseek_v3",
        "deepseek_v32": "deepseek_v32",
        "glm4_moe_lite": "glm4_moe_lite",
        "glm_moe_dsa": "glm_moe_dsa",
    },
    hf_arch_classes={
        "DeepseekV2ForCausalLM": "deepseek_v2",
        "DeepseekV3ForCausalLM": "deepseek_v3",
        "DeepseekV32ForCausalLM": "deepseek_v32",
        "Glm4MoeLiteForCausalLM": "glm4_moe_lite",
        "GlmMoeDsaForCausalLM": "glm_moe_dsa",
    },
    hf_names=[*DECODER_NAMES, *_MLA_NAMES, *MOE_NAMES, *MTP_NAMES],
    hf_config=_hf_config,
    hf_mtp_layers=hf_mtp_layers,
    hf_kv_b=_KV_B,
    gguf_architectures=("deepseek2", "deepseek32", "glm-dsa"),
    gguf_config=_gguf_config,
    gguf_name=_gguf_name,
    gguf_mtp_key=GGUF_MTP_KEY,
)
